"""Progress of a run, for whoever watches it: the harness's phases (learn, evaluate) and any long
step a method takes inside them (an iteration, skill extraction, a trainer update, distillation).

The harness and methods talk to a :class:`Reporter`; the CLI supplies one that draws bars on a
terminal and writes plain, timestamped lines when its output goes to a file (a job log). A method
reports through ``run.progress(label, total)``, a :class:`ProgressTask`, never through the
reporter itself, so no method needs to know where its progress is shown.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from arena.core.types import EpisodeResult


class Reporter(Protocol):
    """Progress callbacks. ``phase``/``episode``: the harness's phases and their episodes;
    ``task_*``: a named step within a phase, with a count when it has one."""

    def phase(self, name: str, total: int | None, done: int) -> None: ...

    def episode(self, result: EpisodeResult) -> None: ...

    def task_start(self, label: str, total: int | None) -> None: ...

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None: ...

    def task_end(self, label: str, note: str) -> None: ...


class NullReporter:
    """Shows nothing (library use, tests)."""

    def phase(self, name: str, total: int | None, done: int) -> None:
        pass

    def episode(self, result: EpisodeResult) -> None:
        pass

    def task_start(self, label: str, total: int | None) -> None:
        pass

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None:
        pass

    def task_end(self, label: str, note: str) -> None:
        pass


class ProgressTask:
    """One step of a method's work, shown while it lasts: ``advance`` as parts finish, ``note``
    to say what is going on; ends (with its elapsed time) when the ``with`` block does.

    Thread-safe: episodes played side by side may advance it at once.
    """

    def __init__(self, reporter: Reporter, label: str, total: int | None = None) -> None:
        # A reporter written for the phase/episode callbacks alone still works: it shows no steps.
        self.reporter = reporter if hasattr(reporter, "task_start") else NullReporter()
        self.label = label
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._ended = False
        self.reporter.task_start(label, total)

    def advance(self, amount: int = 1, note: str = "") -> None:
        with self._lock:
            self.done += amount
            self.reporter.task_update(self.label, self.done, self.total, note)

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        """Set the count (and the total, once it is known)."""
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
            self.reporter.task_update(self.label, self.done, self.total, note)

    def end(self, note: str = "") -> None:
        with self._lock:
            if not self._ended:
                self._ended = True
                self.reporter.task_end(self.label, note)

    def __enter__(self) -> ProgressTask:
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        self.end("" if kind is None else "interrupted")


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
