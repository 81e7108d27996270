"""``metrics.jsonl``: the run's curves, one line per logged step (``run.log_metrics``).

Every learning method logs what its learning looks like (success, reward, losses, KL, memory
size...) through one call, so the leaderboard and other readers find them in one file under
one shape, whatever the method, instead of reading a method's private state. A line is
``{"phase", "step", "metrics": {name: number}, "time"}``. Several lines of one (phase, step) merge,
a later value of a name replacing an earlier one: a step done again after a resume logs again
and its new figures win, and a method may log different figures of one step in two calls.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arena.core.storage.rundir import read_jsonl

if TYPE_CHECKING:
    from arena.core.storage.trackers import Tracker

METRICS = "metrics.jsonl"
#: A policy update's metric (the RL trainer's): 1.0 where its forward and backward ran in bf16
#: autocast (``precision: auto`` on a device with native bf16), 0.0 in the weights' own dtype. The
#: board shows each RL row's update precision from it.
BF16_AUTOCAST = "bf16_autocast"
Value = int | float | bool


class MetricsLog:
    """Appends the run's metrics, each line fsynced (a killed run keeps what it logged), and
    hands each step to the run's experiment trackers (``arena.core.storage.trackers``)."""

    def __init__(self, run_path: Path, trackers: Sequence[Tracker] = ()) -> None:
        self.path = Path(run_path) / METRICS
        self._trackers = list(trackers)
        self._lock = threading.Lock()

    def log(self, phase: str, step: int, metrics: Mapping[str, Any]) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"run.log_metrics: step must be an int >= 0, got {step!r}")
        clean: dict[str, Value] = {}
        for name, value in metrics.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"run.log_metrics: metric names are non-empty strings, got {name!r}")
            if not isinstance(value, (int, float, bool)) or (isinstance(value, float) and not math.isfinite(value)):
                raise TypeError(f"run.log_metrics: metric {name!r} must be a finite number or a flag, "
                                f"got {value!r}")
            # Six significant digits, not decimals: an lr of 1e-6 or a gradient norm of 3e-7
            # must not be logged as 0.
            clean[name] = float(f"{value:.6g}") if isinstance(value, float) else value
        line = json.dumps({"phase": phase, "step": step, "metrics": clean,
                           "time": round(time.time(), 3)}, sort_keys=True)
        with self._lock:
            with self.path.open("a") as handle:
                handle.write(line + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            for tracker in self._trackers:
                tracker.log(phase, step, clean)

    def close(self) -> None:
        """Close the trackers (the harness's call, when the run ends)."""
        with self._lock:
            trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close()


def read_metrics(run_path: Path | str) -> list[dict[str, Any]]:
    """The run's logged steps, ``{"phase", "step", "metrics"}``, the lines of each (phase, step)
    merged, in step order ([] if none). A torn last line (a kill mid-write) is left out; a damaged
    line elsewhere is a :class:`~arena.core.storage.rundir.RunDirError` naming it, as for every record."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for entry in read_jsonl(Path(run_path) / METRICS, repair=False):
        if isinstance(entry.get("metrics"), dict):
            key = (str(entry.get("phase")), int(entry.get("step", 0)))
            merged.setdefault(key, {}).update(entry["metrics"])
    return [{"phase": phase, "step": step, "metrics": merged[phase, step]}
            for phase, step in sorted(merged)]
