"""Exactly-once learning steps: a learning step (or an online test step) commits whole or not at
all.

A step is: the episode played, ``extract``, ``update`` (which may write the store, state.json
and the method's state file), the episode's record. Before ``extract`` the harness writes the
step's journal (``step.journal``: the episode, those two files as they were), and before every
store write the rows it
is about to change (the store's ``before_write``); each line is fsynced before the change it
guards. The episode's record commits the step; the journal is then removed. A run killed inside
the window resumes by putting the store rows and the files back as the journal has them and
doing the step again from its recorded episode (not a new one), so ``update`` is applied exactly
once. Killed after the record, the journal is simply dropped.

What the journal covers is where Arena keeps a method's state: the store and
``run.method_state`` (``method/state.json``). Other files a method writes in its folder are the
method's to keep consistent (checkpoints written atomically).
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arena.core.contract.types import Trajectory

JOURNAL = "step.journal"
#: ``ARENA_CRASH_AT=point:N`` ends the process (as kill -9 would: no cleanup) the N-th time it
#: reaches ``point``: the fault injection of the exactly-once tests, nothing else reads it.
CRASH_ENV = "ARENA_CRASH_AT"
_reached: dict[str, int] = {}


def _nth_time(variable: str, name: str) -> bool:
    """Whether the environment variable ``variable`` (``name:N``) names this, the N-th time the
    process reaches ``name``: the tests' fault injection."""
    wanted = os.environ.get(variable)
    if not wanted:
        return False
    point, _, count = wanted.partition(":")
    if point != name:
        return False
    key = f"{variable}:{name}"
    _reached[key] = _reached.get(key, 0) + 1
    return _reached[key] == int(count or 1)


def crash_point(name: str) -> None:
    """A place inside a step's window where a test may kill the process."""
    if _nth_time(CRASH_ENV, name):
        os._exit(137)


#: ``ARENA_DISK_FULL_AT=file:N``: the N-th write of ``file`` (episodes.jsonl, state.json, ...)
#: fails as on a full disk, half written: the full-disk tests' fault injection.
DISK_FULL_ENV = "ARENA_DISK_FULL_AT"


def disk_full_point(name: str) -> bool:
    """Whether this write of ``name`` is the one a test has fail as on a full disk."""
    return _nth_time(DISK_FULL_ENV, name)


def no_space(name: str) -> OSError:
    return OSError(errno.ENOSPC, f"No space left on device (writing {name})")


@dataclass
class PendingStep:
    """A step the journal holds: its record key, its episode, and what to put back."""

    key: tuple
    trajectory: Trajectory
    #: Each file the step may change (a path in the run directory), as it was: None, absent.
    files: dict[str, str | None]
    undo: list[dict[str, Any]] = field(default_factory=list)


class StepJournal:
    """The journal file of one run directory."""

    def __init__(self, run_path: Path) -> None:
        self.path = Path(run_path) / JOURNAL

    def begin(self, key: tuple, trajectory: Trajectory, files: dict[str, str | None]) -> None:
        self.path.write_text("")  # a new step: nothing of an older one is left
        self._append({"key": list(key), "trajectory": trajectory.to_dict(), "files": files})

    def undo(self, rows: dict[str, Any]) -> None:
        """The store rows a write is about to change (durable before the write happens)."""
        self._append({"undo": rows})

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def pending(self) -> PendingStep | None:
        """The step the journal holds, if any (a torn last line was never acted on)."""
        if not self.path.exists():
            return None
        lines = self.path.read_bytes().split(b"\n")
        entries = []
        for raw in lines[:-1]:  # the part after the last newline is torn: its change never ran
            entries.append(json.loads(raw))
        if not entries or "key" not in entries[0]:
            return None
        head = entries[0]
        return PendingStep(tuple(head["key"]), Trajectory.from_dict(head["trajectory"]), head["files"],
                           [entry["undo"] for entry in entries[1:] if "undo" in entry])

    def _append(self, entry: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(entry, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
