"""The run's ledger: the one owner of ``state.json``, the harness's state of a run.

The episode records (``episodes.jsonl``, signed and chained) say what was played; the ledger
says where the protocol stands: the run's start, each resume, the end of learning and the state
evaluation must keep, what changed the learned experience before evaluation (poison, a new
model), the violations listed, the end of evaluation. Each of those events is one method here and
one atomic write, so a run killed anywhere has the state before the event or after it, never
half of one. The state is typed (:class:`RunState`, extra keys refused); a file written by an
earlier Arena is migrated when read.

A phase's cost travels with its records (each episode line carries the phase's cost so far): the
ledger holds it only at the phase's end, and for a step a killed session could not record
(:meth:`Ledger.undo_step`), so nothing rewrites the state after every episode.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from arena.core.contract.results import RecordMove
from arena.core.contract.types import EpisodeResult
from arena.core.storage.files import RunDirError, read_json, write_json_atomic

STATE = "state.json"
#: 1: Arena 0.2 until the ledger (no ``version`` key; each phase cost kept its session's base).
VERSION = 2
PHASES = ("learn", "evaluate")
COST_KEYS = ("llm_calls", "tokens_in", "tokens_out", "wall_s")


class LedgerError(RunDirError):
    """A state.json that cannot be read as a run's state; the message names the file and the fix."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PhaseCost(_Closed):
    """What a phase has cost so far: model calls, tokens and wall-clock seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    llm_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    wall_s: float = 0.0

    @classmethod
    def of(cls, mapping: Any) -> PhaseCost:
        """From a record's ``phase_cost`` (or any mapping of the four counts; missing = 0)."""
        mapping = mapping or {}
        return cls(**{key: mapping[key] for key in COST_KEYS if key in mapping})

    def plus(self, other: PhaseCost) -> PhaseCost:
        return PhaseCost(**{key: getattr(self, key) + getattr(other, key) for key in COST_KEYS})

    def latest(self, other: PhaseCost) -> PhaseCost:
        """The further of two readings of one growing cost, count by count (a record written
        after the ledger's last reading is ahead of it)."""
        return PhaseCost(**{key: max(getattr(self, key), getattr(other, key)) for key in COST_KEYS})

    def on_record(self) -> dict[str, float]:
        """As an episode's record carries it (``EpisodeResult.phase_cost``)."""
        return {**self.counts(), "wall_s": round(self.wall_s, 3)}

    def counts(self) -> dict[str, int]:
        """The three counts as integers (a record's ``phase_cost``, the token budget's meter)."""
        return {"llm_calls": self.llm_calls, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out}


class ModelChange(_Closed):
    """A learned state evaluated with another model than it learned with (``arena experiment
    transfer``): the source model's weights and the method's files, checked once on the first
    resume (``rebased``), after which the new model's digest is the reference."""

    from_weights_sha256: str
    settings: dict[str, Any]
    rebased: bool = False
    method_files_sha256: str | None = None
    digest_learned: str | None = None


class ExperimentMark(_Closed):
    """The arm of an experiment a run is (``arena experiment``)."""

    name: str
    arm: str
    source_run: str
    settings: dict[str, Any]
    learns: str | None = None


class RunState(_Closed):
    """The harness's state of one run (state.json), versioned."""

    version: int = VERSION
    #: What ``--resume`` checks: the config as written and the record's signing key.
    config_sha256: str | None = None
    record_key_id: str | None = None
    started: str | None = None
    #: ``arena.core.host.provenance.collect()`` at the start, and where the run was made from.
    provenance: dict[str, Any] = {}
    #: Versions that resumed the run after the one that started it (--allow-version-change).
    resumed_by: list[dict[str, Any]] = []
    #: Each phase's sessions: commit, CPU and instruction set (GPU).
    phase_sessions: dict[str, list[dict[str, Any]]] = {}
    continued_from: dict[str, Any] | None = None
    #: Optimizer steps charged to the learning budget (the other counters come from the records).
    gradient_steps: int = 0
    cost_learn: PhaseCost = PhaseCost()
    cost_evaluate: PhaseCost = PhaseCost()
    learn_done: bool = False
    learn_used: dict[str, int] | None = None
    splits_used_for_learning: list[str] = []
    #: The state evaluation must keep, and the state it ended with.
    digest_before_eval: str | None = None
    digest_after_eval: str | None = None
    #: Poison items named before they are added, then what was added.
    poisoning: list[str] | None = None
    poisoned: dict[str, Any] | None = None
    model_changed: ModelChange | None = None
    experiment: ExperimentMark | None = None
    #: The violations so far (the signed record, violations.jsonl, is the truth; this list only
    #: adds an entry a run from before that record kept).
    violations: list[str] = []
    #: Lines ``--repair`` moved aside, and the lines after those holes.
    record_breaks: list[str] = []
    record_damaged: list[int] = []
    #: Each move of the run to another machine's record key (``--move-here``), in order.
    record_moves: list[RecordMove] = []

    def cost(self, phase: str) -> PhaseCost:
        return self.cost_learn if phase == "learn" else self.cost_evaluate

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def learned_part(self, *, keep_poison: bool) -> RunState:
        """The state as learning left it (a replay starts from it): without what evaluation,
        a resume, a repair or a move added, without its record's key and violations (the record
        is the source's own, not copied), and without a change of model not yet rebased (the
        replay would name its own reference)."""
        model = self.model_changed if self.model_changed is not None and self.model_changed.rebased else None
        return self.model_copy(update={
            "digest_after_eval": None, "cost_evaluate": PhaseCost(), "record_breaks": [],
            "record_damaged": [], "resumed_by": [], "violations": [], "model_changed": model,
            # The copy's record is its own, signed where it is made.
            "record_key_id": None, "record_moves": [],
            **({} if keep_poison else {"poisoning": None, "poisoned": None})})


def migrate(data: dict[str, Any], where: Path | str) -> dict[str, Any]:
    """A state written by an earlier Arena, as this version writes it."""
    version = data.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
        raise LedgerError(f"{where} was written by a newer Arena (state version {version!r}; this "
                          f"Arena reads up to {VERSION}). Upgrade Arena to read it.")
    if version == 1:  # each phase cost also kept its last session's starting point (base_*)
        data = {**data, "version": VERSION}
        for phase in PHASES:
            if isinstance(data.get(f"cost_{phase}"), dict):
                data[f"cost_{phase}"] = {k: v for k, v in data[f"cost_{phase}"].items() if k in COST_KEYS}
    return data


def parse(data: dict[str, Any], where: Path | str) -> RunState:
    """``data`` (a state.json's object, any version) as a :class:`RunState`."""
    try:
        return RunState.model_validate(migrate(data, where))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top)"
        what = "an unknown entry" if first["type"] == "extra_forbidden" else f"a bad value ({first['msg']})"
        raise LedgerError(f"{where} has {what} at {field!r}: the run's state was edited or written by "
                          "another program. Restore it from a copy, or start a new run.") from exc


class Ledger:
    """The state of the run in ``folder``: read it, or record one protocol event (each an
    atomic write of the whole state)."""

    def __init__(self, folder: Path | str) -> None:
        self.path = Path(folder) / STATE
        self._lock = threading.Lock()

    def exists(self) -> bool:
        return self.path.is_file()

    def read(self) -> RunState:
        """The state (an empty one where none was written yet)."""
        if not self.path.exists():
            return RunState()
        return parse(read_json(self.path, "the run's state"), self.path)

    def phase_cost(self, phase: str, records: Iterable[EpisodeResult]) -> PhaseCost:
        """``phase``'s cost so far: the ledger's, or the furthest its records carry where that is
        ahead (a session killed after a record; records of concurrent episodes may reach the
        file out of order)."""
        cost = self.read().cost(phase)
        for record in records:
            if record.phase == phase and record.phase_cost:
                cost = cost.latest(PhaseCost.of(record.phase_cost))
        return cost

    # -- the step journal keeps the state to put back ----------------------------------------

    def snapshot(self) -> str | None:
        """state.json as it is on disk (a learning step's journal keeps it)."""
        return self.path.read_text() if self.path.exists() else None

    def undo_step(self, snapshot: str | None, phase: str, cost: PhaseCost) -> RunState:
        """Put the state back as it was before a step a killed session did not finish, but for
        its violations (never undone: the record keeps them), with ``phase``'s cost set to
        ``cost`` (the cost on record and the killed episode's own calls)."""
        with self._lock:
            now = self.read()
            before = now if snapshot is None else parse(json.loads(snapshot), self.path)
            return self._write(before.model_copy(update={"violations": now.violations, f"cost_{phase}": cost}))

    # -- the protocol's events ---------------------------------------------------------------

    def create(self, *, config_sha256: str | None, record_key_id: str | None,
               continued_from: dict[str, Any] | None = None) -> RunState:
        """The run's first state: what ``--resume`` checks, and the run it continues, if any."""
        return self._change(config_sha256=config_sha256, record_key_id=record_key_id,
                            continued_from=continued_from)

    def start(self, *, started: str, provenance: dict[str, Any]) -> RunState:
        return self._change(started=started, provenance=provenance)

    def resumed_by(self, version: dict[str, Any]) -> RunState:
        """Another Arena version resumed the run (``--allow-version-change``)."""
        return self._amend(lambda state: {"resumed_by": [*state.resumed_by, version]})

    def phase_session(self, phase: str, session: dict[str, Any]) -> RunState:
        """A session of ``phase`` begins on ``session`` (commit, CPU); kept once per change."""
        def added(state: RunState) -> dict[str, Any]:
            earlier = state.phase_sessions.get(phase, [])
            return {} if earlier and earlier[-1] == session else \
                {"phase_sessions": {**state.phase_sessions, phase: [*earlier, session]}}
        return self._amend(added)

    def gradient_steps(self, count: int) -> RunState:
        """The optimizer steps charged to the learning budget so far."""
        return self._change(gradient_steps=int(count))

    def learning_done(self, *, used: dict[str, int], splits: list[str], digest: str,
                      cost: PhaseCost) -> RunState:
        """Learning is over, and this is the state evaluation must keep: one write, so a session
        killed between the two cannot digest another state."""
        return self._change(learn_done=True, learn_used=dict(used), splits_used_for_learning=sorted(splits),
                            digest_before_eval=digest, cost_learn=cost)

    def poisoning(self, ids: list[str]) -> RunState:
        """Poison items about to be added (a session killed before :meth:`poisoned` takes them out)."""
        return self._change(poisoning=list(ids))

    def poisoned(self, summary: dict[str, Any], digest: str) -> RunState:
        """The learned store holds its poison: the state evaluation must keep is this one."""
        return self._change(poisoned=summary, digest_before_eval=digest)

    def rebased(self, change: ModelChange, digest: str) -> RunState:
        """A learned state checked under its new model, whose digest is now the reference."""
        return self._change(model_changed=change, digest_before_eval=digest)

    def evaluation_done(self, *, digest: str, cost: PhaseCost) -> RunState:
        return self._change(digest_after_eval=digest, cost_evaluate=cost)

    def violations(self, messages: list[str]) -> RunState:
        """Every violation so far (after the record took the newest)."""
        return self._change(violations=list(messages))

    def repaired(self, breaks: list[str], damaged: list[int]) -> RunState:
        """``--repair`` moved ``damaged`` lines aside; ``breaks`` are the lines after the holes."""
        return self._amend(lambda state: {"record_breaks": [*state.record_breaks, *breaks],
                                          "record_damaged": [*state.record_damaged, *damaged]})

    def moved(self, move: RecordMove) -> RunState:
        """The run goes on under this machine's record key (``--move-here``)."""
        return self._amend(lambda state: {"record_key_id": move.to_key_id,
                                          "record_moves": [*state.record_moves, move]})

    def mark_experiment(self, mark: ExperimentMark) -> RunState:
        return self._change(experiment=mark)

    def made_from(self, state: RunState) -> RunState:
        """The whole state of a run made from another's files (a replay, an evaluation of a
        learned state), as the maker prepared it."""
        with self._lock:
            return self._write(state)

    # -- writing -----------------------------------------------------------------------------

    def _change(self, **changes: Any) -> RunState:
        return self._amend(lambda state: changes)

    def _amend(self, changes_of: Callable[[RunState], dict[str, Any]]) -> RunState:
        """One event: the changes it makes to the state as it is now, checked and written whole
        (none: nothing is written)."""
        with self._lock:
            state = self.read()
            changes = changes_of(state)
            return self._write(RunState.model_validate({**dict(state), **changes})) if changes else state

    def _write(self, state: RunState) -> RunState:
        write_json_atomic(self.path, state.to_json())
        return state
