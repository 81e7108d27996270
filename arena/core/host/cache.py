"""What Arena builds once per machine and keeps (converted models, warm starts): the cache's
place, a build that happens at most once across processes, and the digests that name a build.
Shared by the backends and the warm start, so neither reaches into the other for them."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Written into every folder built here: where it came from, so provenance can name the source.
SOURCE_FILE = "arena_source.json"


def cache_root() -> Path:
    """``$ARENA_CACHE``, else ``~/.cache/arena``: where Arena keeps what it builds once."""
    root = os.environ.get("ARENA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "arena"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, remembered per (path, size, mtime) since the GGUF is ~100 MB."""
    stat = path.stat()
    return _file_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def read_source(folder: Path) -> dict[str, Any]:
    """The provenance record written next to a model built here (empty for other folders)."""
    path = Path(folder) / SOURCE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def build_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """Build ``folder`` at most once across processes: under a file lock, into a temporary
    sibling that is renamed into place, so a reader never sees a half-written model."""
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(folder.with_name(f".{folder.name}.lock")):
        if folder.is_dir():  # another process finished it while we waited
            return folder
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
