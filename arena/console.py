"""How ``arena run`` shows progress: bars on a terminal, plain timestamped lines elsewhere.

A job on a cluster or ``arena run ... > log`` has no terminal, where rich's bars draw nothing
until the end; there every phase and every reported step writes a line when it starts, at most
one line per ``interval_s`` while it lasts (counts, rate and ETA), and one when it ends, as pytest
and lm-eval do when their output is not a terminal. A phase's line counts what it records (the
plan's tasks at evaluation) and also every episode actually played, with the step each one in
play has reached: a method that plays helper episodes (Evolving-RL plays three per task) moves
its line every step, not only when a task ends.
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime
from typing import IO, Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from arena.core.contract.results import PRIMARY_VARIANT
from arena.core.contract.types import EpisodeResult
from arena.core.execution.phase import EVALUATE
from arena.core.services.progress import PhaseTally, format_duration


def counted(result: EpisodeResult) -> bool:
    """Whether an episode counts toward its phase's total: an evaluation's primary episodes
    do; a method's helper episodes (variants, e.g. Evolving-RL's source and without-skill
    episodes) are recorded but are not tasks of the plan."""
    return result.phase != EVALUATE or result.variant == PRIMARY_VARIANT


def unit_of(phase: str) -> str:
    """What a phase's count counts: the plan's tasks at evaluation, episodes while learning."""
    return "tasks" if phase == EVALUATE else "episodes"


class EtaColumn(ProgressColumn):
    """``eta 4m10s``: the phase's own estimate (from the episodes played) where it gives one,
    else rich's (from the bar's count)."""

    def __init__(self) -> None:
        super().__init__()
        self.rich = TimeRemainingColumn()

    def render(self, task: Task) -> Text:
        if "eta" in task.fields:
            return Text(f"eta {task.fields['eta']}" if task.fields["eta"] else "", style="progress.remaining")
        return Text("eta ") + self.rich.render(task)


def bars(console: Any) -> Progress:
    """The rich progress display the terminal reporter draws into."""
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[success]}"), TimeElapsedColumn(), EtaColumn(),
        console=console, transient=False,
    )


class _EpisodeProgress:
    """The episode and step callbacks both reporters share: each updates the phase's tally under
    the lock, then the reporter shows it its own way (``_refresh``)."""

    phases: dict[str, PhaseTally]
    _lock: threading.Lock

    def _refresh(self, phase: str) -> None:
        raise NotImplementedError

    def _episode_counted(self, phase: str, tally: PhaseTally) -> None:
        """Show a phase whose tally has just counted a finished episode."""
        raise NotImplementedError

    def episode(self, result: EpisodeResult) -> None:
        with self._lock:
            tally = self.phases.get(result.phase)
            if tally is None or not counted(result):
                return
            tally.result(result.success)
            self._episode_counted(result.phase, tally)

    def plan_task_start(self, phase: str) -> None:
        with self._lock:
            if phase in self.phases:
                self.phases[phase].plan_task_start()

    def play_start(self, phase: str, max_steps: int) -> None:
        with self._lock:
            if phase in self.phases:
                self.phases[phase].play_start(max_steps)
                self._refresh(phase)

    def play_step(self, phase: str, step: int) -> None:
        with self._lock:
            if phase in self.phases:
                self.phases[phase].play_step(step)
                self._refresh(phase)

    def play_end(self, phase: str) -> None:
        with self._lock:
            if phase in self.phases:
                self.phases[phase].play_end()
                self._refresh(phase)

    def generation(self, tokens: int, limit: int, replies: int) -> None:
        """Shown on the phase running now (the last begun): the model serves one phase at a time."""
        with self._lock:
            if self.phases:
                phase = next(reversed(self.phases))
                self.phases[phase].generation(tokens, limit, replies)
                self._refresh(phase)


class RichReporter(_EpisodeProgress):
    """Progress bars: one per phase, with its count (tasks at evaluation), the episodes played and
    the steps of those in play, success so far and an ETA from the episodes played; one per step
    a method reports while it lasts. A phase's bar stops when the phase ends."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}
        self.phases: dict[str, PhaseTally] = {}
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def _refresh(self, phase: str) -> None:
        self._show(phase)

    def _show(self, name: str, *, final: bool = False) -> None:
        tally = self.phases[name]
        eta = None if final else tally.eta_s()
        self.progress.update(self.tasks[name], completed=tally.done, total=tally.total,
                             success="; ".join(tally.detail(final=final)),
                             eta=format_duration(eta) if eta is not None else "")

    def phase(self, name: str, total: int | None, done: int) -> None:
        with self._lock:
            self.phases[name] = PhaseTally(total, done, unit_of(name))
            self.tasks[name] = self.progress.add_task(f"{name:<8}", total=total, completed=done,
                                                      success="", eta="")

    def _episode_counted(self, phase: str, tally: PhaseTally) -> None:
        self._show(phase)

    def phase_end(self, name: str, *, stopped: bool = False) -> None:
        with self._lock:
            if self.phases.get(name) is None:
                return
            self._show(name, final=True)
            self.progress.stop_task(self.tasks.pop(name))
            del self.phases[name]

    def task_start(self, label: str, total: int | None) -> None:
        with self._lock:
            self.tasks[label] = self.progress.add_task(f"  {label}", total=total, success="")
            self.counts[label] = 0

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None:
        with self._lock:
            if label in self.tasks:
                self.counts[label] = done
                self.progress.update(self.tasks[label], completed=done, total=total, success=note)

    def task_end(self, label: str, note: str) -> None:
        with self._lock:
            task = self.tasks.pop(label, None)
            if task is not None:  # a step without a count ends as one full bar
                done = max(self.counts.pop(label, 0), 1)
                self.progress.update(task, completed=done, total=done, success=note)
                self.progress.stop_task(task)


class _Line:
    def __init__(self, total: int | None, done: int) -> None:
        self.total, self.done, self.start_done = total, done, done
        self.started = time.monotonic()
        self.printed = 0.0
        self.note = ""


class LineReporter(_EpisodeProgress):
    """Plain lines for logs, one per interval while a phase or step lasts and one when it ends:
    ``09:41:07 evaluate 3/8 (38%) tasks; 9 episodes played; playing step 14/30, 3/30; 4m10s eta
    8m20s; success 33.3%``. A phase that ended writes nothing more."""

    def __init__(self, stream: IO[str] | None = None, interval_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.lines: dict[str, _Line] = {}
        self.phases: dict[str, PhaseTally] = {}
        self.printed: dict[str, float] = {}  # phase -> when its last line was written
        self.opened_in: dict[str, str] = {}  # step label -> the phase it began in
        self.current: str | None = None
        self._lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None

    def _beat(self) -> None:
        """A step that reports nothing for a while (one long generate call, a trainer update)
        still gets a line every ``interval_s``: a silent log looks like a hung job."""
        period = max(self.interval_s, 1.0)
        while True:
            time.sleep(period)
            with self._lock:
                now = time.monotonic()
                for name, tally in list(self.phases.items()):
                    if now - self.printed[name] >= period:
                        self.printed[name] = now
                        self._write(name, tally.status() + " (running)")
                for label, line in list(self.lines.items()):
                    if now - line.printed >= period:
                        line.printed = now
                        self._write(label, self._status(line) + " (running)")

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, name="arena-progress", daemon=True)
            self._heartbeat.start()

    def _write(self, label: str, text: str) -> None:
        stamp = datetime.now().strftime("%H:%M:%S")
        self.stream.write(f"{stamp} {label} {text}\n")
        self.stream.flush()

    def _status(self, line: _Line) -> str:
        elapsed = time.monotonic() - line.started
        parts = [f"{line.done}/{line.total}" if line.total else f"{line.done}"]
        if line.total:
            parts[0] += f" ({line.done / line.total:.0%})"
        parts.append(format_duration(elapsed))
        progressed = line.done - line.start_done
        if line.total and progressed > 0 and line.done < line.total:
            parts.append("eta " + format_duration(elapsed / progressed * (line.total - line.done)))
        if line.note:
            parts.append(line.note)
        return " ".join(parts)

    def _maybe_print(self, label: str, line: _Line, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - line.printed >= self.interval_s:
            line.printed = now
            self._write(label, self._status(line))

    def _refresh(self, phase: str) -> None:
        self._maybe_print_phase(phase)

    def _maybe_print_phase(self, name: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.printed[name] >= self.interval_s:
            self.printed[name] = now
            self._write(name, self.phases[name].status())

    def phase(self, name: str, total: int | None, done: int) -> None:
        with self._lock:
            self.phases[name] = tally = PhaseTally(total, done, unit_of(name))
            self.printed[name] = time.monotonic()
            self.current = name
            self._ensure_heartbeat()
            self._write(name, f"started: {done}/{total} {tally.unit} done" if total else "started")

    def phase_end(self, name: str, *, stopped: bool = False) -> None:
        with self._lock:
            tally = self.phases.pop(name, None)
            if tally is None:
                return
            self.printed.pop(name, None)
            for label in [label for label, phase in self.opened_in.items() if phase == name]:
                line = self.lines.pop(label, None)  # a step the method left open ends with its phase
                self.opened_in.pop(label)
                if line is not None:
                    self._write(label, f"stopped with the {name} phase after "
                                       f"{format_duration(time.monotonic() - line.started)}")
            # A phase interrupted (Ctrl-C, SIGTERM) or ending short of its total (a method that
            # ends its learning early) was stopped: saying "done" misleads whoever reads the log.
            short = tally.total is not None and tally.done < tally.total
            ended = "stopped after" if stopped or short else "done in"
            self._write(name, f"{ended} {format_duration(tally.elapsed())}: {tally.status(final=True)}")
            if self.current == name:
                self.current = None

    def _episode_counted(self, phase: str, tally: PhaseTally) -> None:
        # A phase's last episode is printed at once, not at the next heartbeat.
        self._maybe_print_phase(phase, force=tally.total is not None and tally.done >= tally.total)

    def task_start(self, label: str, total: int | None) -> None:
        with self._lock:
            self.lines[label] = line = _Line(total, 0)
            if self.current is not None:
                self.opened_in[label] = self.current
            line.printed = time.monotonic()
            self._ensure_heartbeat()
            self._write(label, f"started ({total} to do)" if total else "started")

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None:
        with self._lock:
            line = self.lines.get(label)
            if line is not None:
                line.done, line.total, line.note = done, total, note
                self._maybe_print(label, line)

    def task_end(self, label: str, note: str) -> None:
        with self._lock:
            self.opened_in.pop(label, None)
            line = self.lines.pop(label, None)
            if line is not None:
                line.note = note or line.note
                elapsed = format_duration(time.monotonic() - line.started)
                self._write(label, f"done in {elapsed}" + (f": {line.note}" if line.note else ""))
