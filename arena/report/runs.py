"""Reading finished runs for reports, strictly read-only.

``RunDir.load_episodes`` repairs a torn file (it is the resume path); a report must never change a
run it reads, so episode lines are parsed here without touching the file.

A run's violations are on its signed record (``violations.jsonl``, one chain with the episodes):
where results.json or state.json list other violations than the record, the run is reported
invalid, with a violation that says so (:func:`violation_problems`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arena.core.contract.results import PRIMARY_VARIANT, Record, Results, ResultsError, signed_after
from arena.core.contract.results import validate as validate_results
from arena.core.contract.types import EpisodeResult
from arena.core.storage import integrity
from arena.core.storage.ledger import STATE, Ledger, RunState
from arena.core.storage.metrics import read_metrics
from arena.core.storage.rundir import (
    CONFIG,
    EPISODES,
    RESULTS,
    TRAJECTORIES,
    VIOLATIONS,
    RunDirError,
    read_json,
    read_jsonl,
    record_disagreement,
    unfinished_message,
)
from arena.report.verification import VerifyError, read_verification

EVALUATE = "evaluate"
LEARN = "learn"


class ReportError(ValueError):
    """Runs that cannot be reported as asked; the message names the runs and the fix."""


@dataclass
class Run:
    """One finished run: its results plus, where recorded, its episodes and state."""

    path: Path
    results: Results
    episodes: list[EpisodeResult] | None = None  # None: no episodes.jsonl beside results.json
    state: RunState | None = None
    #: The run's logged curves (``metrics.jsonl``: ``run.log_metrics``), merged per step.
    metrics: list[dict[str, Any]] = field(default_factory=list)
    #: episodes.jsonl's lines are chained and end where results.json says (False: a run made
    #: before Arena chained its records, shown as such on a board).
    chained: bool = True
    #: The run's verification.json (``arena verify``) where it has one of this very record.
    verification: dict[str, Any] | None = None
    #: Where results.json or state.json disagree with the violations on record: each is also
    #: in ``results.violations`` (and the run invalid), as the harness would have added it.
    record_problems: list[str] = field(default_factory=list)

    @property
    def isolation(self) -> str:
        """How the method ran (``provenance.isolation.mode``): ``process`` or ``in_process``;
        ``unknown`` for a run from before Arena recorded it (it ran in Arena's process)."""
        mode = (self.results.provenance.isolation or {}).get("mode")
        return str(mode) if mode in ("process", "in_process") else "unknown"

    @property
    def verification_status(self) -> str:
        """``verified`` or ``unverified`` as ``arena verify`` last found (a run it could not
        verify, or never checked, is ``not verified``)."""
        status = (self.verification or {}).get("status")
        return str(status) if status in ("verified", "unverified") else "not verified"

    @property
    def label(self) -> str:
        return self.path.name

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.results.provenance.config)

    @property
    def method(self) -> str:
        return self.results.method

    @property
    def env(self) -> str:
        return self.results.env

    @property
    def preset(self) -> str | None:
        preset = self.config.get("method", {}).get("preset")
        return None if preset is None else str(preset)

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.results.provenance.model)

    @property
    def model_id(self) -> str:
        return str(self.model.get("id", "unknown"))

    @property
    def called_model(self) -> bool:
        """Whether any prompt reached the model (the random policy sends none)."""
        cost = self.results.cost
        return bool(cost.learn.tokens_in or cost.evaluate.tokens_in)

    @property
    def model_dtype(self) -> str | None:
        """The dtype the model actually ran in (``llm.dtype=auto`` resolves per machine); None
        where the run records none or never called the model."""
        dtype = self.model.get("dtype")
        return str(dtype) if self.called_model and dtype is not None else None

    @property
    def seeds(self) -> list[int]:
        return list(self.results.seeds)

    @property
    def eval_splits(self) -> list[str]:
        return list(self.results.splits)

    def evaluated(self, variant: str = PRIMARY_VARIANT) -> list[EpisodeResult]:
        """Test episodes of one variant, as results.json counts them (evaluated splits only)."""
        if self.episodes is None:
            raise ReportError(
                f"{self.path} has no {EPISODES}: per-task data is needed here. Keep episodes.jsonl "
                "beside results.json (the leaderboard stores both)."
            )
        splits = set(self.eval_splits)
        return [r for r in self.episodes
                if r.phase == EVALUATE and r.split in splits and r.variant == variant]

    def learn_episodes(self) -> list[EpisodeResult]:
        return [r for r in self.episodes or [] if r.phase == LEARN]

    def variants(self) -> list[str]:
        """Variants evaluated on the test splits besides the primary (e.g. ``without_skill``)."""
        names: set[str] = set()
        for summary in self.results.splits.values():
            names.update(summary.variants or {})
        return sorted(names)


def read_episode_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file; a torn last line is ignored, the file left as is."""
    return read_jsonl(path, repair=False)


def load_run(path: Path | str, verification: bool = True) -> Run:
    """A run directory (or its results.json). Refuses unfinished runs, naming the fix.
    ``verification``: read its verification.json too (``arena verify`` itself does not)."""
    path = Path(path)
    if path.is_file() and path.name == RESULTS:
        path = path.parent
    results_file = path / RESULTS
    if not results_file.is_file():
        if (path / CONFIG).exists():
            raise ReportError(unfinished_message(path))
        raise ReportError(f"{path} has no {RESULTS}: pass a folder that `arena run` wrote "
                          "(it holds results.json).")
    try:
        results = validate_results(read_json(results_file, "its results"), str(results_file))
        lines = read_episode_lines(path / EPISODES) if (path / EPISODES).is_file() else None
        violation_lines = read_episode_lines(path / VIOLATIONS) if (path / VIOLATIONS).is_file() else None
        state = Ledger(path).read() if Ledger(path).exists() else None
        metrics = read_metrics(path)
    except (RunDirError, ResultsError) as exc:
        raise ReportError(str(exc)) from exc
    episodes = None
    chained = False
    on_record = None  # the violations on record; None where the run keeps no record of them
    if lines is not None:
        chained, on_record = check_record(path, lines, results.record, violation_lines)
        episodes = [EpisodeResult.from_dict(r) for r in lines]
    elif violation_lines is not None:  # no episodes to chain them with: their messages only
        on_record = [str(v.get(integrity.VIOLATION)) for v in violation_lines]
    problems = violation_problems(on_record if violation_lines is not None else None,
                                  results, state)
    if problems:  # as the harness would have: the run is invalid, and says why
        results = results.with_violations(problems)

    try:
        verified = read_verification(path, None if results.record is None else results.record.head) \
            if verification else None
    except VerifyError as exc:
        raise ReportError(str(exc)) from exc
    return Run(path=path, results=results, episodes=episodes, state=state, metrics=metrics,
               chained=chained, verification=verified, record_problems=problems)


def check_record(path: Path, lines: list[dict[str, Any]], record: Record | None,
                 violations: list[dict[str, Any]] | None = None) -> tuple[bool, list[str]]:
    """Check the chain of episodes.jsonl and violations.jsonl (and the trajectories and MACs
    where they can be checked) against results.json's ``record``: (chained, the violations on
    record); chained is False for a run from before chaining. A broken chain, or one that does
    not end where results.json says, is a ReportError; violation lines only past that end (one
    recorded as results.json was written) are returned, for :func:`violation_problems` to name."""
    episodes_file = path / EPISODES
    trajectories_file = path / TRAJECTORIES
    trajectories = trajectories_file.read_bytes().splitlines() if trajectories_file.is_file() else None
    try:
        report = integrity.verify(lines, episodes_file, trajectories=trajectories,
                                  key=integrity.record_key(create=False),
                                  expected_key_id=None if record is None else record.key_id,
                                  breaks=set() if record is None else set(record.breaks),
                                  violations=violations, violations_path=path / VIOLATIONS,
                                  macs_after=None if record is None else signed_after(record.moves))
    except integrity.RecordError as exc:
        raise ReportError(str(exc)) from exc
    if record is None:
        if report.chained:
            raise ReportError(f"{path / RESULTS} has no record of its episodes' chain while "
                              f"{EPISODES} is chained: results.json was replaced.")
        return False, report.violations
    head = record.head
    ends_there = report.head == head or (
        head in report.hashes and not any(report.is_episode[report.hashes.index(head) + 1:]))
    if not report.chained or not ends_there or report.lines != record.episodes:
        raise ReportError(f"{episodes_file} does not end where {path / RESULTS} says it does "
                          f"({record.episodes} lines): lines were added, dropped or the file "
                          "was replaced. The run cannot be trusted.")
    return True, report.violations


def violation_problems(on_record: list[str] | None, results: Results,
                       state: RunState | None) -> list[str]:
    """What makes a run invalid beyond what results.json says: results.json or state.json
    listing other violations than the record (``on_record``; None for a run that keeps no
    record of violations, made before Arena kept one or with none: then state.json's list is
    the truth, and results.json must hold every entry of it)."""
    listed = list(results.violations)
    in_state = None if state is None else state.violations
    if on_record is None:
        missing = [v for v in in_state or [] if v not in listed]
        return [f"state.json lists {len(missing)} violations results.json does not (e.g. "
                f"{missing[0][:160]!r}): results.json was edited."] if missing else []
    problems = [record_disagreement(on_record, listed, "results.json")]
    if in_state is not None:
        problems.append(record_disagreement(on_record, in_state, STATE))
    shown = [v for v in on_record if v not in listed]  # the record's own, shown with the rest
    return [p for p in problems if p] + (shown if any(problems) else [])


def load_runs(paths: list[Path | str]) -> list[Run]:
    runs = [load_run(p) for p in paths]
    seen: dict[Path, Path] = {}
    for run in runs:
        resolved = run.path.resolve()
        if resolved in seen:
            raise ReportError(f"{run.path} is given twice; each run counts once.")
        seen[resolved] = run.path
    return runs
