"""Each method's own place in the run directory: ``method/``, with a state file and checkpoints.

The harness owns ``state.json``; a method keeps what it must resume from in
``run.method_state`` (``method/state.json``, written atomically and covered by the step journal,
so a learning step killed mid-way puts it back), and large artefacts (adapter weights, logs) in
``run.method_state.folder``. :class:`Checkpoints` numbers a series of checkpoints there.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

from arena.core.rundir import read_json, write_json_atomic

FOLDER = "method"
STATE = "state.json"


class Checkpoints:
    """``<folder>/checkpoint-NNNNN``: a numbered series, the newest the one to resume from."""

    def __init__(self, folder: Path, prefix: str = "checkpoint") -> None:
        self.folder = folder
        self.prefix = prefix

    def path(self, number: int) -> Path:
        return self.folder / f"{self.prefix}-{number:05d}"

    def latest(self) -> int:
        """The number of the newest checkpoint (0: none). A kill may fall between saving a
        checkpoint (atomic) and the state that counts it, so this is the source of truth."""
        numbers = [int(path.name.rsplit("-", 1)[1]) for path in self.folder.glob(f"{self.prefix}-*")
                   if path.name.rsplit("-", 1)[1].isdigit()]
        return max(numbers, default=0)

    def prune(self, keep: int) -> None:
        """Delete every checkpoint older than number ``keep``."""
        for older in range(keep):
            shutil.rmtree(self.path(older), ignore_errors=True)


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
