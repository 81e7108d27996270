"""``verification.json``: what ``arena verify`` found about a run, signed with this machine's
record key, and read back by every report (apart from the replay itself, so that reading a run
never imports the machinery that verifies it)."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

from arena.core.storage import integrity
from arena.core.storage.files import RunDirError, read_json, write_json_atomic

VERIFICATION = "verification.json"
VERIFIED, UNVERIFIED, UNVERIFIABLE = "verified", "unverified", "unverifiable"
#: ``arena verify``'s exit status for each outcome.
EXIT_CODES = {VERIFIED: 0, UNVERIFIED: 1, UNVERIFIABLE: 3}


class VerifyError(RuntimeError):
    """The run cannot be verified (an outcome of its own: :data:`UNVERIFIABLE`)."""


def _digest(data: dict[str, Any]) -> str:
    fields = {k: v for k, v in data.items() if k not in ("mac", "key_id")}
    return hashlib.sha256(integrity.canonical(fields)).hexdigest()


def write_verification(run_path: Path, data: dict[str, Any]) -> Path:
    """Write ``verification.json`` (signed with this machine's record key where there is one)."""
    key = integrity.record_key()
    signed = {**data, "key_id": integrity.key_id(key),
              "mac": None if key is None else integrity.mac(key, _digest(data))}
    path = run_path / VERIFICATION
    write_json_atomic(path, signed)
    return path


def read_verification(run_path: Path, record_head: str | None) -> dict[str, Any] | None:
    """The run's verification.json, or None where it has none or where it is of another record
    (a stale or copied file). A MAC that does not match where this machine holds the key that
    signed it raises :class:`VerifyError`: the file was edited."""
    path = Path(run_path) / VERIFICATION
    if not path.is_file():
        return None
    try:
        data = read_json(path, "its verification")
    except RunDirError as exc:
        raise VerifyError(str(exc)) from exc
    key = integrity.record_key(create=False)
    if key is not None and data.get("key_id") == integrity.key_id(key):
        given = data.get("mac")
        if not isinstance(given, str) or not hmac.compare_digest(given, integrity.mac(key, _digest(data))):
            raise VerifyError(f"{path} was changed after `arena verify` wrote it (its MAC does "
                              "not match). Run `arena verify` again.")
    if data.get("record_head") != record_head or data.get("status") not in EXIT_CODES:
        return None
    return data
