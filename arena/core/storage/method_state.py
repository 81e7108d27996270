"""Each method's own place in the run directory: ``method/``, with a state file and checkpoints.

The harness owns ``state.json``; a method keeps what it must resume from in
``run.method_state`` (``method/state.json``, written atomically and covered by the step journal,
so a learning step killed mid-way puts it back), and large artefacts (adapter weights, logs) in
``run.method_state.folder``. :class:`Checkpoints` numbers a series of checkpoints there.

Every path a method hands to a harness call (a store snapshot, a checkpoint prefix) is confined to
that folder (:func:`confined`): the harness writes and deletes where it is told, with rights the
method may not have (an isolated method's sandbox grants only this folder), so a path that leaves
it (``..``, an absolute path elsewhere, a symbolic link out) is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

from arena.core.storage.rundir import read_json, write_json_atomic

FOLDER = "method"
STATE = "state.json"
#: A checkpoint series' prefix: one plain name, so its checkpoints are entries of the folder.
PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class OutsideFolder(PermissionError):
    """A path a method handed the harness leads outside the method's folder."""


def confined(folder: Path, path: str | os.PathLike[str], what: str) -> Path:
    """``path`` (relative paths are taken in ``folder``) with every symbolic link resolved,
    if that is inside ``folder``; else :class:`OutsideFolder`, naming the fix."""
    root = Path(folder).resolve()
    target = (root / path).resolve()  # an absolute path replaces root
    if target == root or root not in target.parents:
        raise OutsideFolder(
            f"{what} {os.fspath(path)!r} is outside the method's folder {root}: a method writes only "
            f"there. Pass a path inside run.method_state.folder (e.g. run.method_state.folder / 'name'), "
            "with no '..' and no link out of it.")
    return target


class Checkpoints:
    """``<folder>/checkpoint-NNNNN``: a numbered series, the newest the one to resume from."""

    def __init__(self, folder: Path, prefix: str = "checkpoint") -> None:
        if not isinstance(prefix, str) or not PREFIX.fullmatch(prefix) or ".." in prefix:
            raise OutsideFolder(
                f"Checkpoint prefix {prefix!r} is not a plain name: checkpoints are entries of the method's "
                "folder. Use letters, digits, '_', '-' and '.', e.g. run.method_state.checkpoints('adapter').")
        self.folder = folder
        self.prefix = prefix

    def path(self, number: int) -> Path:
        """Checkpoint ``number``'s folder; refused where it is a link out of the method's folder."""
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ValueError(f"A checkpoint number is a whole number from 0, not {number!r}.")
        path = self.folder / f"{self.prefix}-{number:05d}"
        confined(self.folder, path, "Checkpoint")
        return path

    def latest(self) -> int:
        """The number of the newest checkpoint (0: none). A kill may fall between saving a
        checkpoint (atomic) and the state that counts it, so this is the source of truth."""
        numbers = [int(path.name.rsplit("-", 1)[1]) for path in self.folder.glob(f"{self.prefix}-*")
                   if path.name.rsplit("-", 1)[1].isdigit()]
        return max(numbers, default=0)

    def prune(self, keep: int) -> None:
        """Delete every checkpoint older than number ``keep`` (those that exist: a number from the
        method bounds nothing). ``rmtree`` refuses a link, so nothing outside the folder goes."""
        for path in self.folder.glob(f"{self.prefix}-*"):
            number = path.name.rsplit("-", 1)[1]
            if number.isdigit() and int(number) < keep and path.name == f"{self.prefix}-{int(number):05d}":
                shutil.rmtree(path, ignore_errors=True)


class MethodState:
    """A method's resumable state (one JSON object) and folder."""

    def __init__(self, run_path: Path) -> None:
        self._folder = Path(run_path) / FOLDER
        self._lock = threading.Lock()

    @property
    def folder(self) -> Path:
        """The method's folder (made on first use)."""
        self._folder.mkdir(parents=True, exist_ok=True)
        return self._folder

    @property
    def path(self) -> Path:
        return self._folder / STATE

    def checkpoints(self, prefix: str = "checkpoint") -> Checkpoints:
        return Checkpoints(self.folder, prefix)

    def load(self, default: dict[str, Any] | None = None) -> dict[str, Any]:
        """The state last saved, or ``default`` (an empty dict) before the first save."""
        with self._lock:
            if not self.path.exists():
                return dict(default or {})
            return read_json(self.path, "the method's state")

    def save(self, state: dict[str, Any]) -> None:
        """Replace the state, atomically."""
        try:
            json.dumps(state)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"run.method_state.save takes JSON data (dicts, lists, numbers, "
                            f"strings); {exc}") from exc
        with self._lock:
            write_json_atomic(self.folder / STATE, state)

    def update(self, **changes: Any) -> dict[str, Any]:
        """Change some keys of the state; the whole new state."""
        state = self.load()
        state.update(changes)
        self.save(state)
        return state

    # -- for the harness: the step journal keeps and puts back the file's text ------------------

    def text(self) -> str | None:
        return self.path.read_text() if self.path.exists() else None

    def restore_text(self, text: str | None) -> None:
        with self._lock:
            if text is None:
                self.path.unlink(missing_ok=True)
            else:
                write_json_atomic(self.folder / STATE, json.loads(text))
