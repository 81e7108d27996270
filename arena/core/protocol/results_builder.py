"""Assembling a run's :class:`~arena.core.contract.results.Results` from typed inputs.

The numbers come from what the run keeps: its ledger (:class:`~arena.core.storage.ledger.RunState`) and
its episode records. What only the running session knows (its violations, the store's size, what
the method exports, the method's sizes, the protocol it was configured with, the provenance of the
machine and model) is handed in as :class:`SessionFacts`. No session is imported here, so the
results of a run are one function of these inputs, testable without playing an episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arena.core.contract.env import TRAIN_SPLIT
from arena.core.contract.results import (
    PRIMARY_VARIANT,
    SCHEMA_VERSION,
    Cost,
    Learning,
    PhaseCost,
    ProtocolFields,
    Provenance,
    Record,
    Results,
    SolverFields,
    StateFields,
    Summary,
    Track,
)
from arena.core.contract.types import EpisodeResult
from arena.core.execution.phase import EVALUATE, LEARN
from arena.core.storage import stats
from arena.core.storage.ledger import RunState


@dataclass(frozen=True)
class SessionFacts:
    """What the session knows of a run beyond its ledger and records, read when it ends."""

    method: str
    env: str
    track: Track
    seeds: list[int]
    #: The protocol as configured: ``experience`` is left to the builder (it adds the poison).
    protocol: ProtocolFields
    solver: SolverFields
    learn_split: str
    budget: dict[str, int | None]
    #: The budget's meter, for a run whose ledger has no ``learn_used`` (it never ended learning).
    budget_used: dict[str, int]
    #: ``eval.experience`` of an experiment's arm (``ExperienceSettings.describe()``), or None:
    #: the protocol's, and ``protocol.experience`` stays absent.
    experience: dict[str, Any] | None
    violations: list[str]
    store_size: dict[str, int]
    method_sizes: dict[str, Any]
    exported: dict[str, int] | None
    #: ``provenance.collect()`` as the run's start recorded it (the ledger's).
    collected: dict[str, Any]
    isolation: dict[str, Any]
    env_version: str
    split_hashes: dict[str, str]
    model: dict[str, Any]
    embedder: dict[str, Any]
    config: dict[str, Any]
    record_head: str
    record_key_id: str | None
    finished: str


def split_summaries(records: list[EpisodeResult], splits: list[str]) -> dict[str, Summary]:
    """Each evaluated split's summary of its primary episodes, with its other variants' (absent
    where the split has none)."""
    evaluated = [r for r in records if r.phase == EVALUATE and r.split in splits]
    summaries: dict[str, Summary] = {}
    for split in splits:
        in_split = [r for r in evaluated if r.split == split]
        summary = stats.summarise_split([r for r in in_split if r.variant == PRIMARY_VARIANT])
        variants = sorted({r.variant for r in in_split} - {PRIMARY_VARIANT})
        if variants:
            summary.variants = {v: stats.summarise_split([r for r in in_split if r.variant == v])
                                for v in variants}
        summaries[split] = summary
    return summaries


def _protocol(facts: SessionFacts, state: RunState) -> ProtocolFields:
    """The configured protocol, with an experiment arm's ``experience`` (and the poison it added)."""
    if facts.experience is None:
        return facts.protocol
    poison = {} if state.poisoned is None else {"poisoned": state.poisoned}
    return facts.protocol.model_copy(update={"experience": {**facts.experience, **poison}})


def _learning(facts: SessionFacts, state: RunState) -> Learning:
    used = state.splits_used_for_learning
    continued = {"continued_from": state.continued_from} if state.continued_from else {}
    # Validated from a mapping: the budget's names are checked against the schema's at run time.
    return Learning.model_validate({
        "split": facts.learn_split, "splits_used": used,
        "used_valid_split": any(s != TRAIN_SPLIT for s in used), "budget": dict(facts.budget),
        "used": dict(state.learn_used if state.learn_used is not None else facts.budget_used),
        **continued})


def _phase_cost(records: list[EpisodeResult], state: RunState, phase: str) -> PhaseCost:
    return stats.phase_cost([r for r in records if r.phase == phase], state.cost(phase))


def _provenance(facts: SessionFacts, state: RunState) -> Provenance:
    return Provenance(**{
        **facts.collected,
        "isolation": facts.isolation, "env_version": facts.env_version,
        "split_hashes": facts.split_hashes, "model": facts.model,
        "resumed_by": list(state.resumed_by), "phases": dict(state.phase_sessions),
        "embedder": facts.embedder, "config": facts.config})


def build_results(state: RunState, records: list[EpisodeResult], facts: SessionFacts) -> Results:
    """The run's results: its splits and cost from ``records`` and ``state``, the rest from
    ``facts``. Every key the harness writes is set, so :meth:`Results.to_json` writes it."""
    return Results(
        schema_version=SCHEMA_VERSION, method=facts.method, env=facts.env,
        track=facts.track,
        valid=not facts.violations, violations=list(facts.violations), seeds=list(facts.seeds),
        limited=facts.protocol.limit is not None,
        protocol=_protocol(facts, state), solver=facts.solver,
        splits=split_summaries(records, facts.protocol.splits),
        learn=_learning(facts, state),
        cost=Cost(learn=_phase_cost(records, state, LEARN), evaluate=_phase_cost(records, state, EVALUATE)),
        state=StateFields(digest_before_eval=state.digest_before_eval,
                          digest_after_eval=state.digest_after_eval,
                          memory_items=int(facts.store_size.get("items", 0)),
                          memory_bytes=int(facts.store_size.get("bytes", 0)),
                          method=facts.method_sizes),
        provenance=_provenance(facts, state),
        # The chain of episodes.jsonl as this run left it (arena.core.storage.integrity): reports refuse
        # a file whose chain does not end here. ``damaged_lines``: lines --repair moved aside
        # (their episodes were played again); ``breaks``: the lines after those holes; ``moves``:
        # where the run went on under another machine's key (--move-here).
        record=Record(episodes=len(records), head=facts.record_head, key_id=facts.record_key_id,
                      damaged_lines=list(state.record_damaged), breaks=list(state.record_breaks),
                      moves=list(state.record_moves)),
        experiment=None if state.experiment is None else state.experiment.model_dump(exclude_none=True),
        exported=facts.exported, started=state.started, finished=facts.finished,
    )
