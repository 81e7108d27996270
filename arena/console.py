"""How ``arena run`` shows progress: bars on a terminal, plain timestamped lines elsewhere.

A job on a cluster or ``arena run ... > log`` has no terminal, where rich's bars draw nothing
until the end; there every phase and every reported step writes a line when it starts, at most
one line per ``interval_s`` while it lasts (counts, rate and ETA), and one when it ends, as pytest
and lm-eval do when their output is not a terminal.
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
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from arena.core.context import EVALUATE
from arena.core.progress import format_duration
from arena.core.protocol import PRIMARY_VARIANT
from arena.core.types import EpisodeResult


def counted(result: EpisodeResult) -> bool:
    """Whether an episode counts toward its phase's total: an evaluation's primary episodes
    do; a method's helper episodes (variants, e.g. Evolving-RL's source and without-skill
    episodes) are recorded but are not tasks of the plan."""
    return result.phase != EVALUATE or result.variant == PRIMARY_VARIANT


def bars(console: Any) -> Progress:
    """The rich progress display the terminal reporter draws into."""
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[success]}"), TimeElapsedColumn(), TextColumn("eta"),
        TimeRemainingColumn(), console=console, transient=False,
    )


class RichReporter:
    """Progress bars: one per phase, with episode counts, success so far and ETA, and one per
    step a method reports while it lasts."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}
        self.successes: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def phase(self, name: str, total: int | None, done: int) -> None:
        self.successes[name] = 0
        self.counts[name] = 0
        self.tasks[name] = self.progress.add_task(f"{name:<8}", total=total, completed=done, success="")

    def episode(self, result: EpisodeResult) -> None:
        task = self.tasks.get(result.phase)
        if task is None or not counted(result):
            return
        self.counts[result.phase] += 1
        self.successes[result.phase] += int(result.success)
        rate = self.successes[result.phase] / self.counts[result.phase]
        self.progress.update(task, advance=1, success=f"success {rate:5.1%}")

    def task_start(self, label: str, total: int | None) -> None:
        self.tasks[label] = self.progress.add_task(f"  {label}", total=total, success="")
        self.counts[label] = 0

    def task_update(self, label: str, done: int, total: int | None, note: str) -> None:
        if label in self.tasks:
            self.counts[label] = done
            self.progress.update(self.tasks[label], completed=done, total=total, success=note)

    def task_end(self, label: str, note: str) -> None:
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


class LineReporter:
    """Plain lines for logs: ``09:41:07 evaluate 120/480 (25%) success 3.3% 4m10s eta 12m30s``."""

    def __init__(self, stream: IO[str] | None = None, interval_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.lines: dict[str, _Line] = {}
        self.successes: dict[str, int] = {}
        self.counts: dict[str, int] = {}
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

    def phase(self, name: str, total: int | None, done: int) -> None:
        with self._lock:
            self.successes[name] = self.counts[name] = 0
            self.lines[name] = line = _Line(total, done)
            line.printed = time.monotonic()
            self._ensure_heartbeat()
            self._write(name, f"started: {done}/{total} episodes done" if total else "started")

    def episode(self, result: EpisodeResult) -> None:
        with self._lock:
            line = self.lines.get(result.phase)
            if line is None or not counted(result):
                return
            self.counts[result.phase] += 1
            self.successes[result.phase] += int(result.success)
            line.done += 1
            line.note = f"success {self.successes[result.phase] / self.counts[result.phase]:.1%}"
            self._maybe_print(result.phase, line, force=line.total is not None and line.done >= line.total)

    def task_start(self, label: str, total: int | None) -> None:
        with self._lock:
            self.lines[label] = line = _Line(total, 0)
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
            line = self.lines.pop(label, None)
            if line is not None:
                line.note = note or line.note
                elapsed = format_duration(time.monotonic() - line.started)
                self._write(label, f"done in {elapsed}" + (f": {line.note}" if line.note else ""))
