"""``eval.salt``: where a procedural world's test layouts come from.

``public``: from the task ids (the splits everyone shares; committed boards use them).
``secret``: from a salt drawn for the run, kept in the run directory's ``eval_salt`` file
(mode 0600, never in config.yaml or results.json, never shown to the method), so knowing the
world's code and the public ids does not give a test room. ``env:NAME``: a board's private salt,
read from the environment variable NAME (the config names the variable, never the salt). Any
other string is a board's own named draw, public since the config records it. ``auto`` (the
default) is ``secret`` under ``run.isolation=process`` and ``public`` otherwise. results.json
records only which kind and a short digest of the salt: runs with different salts have
different test splits and never pool into one row.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from arena.core.contract.settings import Settings

SALT_FILE = "eval_salt"
PUBLIC, SECRET, AUTO = "public", "secret", "auto"


class SaltError(ValueError):
    """``eval.salt`` names a salt that is not there."""


@dataclass(frozen=True)
class EvalSalt:
    kind: str  # public, secret or board
    value: str | None = None  # None for public

    def describe(self) -> str:
        """What results.json records: the kind, and for a salt a digest that names it without
        revealing it (two runs of one salt show the same)."""
        if self.value is None:
            return PUBLIC
        return f"{self.kind}:{hashlib.sha256(self.value.encode()).hexdigest()[:16]}"


def mode_of(settings: Settings) -> str:
    """``eval.salt`` with ``auto`` resolved against ``run.isolation``."""
    mode = settings.eval.salt
    if mode == AUTO:
        return SECRET if settings.run.isolation == "process" else PUBLIC
    return mode


def resolve(settings: Settings, run_path: Path) -> EvalSalt:
    """The run's salt: none, the one this run drew (read back on ``--resume``), or the board's."""
    mode = mode_of(settings)
    if mode == PUBLIC:
        return EvalSalt(PUBLIC)
    if mode.startswith("env:"):
        name = mode[len("env:"):]
        value = os.environ.get(name, "")
        if not value:
            raise SaltError(f"eval.salt={mode} names the environment variable {name}, which is not set: "
                            f"export {name}=<the board's salt> (or use eval.salt=secret).")
        return EvalSalt("board", value)
    if mode != SECRET:
        return EvalSalt("board", mode)
    path = run_path / SALT_FILE
    kept = kept_secret(path)
    if kept:
        return EvalSalt(SECRET, kept)
    value = secrets.token_hex(16)
    keep_secret(value, path)
    return EvalSalt(SECRET, value)


def kept_secret(path: Path) -> str | None:
    """The salt kept in ``path``, or None where there is none (no file, or an empty one a
    process killed before :func:`keep_secret` wrote it left)."""
    return (path.read_text().strip() or None) if path.is_file() else None


def keep_secret(value: str, path: Path) -> None:
    """Write a salt to ``path`` (mode 0600) whole or not at all: a process killed while writing
    leaves no empty or torn salt to be read back."""
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
