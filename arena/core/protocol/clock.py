"""A phase's cost (model calls, tokens, wall time) across the sessions that ran it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from arena.core.host import provenance
from arena.core.storage.ledger import PhaseCost
from arena.core.storage.rundir import RunDir


class PhaseClock:
    """This session's share of a phase, over the base earlier sessions left on record (the
    ledger's, or the last record's where that is ahead: a session killed after a record)."""

    def __init__(self, run_dir: RunDir) -> None:
        self._run_dir = run_dir
        self._usage: Callable[[], Mapping[str, int]] = dict
        self._lock = threading.Lock()
        self._base = PhaseCost()
        self._started = time.perf_counter()
        self._usage_at_start: Mapping[str, int] = {}

    def meter(self, usage: Callable[[], Mapping[str, int]]) -> None:
        """Read the run's model usage from ``usage`` (the services', once they exist)."""
        self._usage = usage
        self._started, self._usage_at_start = time.perf_counter(), usage()

    def now(self, phase: str) -> PhaseCost:
        """The phase's cost so far: earlier sessions' (its base) and this session's."""
        with self._lock:
            usage = self._usage()
            return self._base.plus(PhaseCost(
                **{key: usage[key] - self._usage_at_start[key] for key in ("llm_calls", "tokens_in", "tokens_out")},
                wall_s=time.perf_counter() - self._started))

    def start(self, phase: str) -> PhaseCost:
        """Take the phase's cost from earlier sessions as the base, and note what this session of
        the phase runs on (commit, CPU; a resumed phase can have two)."""
        self._base = self._run_dir.ledger.phase_cost(phase, self._run_dir.episodes())
        self._run_dir.ledger.phase_session(phase, provenance.session())
        self._started, self._usage_at_start = time.perf_counter(), self._usage()
        return self._base
