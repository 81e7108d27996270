"""A tamper-evident record: every line of ``episodes.jsonl`` chained to the one before it.

Each line carries ``chain = {prev, trajectory, hash, mac}``: ``prev`` is the previous line's
``hash`` (``GENESIS`` for the first), ``trajectory`` the SHA-256 of the episode's line in
``trajectories.jsonl``, ``hash`` the SHA-256 of ``prev`` and the line's own fields, ``mac`` an
HMAC-SHA256 of ``hash`` under a key kept outside the run directory (``record_key``). Anyone can
check the hashes (an edited, dropped, reordered or inserted line breaks the chain at that line);
only a holder of the key can check the MACs, which a forger who recomputes the hashes cannot
forge without it. ``docs/security.md`` says which threat each check stops.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
CHAIN = "chain"
#: Where the record key lives unless ``$ARENA_RECORD_KEY_FILE`` names another file.
DEFAULT_KEY_FILE = Path("~/.config/arena/record.key")


class RecordError(ValueError):
    """A run's record fails its integrity check; the message names the file and the line."""


def canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def line_hash(prev: str, record: dict[str, Any]) -> str:
    """The chain hash of one record (its ``chain`` field left out)."""
    fields = {k: v for k, v in record.items() if k != CHAIN}
    return hashlib.sha256(prev.encode() + b"\n" + canonical(fields)).hexdigest()


def key_file() -> Path:
    return Path(os.environ.get("ARENA_RECORD_KEY_FILE") or DEFAULT_KEY_FILE).expanduser()


def record_key(create: bool = True) -> bytes | None:
    """This machine's record key (created, mode 0600, on first use); None where it cannot be
    read or made (a read-only home): records are then chained but carry no MAC."""
    path = key_file()
    try:
        if path.is_file():
            return bytes.fromhex(path.read_text().strip())
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(key.hex() + "\n")
        return key
    except FileExistsError:  # another process made it first
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        return None


def key_id(key: bytes | None) -> str | None:
    """A public name of a key (not the key): which key signed a record."""
    return None if key is None else hashlib.sha256(b"arena-record-key\n" + key).hexdigest()[:16]


def mac(key: bytes, chain_hash: str) -> str:
    return hmac.new(key, chain_hash.encode(), hashlib.sha256).hexdigest()


def seal(record: dict[str, Any], prev: str, trajectory_line: bytes, key: bytes | None) -> dict[str, Any]:
    """``record`` with its ``chain`` field, linked to the line whose hash is ``prev``."""
    chain_hash = line_hash(prev, record)
    return {**record, CHAIN: {
        "prev": prev,
        "trajectory": hashlib.sha256(trajectory_line).hexdigest(),
        "hash": chain_hash,
        "mac": None if key is None else mac(key, chain_hash),
    }}


@dataclass
class ChainReport:
    """What a check of ``episodes.jsonl`` found."""

    lines: int
    head: str  # the last line's hash (GENESIS for an empty file)
    chained: bool  # False: a record from before chaining (no line carries a chain)
    macs_checked: bool  # the local key signed it and every MAC was checked


def verify(episodes: list[dict[str, Any]], path: Path | str, *,
           trajectories: list[bytes] | None = None, key: bytes | None = None,
           expected_key_id: str | None = None, breaks: set[str] | None = None) -> ChainReport:
    """Check the chain of ``episodes`` (the parsed lines of ``path``); raise
    :class:`RecordError` naming the first bad line. ``trajectories`` (the raw lines of
    ``trajectories.jsonl``, in order) are checked against each line's ``trajectory`` hash;
    MACs are checked when ``key`` is the one that signed the record (``expected_key_id``).
    ``breaks``: hashes of lines that follow a damaged line moved aside by a repair; their link
    to the line before is not checked (their own hash and MAC are)."""
    if not any(CHAIN in line for line in episodes):
        return ChainReport(len(episodes), GENESIS, chained=False, macs_checked=False)
    check_macs = key is not None and expected_key_id is not None and key_id(key) == expected_key_id
    by_trajectory = None
    if trajectories is not None:
        by_trajectory = {hashlib.sha256(raw).hexdigest() for raw in trajectories}
    prev = GENESIS
    for number, record in enumerate(episodes, start=1):
        chain = record.get(CHAIN)
        where = f"{path}, line {number}"
        if not isinstance(chain, dict):
            raise RecordError(f"{where} carries no chain while the lines around it do: a line was "
                              "added or edited outside Arena. The record cannot be trusted.")
        after_hole = chain.get("hash") in (breaks or set())
        if chain.get("prev") != prev and not after_hole:
            raise RecordError(f"{where} does not follow the line before it (a line was dropped, "
                              "inserted or reordered). The record cannot be trusted.")
        if chain.get("hash") != line_hash(str(chain.get("prev")) if after_hole else prev, record):
            raise RecordError(f"{where} was changed after it was written (its hash does not "
                              "match). The record cannot be trusted.")
        if check_macs and (not isinstance(chain.get("mac"), str)
                           or not hmac.compare_digest(chain["mac"], mac(key, chain["hash"]))):  # type: ignore[arg-type]
            raise RecordError(f"{where} is not signed by this machine's record key (its MAC "
                              "does not match): the record was rewritten. It cannot be trusted.")
        if by_trajectory is not None and chain.get("trajectory") not in by_trajectory:
            raise RecordError(f"{where}: its trajectory in trajectories.jsonl is missing or "
                              "changed. The record cannot be trusted.")
        prev = chain["hash"]
    return ChainReport(len(episodes), prev, chained=True, macs_checked=check_macs)


def file_sha256(path: Path | str) -> str | None:
    """SHA-256 of a file's bytes; None if it does not exist."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def tree_sha256(folder: Path | str) -> str:
    """SHA-256 over a folder's files (relative path and bytes, in path order); "empty" for none."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    if not files:
        return "empty"
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
