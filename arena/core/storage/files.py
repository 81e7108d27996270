"""Whole-file reads and writes of a run folder's JSON files, and the error every run-folder
reader raises: the ground floor under the run directory and its ledger."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from arena.core.storage.journal import disk_full_point, no_space


class RunDirError(RuntimeError):
    """The run directory is missing, incomplete or belongs to another run."""


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``, or a :class:`RunDirError` that names the file and where it
    is damaged."""
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError as exc:
        raise RunDirError(f"{path} is not text ({what} is damaged).") from exc
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path} is damaged ({what}: {exc.msg} at line {exc.lineno}, column "
                          f"{exc.colno}).") from exc
    if not isinstance(data, dict):
        raise RunDirError(f"{path} is damaged ({what} must be a JSON object, not "
                          f"{type(data).__name__}).")
    return data


_UMASK = os.umask(0)
os.umask(_UMASK)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``path`` whole or not at all: a temporary file of its own (a unique name, so two
    writers never share one), fsynced, then renamed over it."""
    descriptor, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(descriptor, 0o666 & ~_UMASK)  # as open() would make it (mkstemp: 0600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
            handle.flush()
            if disk_full_point(path.name):
                raise no_space(path.name)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def folder_bytes(path: Path) -> int:
    """The bytes of every file under ``path`` (a store's, a checkpoint's disk use)."""
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())
