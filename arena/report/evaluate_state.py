"""``arena evaluate --state RUN_DIR``: a board evaluates a submitted learned state itself.

A submitter runs learning wherever they like and hands over the run directory. The board makes a
new run directory from it, as ``arena verify`` does (config, the harness's state as learning
left it, ``store/``, ``method/``, the learning records sealed again with the board's key), with
the board's own evaluation settings laid over the config (``eval.salt`` for its own test draw,
``run.isolation``, the seeds), and resumes it: learning is skipped, the method is built from the
submitted state, which must hash to the digest the submitter's learning ended with, and the board
plays every test episode itself. Settings that would change what was learned are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import arena
from arena.core import integrity, provenance
from arena.core.rundir import CONFIG, RESULTS, STATE, RunDirError, read_json, write_json_atomic
from arena.report.runs import ReportError, load_run
from arena.report.verify import VerifyError, prepare_replay, trajectories_by_key

#: What a board may set for its evaluation (a key, or a section ending in a dot).
BOARD_SETTINGS = ("eval.salt", "eval.concurrency", "eval.splits", "run.seeds", "run.isolation",
                  "run.isolation_limits.")


class EvaluateError(ValueError):
    """The submitted run cannot be evaluated as asked (the message says why and what to do)."""


def board_overrides(overrides: list[str]) -> dict[str, Any]:
    """``key=value`` settings the board lays over the submitted config, each checked."""
    chosen: dict[str, Any] = {}
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep:
            raise EvaluateError(f"{item!r} is not key=value.")
        if not any(key == s or (s.endswith(".") and key.startswith(s)) for s in BOARD_SETTINGS):
            raise EvaluateError(f"{key} is not a board's to set: it would change what the submitted run "
                                f"learned or how it was measured. A board may set: {', '.join(BOARD_SETTINGS)}.")
        chosen[key] = OmegaConf.select(OmegaConf.from_dotlist([item]), key)
    return chosen


def evaluate_state(run_dir: Path | str, out: Path | str, overrides: list[str], *,
                   plugins: Any = None) -> tuple[Path, dict[str, Any]]:
    """Evaluate the learned state of ``run_dir`` into the new run directory ``out``."""
    from arena.core import protocol

    run_path, out = Path(run_dir), Path(out)
    settings = board_overrides(overrides)
    if out.exists():
        raise EvaluateError(f"{out} exists; the board's evaluation needs a new folder (--out).")
    if not (run_path / RESULTS).is_file():
        raise EvaluateError(f"{run_path} has no {RESULTS}: submit a finished run (its learning, at least, "
                            "must have ended; finish it with `arena run --resume`).")
    try:
        run = load_run(run_path, verification=False)
        prepare_replay(run_path, out, run.results, run.episodes or [], trajectories_by_key(run_path),
                       same_test_draw=False)
    except (ReportError, VerifyError, RunDirError, FileNotFoundError) as exc:
        raise EvaluateError(f"cannot evaluate {run_path}: {exc}") from exc
    config = OmegaConf.load(out / CONFIG)
    for key, value in settings.items():
        if OmegaConf.select(config, key, default=KeyError) is KeyError:
            raise EvaluateError(f"{key} is not a setting of {run_path}'s config.")
        OmegaConf.update(config, key, value)
    OmegaConf.save(config, out / CONFIG)
    state = read_json(out / STATE, "its state")
    state["config_sha256"] = integrity.file_sha256(out / CONFIG)
    state.setdefault("provenance", {})["evaluated_from"] = {
        "run": str(run_path.resolve()), "digest_before_eval": state.get("digest_before_eval"),
        "settings": settings, "arena_version": arena.__version__, "git_sha": provenance.git_sha()}
    write_json_atomic(out / STATE, state)
    path, results = protocol.run(None, resume=out, plugins=plugins, allow_version_change=True)
    return Path(path), results
