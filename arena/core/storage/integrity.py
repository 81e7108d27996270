"""A tamper-evident record: every line of ``episodes.jsonl`` chained to the one before it.

Each line carries ``chain = {prev, trajectory, hash, mac}``: ``prev`` is the previous line's
``hash`` (``GENESIS`` for the first), ``trajectory`` the SHA-256 of the episode's line in
``trajectories.jsonl``, ``hash`` the SHA-256 of ``prev`` and the line's own fields, ``mac`` an
HMAC-SHA256 of ``hash`` under a key kept outside the run directory (``record_key``). Anyone can
check the hashes (an edited, dropped, reordered or inserted line breaks the chain at that line);
only a holder of the key can check the MACs, which a forger who recomputes the hashes cannot
forge without it. ``docs/security.md`` says which threat each check stops.

The harness's violations are lines of the same chain, kept in ``violations.jsonl`` (a line
``{"violation": message, "chain": {prev, hash, mac}}``, linked to the episode line or violation
before it): results.json's head covers both files, so a violation cannot be dropped without
breaking the chain, and ``--resume`` rebuilds the run's violations from it, not from state.json.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
CHAIN = "chain"
#: The field of a violation line (``violations.jsonl``): the harness's message.
VIOLATION = "violation"
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
        # Written whole beside it, then linked into place: a process starting at the same moment
        # reads a whole key or none (a key file created empty and then written was read empty).
        def write(target: Path, flags: int) -> None:
            with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | flags, 0o600), "w") as handle:
                handle.write(key.hex() + "\n")

        written = path.with_name(f".{path.name}.{os.getpid()}.new")
        try:
            write(written, os.O_TRUNC)
            try:
                os.link(written, path)
            except FileExistsError:
                raise
            except OSError:
                write(path, os.O_EXCL)  # a filesystem without hard links: made in place, as before
        finally:
            written.unlink(missing_ok=True)
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


def seal(record: dict[str, Any], prev: str, trajectory_line: bytes | None,
         key: bytes | None) -> dict[str, Any]:
    """``record`` with its ``chain`` field, linked to the line whose hash is ``prev``
    (``trajectory_line`` None: a line without a trajectory, a violation's)."""
    chain_hash = line_hash(prev, record)
    chain: dict[str, Any] = {"prev": prev}
    if trajectory_line is not None:
        chain["trajectory"] = hashlib.sha256(trajectory_line).hexdigest()
    chain.update(hash=chain_hash, mac=None if key is None else mac(key, chain_hash))
    return {**record, CHAIN: chain}


def seal_violation(message: str, prev: str, key: bytes | None) -> dict[str, Any]:
    """A violation's line of ``violations.jsonl``, linked to the line whose hash is ``prev``."""
    return seal({VIOLATION: message}, prev, None, key)


def check_line(record: dict[str, Any], where: str, key: bytes | None) -> None:
    """One line's own hash (and MAC, where ``key`` signed it), not its link to the line before:
    what can be checked of a violation line before the episodes are read."""
    chain = record.get(CHAIN)
    if not isinstance(chain, dict) or chain.get("hash") != line_hash(str(chain.get("prev")), record):
        raise RecordError(f"{where} was changed after it was written (its hash does not match). "
                          "The record cannot be trusted.")
    if key is not None and (not isinstance(chain.get("mac"), str)
                            or not hmac.compare_digest(chain["mac"], mac(key, chain["hash"]))):
        raise RecordError(f"{where} is not signed by this machine's record key (its MAC does not "
                          "match): the record was rewritten. It cannot be trusted.")


@dataclass
class ChainReport:
    """What a check of ``episodes.jsonl`` found."""

    lines: int  # episode lines
    head: str  # the last line's hash (GENESIS for an empty file)
    chained: bool  # False: a record from before chaining (no line carries a chain)
    macs_checked: bool  # the local key signed every line and every MAC was checked
    #: The violations on record (violations.jsonl), in the chain's order.
    violations: list[str] = field(default_factory=list)
    #: The hash of every line, in the chain's order (a report finds results.json's head in it).
    hashes: list[str] = field(default_factory=list)
    #: Whether each line of ``hashes`` is an episode's (False: a violation's).
    is_episode: list[bool] = field(default_factory=list)


def _chain_hash(line: dict[str, Any] | None) -> Any:
    chain = None if line is None else line.get(CHAIN)
    return chain.get("hash") if isinstance(chain, dict) else None


def _follows(line: dict[str, Any] | None, prev: str) -> bool:
    chain = None if line is None else line.get(CHAIN)
    return isinstance(chain, dict) and chain.get("prev") == prev


def in_chain_order(episodes: list[dict[str, Any]], violations: list[dict[str, Any]],
                   breaks: set[str]) -> list[tuple[bool, int, dict[str, Any]]]:
    """(is an episode line, its line number in its file, the line) of both files, in the order
    their chain links them: each file keeps its own order, and the next line is the one whose
    ``prev`` is the last line's hash (a line after a repaired hole, listed in ``breaks``, where
    neither follows). Lines that link nowhere come in file order, for :func:`verify` to name."""
    ordered: list[tuple[bool, int, dict[str, Any]]] = []
    i = j = 0
    prev = GENESIS
    while i < len(episodes) or j < len(violations):
        episode = episodes[i] if i < len(episodes) else None
        violation = violations[j] if j < len(violations) else None
        if violation is not None and (_follows(violation, prev) or episode is None or (
                not _follows(episode, prev) and _chain_hash(episode) not in breaks
                and _chain_hash(violation) in breaks)):
            ordered.append((False, j + 1, violation))
            j += 1
        else:
            ordered.append((True, i + 1, episode))  # type: ignore[arg-type]  # i < len(episodes)
            i += 1
        prev = str(_chain_hash(ordered[-1][2]))
    return ordered


def verify(episodes: list[dict[str, Any]], path: Path | str, *,
           trajectories: list[bytes] | None = None, key: bytes | None = None,
           expected_key_id: str | None = None, breaks: set[str] | None = None,
           violations: list[dict[str, Any]] | None = None,
           violations_path: Path | str | None = None, macs_after: str | None = None) -> ChainReport:
    """Check the chain of ``episodes`` (the parsed lines of ``path``) and ``violations`` (those
    of ``violations_path``: one chain over both files); raise :class:`RecordError` naming the
    first bad line. ``trajectories`` (the raw lines of ``trajectories.jsonl``, in order) are
    checked against each episode line's ``trajectory`` hash; MACs are checked when ``key`` is
    the one that signed the record (``expected_key_id``). ``breaks``: hashes of lines that
    follow a damaged line moved aside by a repair; their link to the line before is not checked
    (their own hash and MAC are). ``macs_after``: the record moved to the signing key at this
    line (its hash; GENESIS: before the first line): only the lines after it carry that key's
    MACs, the lines before are checked by their hashes alone (:class:`RecordMove`)."""
    violations = violations or []
    if not violations and not any(CHAIN in line for line in episodes):
        return ChainReport(len(episodes), GENESIS, chained=False, macs_checked=False)
    check_macs = key is not None and expected_key_id is not None and key_id(key) == expected_key_id
    by_trajectory = None
    if trajectories is not None:
        by_trajectory = {hashlib.sha256(raw).hexdigest() for raw in trajectories}
    both = " (episodes.jsonl and violations.jsonl are one chain)" if violations else ""
    report = ChainReport(len(episodes), GENESIS, chained=True,
                         macs_checked=check_macs and macs_after in (None, GENESIS))
    prev = GENESIS
    signed = macs_after is None or macs_after == GENESIS  # the lines so far carry the key's MACs
    for is_episode, number, record in in_chain_order(episodes, violations, breaks or set()):
        chain = record.get(CHAIN)
        where = f"{path if is_episode else violations_path}, line {number}"
        if not isinstance(chain, dict):
            raise RecordError(f"{where} carries no chain while the lines around it do: a line was "
                              "added or edited outside Arena. The record cannot be trusted.")
        after_hole = chain.get("hash") in (breaks or set())
        if chain.get("prev") != prev and not after_hole:
            raise RecordError(f"{where} does not follow the line before it (a line was dropped, "
                              f"inserted or reordered{both}). The record cannot be trusted.")
        if chain.get("hash") != line_hash(str(chain.get("prev")) if after_hole else prev, record):
            raise RecordError(f"{where} was changed after it was written (its hash does not "
                              "match). The record cannot be trusted.")
        if check_macs and signed and (not isinstance(chain.get("mac"), str)
                           or not hmac.compare_digest(chain["mac"], mac(key, chain["hash"]))):  # type: ignore[arg-type]
            raise RecordError(f"{where} is not signed by this machine's record key (its MAC "
                              "does not match): the record was rewritten. It cannot be trusted.")
        if not is_episode and not isinstance(record.get(VIOLATION), str):
            raise RecordError(f"{where} is not a violation's line. The record cannot be trusted.")
        if is_episode and by_trajectory is not None and chain.get("trajectory") not in by_trajectory:
            raise RecordError(f"{where}: its trajectory in trajectories.jsonl is missing or "
                              "changed. The record cannot be trusted.")
        if not is_episode:
            report.violations.append(str(record[VIOLATION]))
        prev = chain["hash"]
        signed = signed or prev == macs_after
        report.hashes.append(prev)
        report.is_episode.append(is_episode)
    if not signed:
        raise RecordError(f"{path}: the line where the record moved to this key ({str(macs_after)[:12]}...) is not "
                          "in the chain. The record cannot be trusted.")
    report.head = prev
    return report


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
