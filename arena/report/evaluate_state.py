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

import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

import arena
from arena.core.contract.results import Results
from arena.core.host import provenance
from arena.core.protocol.continuation import AN_ARM, is_experiment_arm
from arena.core.services.progress import Reporter
from arena.core.storage import integrity
from arena.core.storage.ledger import ExperimentMark, Ledger, ModelChange
from arena.core.storage.rundir import CONFIG, RESULTS, RunDirError
from arena.report.runs import ReportError, load_run
from arena.report.verify import VerifyError, prepare_replay, trajectories_by_key

#: What a board may set for its evaluation (a key, or a section ending in a dot).
BOARD_SETTINGS = ("eval.salt", "eval.concurrency", "eval.splits", "run.seeds", "run.isolation",
                  "run.isolation_limits.")
#: The one ``eval.experience`` setting a board may add: the memory reset (the papers' control for
#: a memory method, the learned state evaluated with no experience shown). Its run is a row of its
#: own on the board, paired with the row it was made from (arena/report/aggregate.py).
MEMORY_RESET = "eval.experience.source=none"


#: State keys the harness writes for an experiment's arm only (what it poisoned, the model it
#: changed to, the arm's mark); a learned state handed over for evaluation carries none of them.
HARNESS_ONLY_STATE = ("poisoning", "poisoned", "model_changed", "experiment")


class EvaluateError(ValueError):
    """The submitted run cannot be evaluated as asked (the message says why and what to do)."""


def board_overrides(overrides: list[str] | tuple[str, ...], allowed: tuple[str, ...] = BOARD_SETTINGS,
                    what: str = "a board's") -> dict[str, Any]:
    """``key=value`` settings laid over the submitted config, each checked against ``allowed``
    (a key, or a section ending in a dot)."""
    chosen: dict[str, Any] = {}
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep:
            raise EvaluateError(f"{item!r} is not key=value.")
        if not any(key == s or (s.endswith(".") and key.startswith(s)) for s in allowed):
            raise EvaluateError(f"{key} is not {what} to set: it would change what the submitted run "
                                f"learned or how it was measured. It may set: {', '.join(allowed)}.")
        value = OmegaConf.select(OmegaConf.from_dotlist([item]), key)
        chosen[key] = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
    return chosen


def evaluate_state(run_dir: Path | str, out: Path | str, overrides: list[str], *,
                   plugins: Any = None, reporter: Reporter | None = None) -> tuple[Path, Results]:
    """Evaluate the learned state of ``run_dir`` into the new run directory ``out``."""
    run_path, out = Path(run_dir), Path(out)
    settings = board_overrides([item for item in overrides if item != MEMORY_RESET])
    if MEMORY_RESET in overrides:
        key, _, value = MEMORY_RESET.partition("=")
        settings[key] = value
    # eval.experience may be absent from the config of a run made before it existed.
    prepare_evaluation(run_path, out, settings, record_as="evaluated_from", new_keys=("eval.experience.",))
    return finish_evaluation(out, plugins, reporter)


def prepare_evaluation(run_path: Path, out: Path, settings: dict[str, Any], *, record_as: str,
                       new_keys: tuple[str, ...] = (), experiment: ExperimentMark | None = None) -> None:
    """The new run directory ``out``: ``run_path``'s learned state with ``settings`` laid over
    its config, ready to resume into evaluation. ``record_as`` names the provenance entry that
    says where it came from; keys under a prefix in ``new_keys`` may be absent from the source's
    config (settings added to Arena after it ran)."""
    if out.exists():
        raise EvaluateError(f"{out} exists; the board's evaluation needs a new folder (--out).")
    if not (run_path / RESULTS).is_file():
        raise EvaluateError(f"{run_path} has no {RESULTS}: submit a finished run (its learning, at least, "
                            "must have ended; finish it with `arena run --resume`).")
    # Made beside ``out`` and renamed into place: a process killed while making it leaves no
    # folder that looks like a run whose settings were laid over (its config and state written,
    # the settings not yet).
    partial = out.with_name(f".{out.name}.partial")
    if partial.is_symlink():
        partial.unlink()
    shutil.rmtree(partial, ignore_errors=True)
    try:
        run = load_run(run_path, verification=False)
        if is_experiment_arm(run_path):
            raise EvaluateError(f"{run_path} {AN_ARM}: evaluate the run it was made from.")
        prepare_replay(run_path, partial, run.results, run.episodes or [], trajectories_by_key(run_path),
                       same_test_draw=False)
    except (ReportError, VerifyError, RunDirError, FileNotFoundError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise EvaluateError(f"cannot evaluate {run_path}: {exc}") from exc
    config = OmegaConf.load(partial / CONFIG)
    for key, value in settings.items():
        if OmegaConf.select(config, key, default=KeyError) is KeyError \
                and not any(key.startswith(prefix) for prefix in new_keys):
            shutil.rmtree(partial)
            raise EvaluateError(f"{key} is not a setting of {run_path}'s config.")
        OmegaConf.update(config, key, value, force_add=True)
    OmegaConf.save(config, partial / CONFIG)
    ledger = Ledger(partial)
    # A submitted state.json may not plant what only an arm's harness writes (poison, a change
    # of model, an experiment's mark).
    state = ledger.read().model_copy(update=dict.fromkeys(HARNESS_ONLY_STATE))
    made_from = {"run": str(run_path.resolve()), "digest_before_eval": state.digest_before_eval,
                 "settings": settings, "arena_version": arena.__version__, "git_sha": provenance.git_sha()}
    state = state.model_copy(update={"config_sha256": integrity.file_sha256(partial / CONFIG),
                                     "provenance": {**state.provenance, record_as: made_from},
                                     "experiment": experiment})
    model_settings = {key: value for key, value in settings.items() if key.startswith("llm.")}
    if model_settings:  # evaluated with another model: its weights digest replaces the source's
        weights = run.model.get("weights_sha256")
        if weights is None:  # "" (a served API's, the fake's): no weights to tell apart
            shutil.rmtree(partial)
            raise EvaluateError(f"{run_path}'s results do not record its model's weights digest "
                                "(provenance.model.weights_sha256), so its learned state cannot be "
                                "checked under another model. Run it again with this Arena.")
        # The method's own files (checkpoints, adapters) were covered by the weights' digest;
        # the rebase compares them with the source's instead.
        change = ModelChange(from_weights_sha256=weights, settings=model_settings, rebased=False,
                             method_files_sha256=integrity.tree_sha256(partial / "method"))
        state = state.model_copy(update={"model_changed": change})
    ledger.made_from(state)
    partial.rename(out)


def finish_evaluation(out: Path, plugins: Any = None,
                      reporter: Reporter | None = None) -> tuple[Path, Results]:
    """Resume the prepared (or interrupted) evaluation in ``out`` to its end."""
    from arena.core import protocol

    path, results = protocol.run(None, resume=out, plugins=plugins, allow_version_change=True,
                                 reporter=reporter)
    return Path(path), results
