"""``run.continue_from``: a second learning phase that starts from a finished run's learned state.

A run learns from nothing. A continued run starts its learning from what another run of the same
method learned (its ``store/`` and ``method/``, copied before the method is built), with a budget
of its own, possibly on a changed world: the second learning phase of ``arena experiment conflict``,
where a rule learned first is contradicted by what the world teaches later. Its results record
the run and the learned-state digest it continued from (``learn.continued_from``), and a board
ranks it apart: it learned twice.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from arena.core.contract.settings import Settings
from arena.core.services.fine_tune import mark_inherited
from arena.core.storage.ledger import Ledger
from arena.core.storage.method_state import FOLDER
from arena.core.storage.rundir import CONFIG, RESULTS, RunDir, RunDirError, read_results

if TYPE_CHECKING:
    from arena.core.contract.run_api import Run

#: What a run learned, in its folder: the experience store and the method's own state.
LEARNED_STATE = ("store", "method")
#: What the learned state was learned with and is read by: a continued run keeps them (the
#: store's vectors are this embedder's; the method's adapters, this model's).
WARM_START = "llm.warmstart"
SAME_LEARNER = ("llm.model", WARM_START, "embedder.name")


#: Why an experiment's arm is nobody's source (a continued run's, an evaluation's, an experiment's).
AN_ARM = ("is an arm of `arena experiment` (its experience was replaced, poisoned or evaluated with "
          "another model or world)")


def is_experiment_arm(run_path: Path) -> bool:
    """Whether the run in ``run_path`` is an arm of ``arena experiment`` (its results or its
    state carry the arm's mark)."""
    marked = (run_path / RESULTS).is_file() and read_results(run_path).experiment
    return bool(marked) or Ledger(run_path).read().experiment is not None


def source_of(cfg: DictConfig) -> Path | None:
    """``run.continue_from`` as a path, or None for a run that learns from nothing."""
    value = cfg.run.get("continue_from")
    return Path(str(value)) if value else None


def links_in_learned_state(run_path: Path) -> list[str]:
    """The symbolic links in a run's learned state (none in a run's own files): a copy would
    bring in what they point to, the board's signing key say, where the method can read it."""
    return [str(path) for name in LEARNED_STATE for path in [run_path / name, *(run_path / name).rglob("*")]
            if path.is_symlink()]


def check_source(source: Path, cfg: DictConfig, target: RunDir, remaking: bool = False) -> dict[str, Any]:
    """What the continued run starts from, checked: a finished, valid, frozen run of the same
    method and learner whose learning ended with a recorded digest, and not the new run's own
    folder (nor one holding a run already: its state would be replaced before the folder is
    refused; ``remaking``: the run was killed between its config and its first state)."""
    where = f"run.continue_from={source}"
    if target.path.resolve() == source.resolve() or source.resolve() in target.path.resolve().parents:
        raise RunDirError(f"{where} is the new run's own folder (--out): give the continued run a new one.")
    if not remaking and (target.ledger.exists() or any((target.path / name).exists() for name in (CONFIG, RESULTS))):
        raise RunDirError(f"{target.path} already holds a run: give the continued run a new --out.")
    if not (source / RESULTS).is_file() or not (source / CONFIG).is_file():
        raise RunDirError(f"{where} is not a finished run (no {RESULTS}): continue from a run "
                          "whose learning and evaluation ended (finish it with `arena run --resume`).")
    results = read_results(source)
    state = Ledger(source).read()
    method = Settings.of(cfg).method.name
    if results.method != method:
        raise RunDirError(f"{where} is a run of method '{results.method}', not '{method}': a "
                          "method continues from what it learned itself.")
    if results.track != "frozen":
        raise RunDirError(f"{where} ran the {results.track} track: its state kept learning on "
                          "the test splits. Continue from a frozen run.")
    if not results.valid:
        raise RunDirError(f"{where} is invalid ({'; '.join(results.violations)[:300]}): "
                          "continue from a valid run.")
    if is_experiment_arm(source):
        raise RunDirError(f"{where} {AN_ARM}: continue from the run it was made from.")
    source_cfg = OmegaConf.load(source / CONFIG)
    model = results.provenance.model
    # A backend that records its weights records its warm start too (none: no warm start): the
    # served one is compared with it once the model is loaded (check_same_warm_start), by its
    # adapter's digest rather than by a path that depends on the folder the run was started in.
    warm_start_known = bool(model.get("weights_sha256"))
    changed = [key for key in SAME_LEARNER if not (key == WARM_START and warm_start_known)
               and _learner_value(OmegaConf.select(source_cfg, key)) != _learner_value(OmegaConf.select(cfg, key))]
    if changed:
        learned_with = ", ".join(f"{key}={OmegaConf.select(source_cfg, key)}" for key in changed)
        raise RunDirError(f"{where} learned with {learned_with}; "
                          "its learned state is read by that model and embedder only. Pass the "
                          f"same {', '.join(changed)} (or learn from nothing).")
    linked = links_in_learned_state(source)
    if linked:
        raise RunDirError(f"{where} holds symbolic links in its learned state ({', '.join(linked[:3])}): "
                          "a learned state is the run's own files. Continue from a run that has no links.")
    from arena.core.rl.checkpointed import slimmed_checkpoints

    slimmed = slimmed_checkpoints(source)
    if slimmed:
        raise RunDirError(f"{where} was slimmed (`arena slim`: {slimmed[0]} keeps no optimizer state): it can "
                          "be evaluated, not learn further. Continue from the run's full copy.")
    digest = state.digest_before_eval
    if not state.learn_done or not digest or digest != state.digest_after_eval:
        raise RunDirError(f"{where} does not record a learned state its evaluation kept unchanged "
                          "(digest_before_eval = digest_after_eval): there is nothing to continue from.")
    return {"run": str(source.resolve()), "digest": digest, "env": results.env,
            "learn_used": dict(results.learn.used),
            **({"warmstart_adapter_sha256": (model.get("warmstart") or {}).get("adapter_sha256")}
               if warm_start_known else {})}


def check_same_warm_start(started_from: Mapping[str, Any], served_model: Mapping[str, Any]) -> None:
    """A continued run's served warm start (``LLMBackend.describe()``) must be the one its source
    learned on: the learned state is read by that model only."""
    if "warmstart_adapter_sha256" not in started_from:
        return  # the source's backend recorded no weights: its config's llm.warmstart was compared
    learned_on = started_from["warmstart_adapter_sha256"]
    served = (served_model.get("warmstart") or {}).get("adapter_sha256")
    if served != learned_on:
        def named(digest: Any) -> str:
            return f"the warm start with adapter {str(digest)[:12]}" if digest else "no warm start"
        raise RunDirError(f"run.continue_from={started_from['run']} learned on {named(learned_on)}; this "
                          f"run serves {named(served)}. Pass the source's llm.warmstart (the same "
                          "built folder or recipe), or learn from nothing.")


def _learner_value(value: Any) -> Any:
    """A learner setting as compared: a folder as its resolved path (relative to the working
    folder: a source whose backend records no weights has nothing better to go by)."""
    if isinstance(value, str) and ("/" in value or Path(value).exists()):
        return str(Path(value).resolve())
    return value


def seed_learned_state(source: Path, target: Path) -> None:
    """Copy ``source``'s learned state into the new run folder ``target`` (replacing a copy an
    interrupted start left there)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in LEARNED_STATE:
        shutil.rmtree(target / name, ignore_errors=True)
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name)
    mark_inherited(target / FOLDER)  # the source's fine-tunes: served, never taken for a rerun of this run's


def begin_learning_phase(run: Run, state: dict[str, Any], reset: Mapping[str, Any]) -> int:
    """The learning phase of this run, for a method that keeps its progress in ``state`` (its
    ``run.method_state``): 0 for a run that learns from nothing; on a continued run, one more than
    the phase of the run it continues from, whose state was copied. The first time, ``reset`` is
    laid over ``state`` (the method's progress starts again, what it learned stays) and saved."""
    source = run.cfg.run.get("continue_from")
    if source and state.get("continued_from") != str(source):
        state.update(copy.deepcopy(dict(reset)), continued_from=str(source), phase=int(state.get("phase", 0)) + 1)
        run.method_state.save(state)
    return int(state.get("phase", 0))
