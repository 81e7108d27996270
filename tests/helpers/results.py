"""Results of a run made up for a report test: every field the schema asks for, with the ones
a test sets laid over it (nested mappings merged), validated as results.json would be."""

from __future__ import annotations

from typing import Any

from arena.core.contract.results import Results, validate

_PHASE = {"episodes": 0, "env_steps": 0, "llm_calls": 0, "tokens_in": 0, "tokens_out": 0, "wall_s": 0.0}
_SUMMARY = {"n_tasks": 0, "n_episodes": 0, "success_rate": 0.0, "ci95": [0.0, 0.0], "progress_rate": 0.0,
            "valid_action_rate": 0.0, "mean_steps": 0.0, "status": {}}
BASE: dict[str, Any] = {
    "schema_version": 2, "method": "m", "env": "e", "track": "frozen", "valid": True, "violations": [],
    "seeds": [0], "limited": False,
    "protocol": {"max_steps": 10, "max_invalid_actions": 10, "limit": None, "splits": ["test_seen"]},
    "solver": {"layout": "transcript", "admissible_turns": "all"},
    "splits": {"test_seen": _SUMMARY},
    "learn": {"split": "train", "splits_used": [], "used_valid_split": False, "budget": {}, "used": {}},
    "cost": {"learn": _PHASE, "evaluate": _PHASE},
    "state": {"digest_before_eval": None, "digest_after_eval": None, "memory_items": 0, "memory_bytes": 0,
              "method": {}},
    "provenance": {"arena_version": "0", "git_sha": None, "packages": {}, "machine": {}, "env_version": "1",
                   "split_hashes": {}, "model": {}, "embedder": {}, "config": {}},
    "started": None, "finished": "2026-01-01T00:00:00Z",
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) \
            and key not in ("splits",) else value
    return merged


def made_up_results(**fields: Any) -> Results:
    """Valid results with ``fields`` laid over :data:`BASE`; a split's summary is merged over an
    empty one (``splits={"test_seen": {"n_episodes": 3}}``)."""
    if "splits" in fields:
        fields = {**fields, "splits": {name: _merged(_SUMMARY, summary) for name, summary in fields["splits"].items()}}
    return validate(_merged(BASE, fields))
