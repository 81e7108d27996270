"""The run's phase (learning, then evaluation) and track, and the log of protocol violations.

Only the harness moves a run from learning to evaluation: :class:`PhaseGuard` advances for the
holder of the key it was made with (the harness's session), and refuses, on record, anyone else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from arena.core.contract.errors import ProtocolViolation

LEARN = "learn"
EVALUATE = "evaluate"
TRACKS = ("frozen", "online")


class ViolationLog:
    """The run's protocol violations. Each is kept at once by ``persist(message, all)``: the
    harness signs it into the run's chained record (``violations.jsonl``) and lists it in
    state.json. A resumed run starts from the signed record, never from state.json alone, so
    emptying state.json's list does not erase a violation (``RunDir.violations_on_record``)."""

    def __init__(self, method: str, recorded: list[str],
                 persist: Callable[[str, list[str]], object],
                 unrecorded: Sequence[str] = ()) -> None:
        self.method = method
        self._messages = list(recorded)
        self._persist = persist
        self._lock = threading.Lock()
        for message in unrecorded:  # found on resume (state.json's extra entries, a disagreement)
            self.record(message)

    @property
    def messages(self) -> list[str]:
        with self._lock:
            return list(self._messages)

    def record(self, message: str) -> None:
        with self._lock:
            if message in self._messages:
                return
            self._messages.append(message)
            self._persist(message, list(self._messages))

    def refusal(self, message: str) -> ProtocolViolation:
        """Record ``message``; the error to raise at the method."""
        self.record(message)
        return ProtocolViolation(message)


class PhaseGuard:
    """Which phase the run is in and on which track; advanced only with the harness's key."""

    def __init__(self, track: str, *, key: object, violations: ViolationLog) -> None:
        if track not in TRACKS:
            raise ValueError(f"run.track must be one of {TRACKS}, got '{track}'.")
        self._phase = LEARN
        self._track = track
        self._key = key
        self._violations = violations

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def track(self) -> str:
        return self._track

    def is_learning(self) -> bool:
        return self._phase == LEARN

    def is_frozen(self) -> bool:
        return self._phase == EVALUATE and self._track == "frozen"

    def authorise(self, key: object, action: str) -> None:
        """Refuse (on record) a harness-only ``action`` asked by anyone without the key."""
        if key is not self._key:
            raise self._violations.refusal(
                f"Method '{self._violations.method}' tried to {action}; only the harness may.")

    def advance(self, phase: str, *, key: object) -> None:
        self.authorise(key, f"set the run's phase to {phase!r}")
        if phase not in (LEARN, EVALUATE):
            raise ValueError(f"Unknown phase {phase!r}; phases: {LEARN}, {EVALUATE}.")
        self._phase = phase
