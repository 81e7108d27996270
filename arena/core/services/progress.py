"""Progress of a run, for whoever watches it: the harness's phases (learn, evaluate) and any long
step a method takes inside them (an iteration, skill extraction, a trainer update, distillation).

The harness and methods talk to a :class:`Reporter`; the CLI supplies one that draws bars on a
terminal and writes plain, timestamped lines when its output goes to a file (a job log). A method
reports through ``run.progress(label, total)``, a :class:`ProgressTask`, never through the
reporter itself, so no method needs to know where its progress is shown.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from arena.core.contract.types import EpisodeResult


class Reporter(Protocol):
    """Progress callbacks. ``phase``/``episode``/``phase_end``: the harness's phases and the
    episodes they record; ``plan_task_start``: a task of the evaluation plan begins;
    ``generation``: the tokens of the model's generation in progress (``tokens == limit``: done);
    ``play_*``: every episode actually played (a method's helper episodes too), step by step, on
    the thread that plays it; ``task_*``: a named step within a phase, with a count when it has
    one. ``phase_end(stopped=True)``: the phase was interrupted (Ctrl-C, SIGTERM, an error), which
    a phase without a known total cannot tell from its count. A reporter may leave out any but
    ``phase`` and ``episode`` (:func:`complete`)."""

    def phase(self, name: str, total: int | None, done: int) -> None: ...

    def episode(self, result: EpisodeResult) -> None: ...

    def phase_end(self, name: str, *, stopped: bool = False) -> None: ...

    def plan_task_start(self, phase: str) -> None: ...

    def play_start(self, phase: str, max_steps: int) -> None: ...

    def play_step(self, phase: str, step: int) -> None: ...

    def play_end(self, phase: str) -> None: ...

    def task_start(self, label: str, total: int | None) -> None: ...

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None: ...

    def task_end(self, label: str, note: str) -> None: ...

    def generation(self, tokens: int, limit: int, replies: int) -> None: ...


class NullReporter:
    """Shows nothing (library use, tests)."""

    def phase(self, name: str, total: int | None, done: int) -> None:
        pass

    def episode(self, result: EpisodeResult) -> None:
        pass

    def phase_end(self, name: str, *, stopped: bool = False) -> None:
        pass

    def plan_task_start(self, phase: str) -> None:
        pass

    def play_start(self, phase: str, max_steps: int) -> None:
        pass

    def play_step(self, phase: str, step: int) -> None:
        pass

    def play_end(self, phase: str) -> None:
        pass

    def task_start(self, label: str, total: int | None) -> None:
        pass

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None:
        pass

    def task_end(self, label: str, note: str) -> None:
        pass

    def generation(self, tokens: int, limit: int, replies: int) -> None:
        pass


class _Completed(NullReporter):
    """A reporter written for fewer callbacks (only ``phase`` and ``episode``, say): the ones it
    has are called, the others do nothing."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        for name in ("phase", "episode", "phase_end", "plan_task_start", "play_start", "play_step",
                     "play_end", "task_start", "task_update", "task_end", "generation"):
            method = getattr(inner, name, None)
            if callable(method):
                setattr(self, name, method)
        end = getattr(inner, "phase_end", None)
        if callable(end) and "stopped" not in inspect.signature(end).parameters:
            # written before ``stopped`` existed: it is told the phase ended, as it was
            self.phase_end = lambda name, *, stopped=False: end(name)  # type: ignore[method-assign]


@contextmanager
def phase_ending(reporter: Reporter, name: str) -> Iterator[None]:
    """Ends phase ``name`` on ``reporter`` when the block ends, ``stopped`` where an exception
    (Ctrl-C, SIGTERM, an error) leaves it: a phase without a total cannot tell by its count."""
    try:
        yield
    except BaseException:
        reporter.phase_end(name, stopped=True)
        raise
    reporter.phase_end(name)


def complete(reporter: object | None) -> Reporter:
    """``reporter`` with every callback of :class:`Reporter` (missing ones do nothing)."""
    if reporter is None:
        return NullReporter()
    if isinstance(reporter, NullReporter):
        return reporter
    return _Completed(reporter)


class PhaseTally:
    """What a phase has done, for whoever shows its progress: the results it counts (the plan's
    tasks at evaluation, learning episodes), the episodes actually played (a method's helper
    episodes too, which a count of tasks hides for minutes), the step each one being played has
    reached, and an ETA from the episodes done. Not thread-safe: the reporter holds its lock."""

    def __init__(self, total: int | None, done: int, unit: str = "episodes") -> None:
        self.total, self.done, self.start_done, self.unit = total, done, done, unit
        self.started = time.monotonic()
        self.successes = self.counted = 0
        self.plan_started = 0  # tasks of the plan begun in this session
        self.plays_started = self.played = 0  # episodes played in this session
        self.live: dict[int, list[int]] = {}  # playing thread -> [step reached, step limit]
        # Episodes each task of the plan took: a task is played on one thread, its helper
        # episodes too (where the method plays them from its solve).
        self.task_plays: dict[int, int] = {}  # thread -> episodes its task has begun so far
        self.finished_plays = self.finished_tasks = 0
        self.generating: tuple[int, int, int] | None = None  # tokens, limit, replies

    def generation(self, tokens: int, limit: int, replies: int) -> None:
        """The model's generation in progress (cards, reflections: a minute or more on a CPU,
        while no episode takes a step); ``tokens >= limit`` ends it."""
        self.generating = (tokens, limit, replies) if tokens < limit else None

    def plan_task_start(self) -> None:
        self.plan_started += 1
        self.task_plays[threading.get_ident()] = 0

    def result(self, success: bool) -> None:
        """A counted result, on the thread that played it (the task it ends, at evaluation)."""
        self.done += 1
        self.counted += 1
        self.successes += int(success)
        plays = self.task_plays.pop(threading.get_ident(), None)
        if plays is not None:
            self.finished_plays += plays
            self.finished_tasks += 1

    def play_start(self, max_steps: int) -> None:
        self.plays_started += 1
        thread = threading.get_ident()
        self.live[thread] = [0, max_steps]
        if thread in self.task_plays:
            self.task_plays[thread] += 1

    def play_step(self, step: int) -> None:
        live = self.live.get(threading.get_ident())
        if live is not None:
            live[0] = step

    def play_end(self) -> None:
        self.played += 1
        self.live.pop(threading.get_ident(), None)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def episodes_per_task(self) -> float:
        """The episodes a task of the plan takes: as many as the finished ones took, at least as
        many as the tasks begun have begun so far, at least one."""
        finished = self.finished_plays / self.finished_tasks if self.finished_tasks else 0.0
        begun = self.plays_started / self.plan_started if self.plan_started else 0.0
        return max(1.0, finished, begun)

    def eta_s(self) -> float | None:
        """Seconds left: from the episodes played where the phase has a plan of tasks (the
        episodes its tasks still need, at the pace of those done), else from the results."""
        if not self.total or self.done >= self.total:
            return None
        elapsed = self.elapsed()
        if self.played and self.plan_started:
            per_task = self.episodes_per_task()
            left = per_task * (self.total - self.start_done) - self.played
            return elapsed / self.played * max(left, 0.0)
        progressed = self.done - self.start_done
        return elapsed / progressed * (self.total - self.done) if progressed > 0 else None

    def detail(self, *, final: bool = False) -> list[str]:
        """What a count alone hides: episodes played (where they differ from the count), the step
        of each episode in play (not when ``final``), success so far."""
        parts = []
        if self.played != self.done - self.start_done or self.live:
            parts.append(f"{self.played} episode{'' if self.played == 1 else 's'} played")
        if self.live and not final:
            steps = sorted((tuple(v) for v in self.live.values()), reverse=True)
            shown = ", ".join(f"{step}/{limit}" for step, limit in steps[:4])
            parts.append(f"playing step {shown}" + (f" (+{len(steps) - 4})" if len(steps) > 4 else ""))
        if self.generating and not final:
            tokens, limit, replies = self.generating
            parts.append(f"generating {tokens}/{limit} tokens of {replies} repl{'y' if replies == 1 else 'ies'}")
        if self.counted:
            parts.append(f"success {self.successes / self.counted:.1%}")
        return parts

    def status(self, *, final: bool = False) -> str:
        """``3/8 (38%) tasks; 9 episodes played; playing step 14/30, 3/30; 4m10s eta 8m20s;
        success 33.3%`` (when ``final``: no time, no ETA, no episodes in play)."""
        count = f"{self.done}/{self.total} ({self.done / self.total:.0%})" if self.total else f"{self.done}"
        timing = [] if final else [format_duration(self.elapsed())]
        eta = None if final else self.eta_s()
        if eta is not None:
            timing[0] += " eta " + format_duration(eta)
        detail = self.detail(final=final)
        success = [part for part in detail if part.startswith("success")]
        return "; ".join([f"{count} {self.unit}", *[p for p in detail if p not in success], *timing, *success])


class ProgressTask:
    """One step of a method's work, shown while it lasts: ``advance`` as parts finish, ``note``
    to say what is going on; ends (with its elapsed time) when the ``with`` block does.

    Thread-safe: episodes played side by side may advance it at once.
    """

    def __init__(self, reporter: Reporter, label: str, total: int | None = None) -> None:
        # A reporter written for the phase/episode callbacks alone still works: it shows no steps.
        self.reporter = complete(reporter)
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
