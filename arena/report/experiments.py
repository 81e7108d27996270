"""``arena experiment NAME RUN_DIR``: the experiments papers make claims with, over a finished run.

Each experiment evaluates the run's learned state again, once per *arm*, each arm a run directory
of its own under ``--out`` (made as ``arena evaluate --state`` makes one: learning is not rerun,
the state must hash to what learning ended with, the harness plays every test episode). The arms
differ from their control in one factor only, which the harness applies:

* ``relevance``: ``own`` (what the method retrieves for the task: control), ``other_type`` (what it
  would retrieve for a test task of another type) and ``none`` (``eval.experience.source``);
* ``poison``: the store with a share of poison items, ``poison-0`` the clean control
  (``eval.experience.poison``);
* ``stale``: the learned world and a changed one (``--change env.KEY=VALUE``: household's
  ``env.dialect=put``, ALFWorld's earlier ``put X in/on Y`` for ``move X to Y``), each with and
  without the experience: the drop, and whether stale experience still helps;
* ``transfer``: another model (``--model llm.KEY=VALUE ...``) with the learned experience (``with``)
  beside the same model without it (``without``: control). The method must export something
  (its ``export`` hook): a method whose learning is its weights has nothing another model can read.
* ``conflict``: the world's rule changes between two learning phases (``--change env.KEY=VALUE``).
  On the changed world: ``both`` (the run's lessons, then a second learning phase on the changed
  world from them: ``run.continue_from``), ``new`` (that learning from nothing), ``old`` (the run's
  lessons only) and ``none``. ``both`` against ``new`` is what the contradicted lessons cost once
  the newer ones are learned; ``both`` against ``old`` whether the method acts on the newer lesson.

``OUT/experiment.json`` holds the plan and, once every arm has finished, each arm against its
control (the plan's pairs) per split and per task type: exact paired test and paired bootstrap interval
(``arena.report.compare``), and the protocol fields the arms differ in besides the factor (none,
or they are named). Running the command again on the same ``--out`` resumes unfinished arms.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from arena.core.config.registry import did_you_mean
from arena.core.contract.settings import ExperienceSettings, Settings
from arena.core.execution import salt as eval_salt
from arena.core.execution.experience_controls import OTHER_TYPE, ExperienceControl, poison_count
from arena.core.protocol.continuation import AN_ARM, is_experiment_arm
from arena.core.services.progress import Reporter
from arena.core.storage.ledger import ExperimentMark, Ledger
from arena.core.storage.rundir import CONFIG, RESULTS, RunDirError, read_json, read_results, write_json_atomic
from arena.report.aggregate import CONTINUED_FIELD as CONTINUED
from arena.report.compare import compare_runs, compare_split, paired_outcomes
from arena.report.evaluate_state import (
    BOARD_SETTINGS,
    EvaluateError,
    board_overrides,
    finish_evaluation,
    prepare_evaluation,
)
from arena.report.runs import PRIMARY_VARIANT, Run, load_run

EXPERIMENT_FILE = "experiment.json"
EXPERIENCE = "eval.experience."
#: The experiments (docs/experiments.md).
NAMES = ("relevance", "poison", "transfer", "stale", "conflict")
#: How a learning arm learns: from nothing, or from the source run's learned state.
SCRATCH, CONTINUE = "scratch", "continue"
#: Environment settings that define the tasks themselves: a change of them is not a changed world.
TASK_DEFINING = ("name", "seed", "n_train", "n_valid", "n_test", "level")
DEFAULT_FRACTIONS = (0.0, 0.1, 0.3)
#: Evaluation settings every arm may share (``--set``): a board's, and ``eval.limit`` (what a
#: run learned does not depend on how many test tasks it was evaluated on, so a source evaluated
#: on a few tasks can have full-split arms).
SHARED_SETTINGS = (*BOARD_SETTINGS, "eval.limit")
#: A changed world may reword its tasks (BabyAI's recolour renames the colours of its missions),
#: so their split hashes change with it; the arms must still play the same (task id, seed) pairs,
#: or the paired comparison refuses them.
RENAMED_TASKS = "split_hashes.*"


class ExperimentError(ValueError):
    """The experiment cannot run as asked (the message says why and what to do)."""


@dataclass
class Arm:
    name: str
    settings: dict[str, Any]
    #: None: the source's learned state is evaluated again; SCRATCH or CONTINUE: the arm learns
    #: (from nothing, or from the source's state) under ``settings``, then is evaluated.
    learns: str | None = None


@dataclass
class Plan:
    name: str
    source: str
    arms: list[Arm]
    #: (arm, its control) pairs compared.
    pairs: list[tuple[str, str]]
    #: The protocol fields the factor changes (arena.report.aggregate.protocol_of's names).
    factor: list[str]
    options: dict[str, Any] = field(default_factory=dict)
    #: Arms played by another experiment over the same source with the same settings (shared
    #: controls, ``--reuse``): arm name -> its folder, relative to this experiment's.
    reused: dict[str, str] = field(default_factory=dict)

    def arm_path(self, out: Path, name: str) -> Path:
        """Where arm ``name`` of this experiment (in ``out``) lies: its own folder or a reused one."""
        return out / self.reused[name] if name in self.reused else out / name


def make_plan(name: str, source: Path, *, fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
              model: tuple[str, ...] = (), change: tuple[str, ...] = (),
              board: tuple[str, ...] = ()) -> Plan:
    """The arms of experiment ``name`` over ``source``; ``board``: ``key=value`` evaluation
    settings every arm shares (``arena evaluate``'s: seeds, salt, concurrency, splits)."""
    if name not in NAMES:
        raise ExperimentError(f"Unknown experiment {name!r}. Choose one of {', '.join(NAMES)}.")
    shared = _settings(board, allowed=SHARED_SETTINGS, what="--set")
    own, none = {f"{EXPERIENCE}source": "own"}, {f"{EXPERIENCE}source": "none"}
    if name == "relevance":
        arms = [Arm(value, {**shared, f"{EXPERIENCE}source": value}) for value in ("own", "other_type", "none")]
        return Plan(name, str(source), arms, [("other_type", "own"), ("none", "own")],
                    [f"{EXPERIENCE}source"])
    if name == "poison":
        if 0.0 not in fractions:
            fractions = (0.0, *fractions)
        if any(not 0.0 <= f < 1.0 for f in fractions):
            raise ExperimentError(f"--fraction takes shares in [0, 1); got {', '.join(map(str, fractions))}.")
        _check_poison_adds_items(source, fractions, defaulted=fractions == DEFAULT_FRACTIONS)
        arms = [Arm(f"poison-{f:g}", {**shared, f"{EXPERIENCE}poison": f}) for f in sorted(set(fractions))]
        return Plan(name, str(source), arms, [(arm.name, "poison-0") for arm in arms[1:]],
                    [f"{EXPERIENCE}poison"], {"fractions": sorted(set(fractions))})
    if name in ("stale", "conflict"):
        changed = _world_change(name, change)
        _check_known_keys(source, changed, "env", "name")
    if name == "conflict":
        arms = [Arm("both", {**shared, **changed}, learns=CONTINUE), Arm("new", {**shared, **changed}, learns=SCRATCH),
                Arm("old", {**shared, **changed, **own}), Arm("none", {**shared, **changed, **none})]
        return Plan(name, str(source), arms, [("both", "new"), ("both", "old"), ("new", "none")],
                    [*changed, RENAMED_TASKS, CONTINUED, f"{EXPERIENCE}source"], {"change": changed})
    if name == "stale":
        arms = [Arm("learned_world", {**shared, **own}), Arm("learned_world_none", {**shared, **none}),
                Arm("changed_world", {**shared, **changed, **own}),
                Arm("changed_world_none", {**shared, **changed, **none})]
        return Plan(name, str(source), arms,
                    [("changed_world", "learned_world"), ("learned_world", "learned_world_none"),
                     ("changed_world", "changed_world_none")],
                    [*changed, RENAMED_TASKS, f"{EXPERIENCE}source"], {"change": changed})
    target = _settings(model, allowed=("llm.",), what="--model")
    if not target:
        raise ExperimentError("transfer needs the model to transfer to: --model llm.KEY=VALUE (e.g. "
                              "--model llm.warmstart=null for the embedded model as shipped, or "
                              "--model llm.model=PATH).")
    _check_known_keys(source, target, "llm", "backend")
    results = read_results(source)
    if "exported" in results.model_fields_set and results.exported is None:  # absent: a run from before
        raise ExperimentError(f"{source}'s method exports nothing (its export hook returned None): what "
                              "it learned is not text another model can read (its weights, say). "
                              "Transfer the experience of a method that exports some.")
    arms = [Arm("with", {**shared, **target, **own}), Arm("without", {**shared, **target, **none})]
    return Plan(name, str(source), arms, [("with", "without")], [f"{EXPERIENCE}source"], {"model": target})


def _world_change(name: str, change: tuple[str, ...]) -> dict[str, Any]:
    changed = _settings(change, allowed=("env.",), what="--change")
    fixed = [key for key in changed if key.split(".", 1)[1] in TASK_DEFINING]
    if not changed or fixed:
        raise ExperimentError(f"{name} needs a change of the world that keeps its tasks: --change "
                              "env.KEY=VALUE (e.g. --change env.dialect=put on household)"
                              + (f"; {', '.join(fixed)} would change the tasks themselves" if fixed else "")
                              + ".")
    return changed


def _check_poison_adds_items(source: Path, fractions: Iterable[float], defaulted: bool = False) -> None:
    """Each nonzero fraction must add at least one item to the source's store (a share of 10 %
    of a store of 3 rounds to none, and would compare the clean store with itself)."""
    if not (source / RESULTS).is_file():
        return  # refused with its reason when the arm is made
    clean = read_results(source).state.memory_items
    empty = [f for f in fractions if f > 0 and poison_count(clean, f) == 0]
    if empty:
        smallest = next((f / 100 for f in range(1, 100) if poison_count(clean, f / 100) > 0), None)
        named = ("the default fractions " if defaulted else "--fraction ") + ", ".join(f"{f:g}" for f in empty)
        raise ExperimentError(
            f"{named} add no item to {source}'s store of {clean} "
            + (f"items: give --fraction F of at least {smallest:g}." if smallest
               else "items: it has nothing to poison."))


def _check_known_keys(source: Path, settings: dict[str, Any], section: str, name_key: str) -> None:
    """Each ``section.KEY`` set is a setting of the source's config or of the defaults of the
    environment or backend the arm names (a misspelt key would change nothing and the arm would
    be its control)."""
    if not (source / CONFIG).is_file():
        return  # refused with its reason when the arm is made
    from arena.core.config.plugins import get_plugins

    config = OmegaConf.to_container(OmegaConf.select(OmegaConf.load(source / CONFIG), section) or {})
    assert isinstance(config, dict)
    known = set(config)
    component = settings.get(f"{section}.{name_key}", config.get(name_key))
    registry = get_plugins().envs if section == "env" else get_plugins().backends
    if component in registry.names():
        for path in registry.get(component).configs:
            known |= set(OmegaConf.load(path).keys())
    unknown = [key for key in settings if key.split(".")[1] not in known]
    if unknown:
        key = unknown[0]
        raise ExperimentError(did_you_mean(f"{section} setting", key.split(".")[1], sorted(map(str, known)))
                              + f" ({key} is not a setting of {component} nor of {source}'s config.)")


def _settings(items: tuple[str, ...], *, allowed: tuple[str, ...], what: str) -> dict[str, Any]:
    try:
        return board_overrides(items, allowed, what=f"{what}'s")
    except EvaluateError as exc:
        raise ExperimentError(f"{exc} An experiment changes one factor only.") from exc


def run_experiment(plan: Plan, out: Path | str, *, plugins: Any = None,
                   reuse: Iterable[Path | str] = (), reporter: Reporter | None = None) -> dict[str, Any]:
    """Every arm of ``plan`` into ``out`` (resuming those begun), then the paired summary.
    ``reuse``: folders of other experiments whose finished arms stand in for this plan's arms of
    the same source and settings (stale's ``learned_world`` is relevance's ``own``)."""
    out, source = Path(out), Path(plan.source)
    planned = {"experiment": plan.name, "source": str(source.resolve()),
               "pairs": [list(pair) for pair in plan.pairs], "factor": plan.factor, "options": plan.options,
               "arms": {arm.name: arm.settings for arm in plan.arms}}
    if any(arm.learns for arm in plan.arms):
        planned["learning_arms"] = {arm.name: arm.learns for arm in plan.arms if arm.learns}
    learned = _learned(source)
    planned["source_learned"] = learned
    summary_file = out / EXPERIMENT_FILE
    reused_before: dict[str, str] = {}
    if summary_file.is_file():
        before = read_json(summary_file, "its experiment file")
        reused_before = dict(before.get("reused", {}))
        differing = _differences(before, json.loads(json.dumps(planned)))
        if differing:
            raise ExperimentError(f"{out} holds another experiment ({before.get('experiment')} over "
                                  f"{before.get('source')}; it differs in {', '.join(differing)}): run the "
                                  "command it was started with to resume it, or give a new --out.")
    elif out.exists() and any(out.iterdir()):
        raise ExperimentError(f"{out} exists and is not an experiment's folder: give a new --out.")
    out.mkdir(parents=True, exist_ok=True)
    plan.reused = {**reused_before, **_reusable(plan, out, learned, reuse)}
    if plan.reused:
        planned["reused"] = plan.reused
    _check_controls(plan, source, plugins)
    write_json_atomic(summary_file, planned)
    for arm in plan.arms:
        folder = out / arm.name
        if arm.name in plan.reused or (folder / RESULTS).is_file():
            continue
        mark = ExperimentMark(name=plan.name, arm=arm.name, source_run=str(source.resolve()),
                              settings=arm.settings, learns=arm.learns or None)
        if folder.exists() and not ((folder / CONFIG).is_file() and Ledger(folder).exists()):
            shutil.rmtree(folder)  # killed while it was being made: nothing of it was played
        elif folder.exists() and Ledger(folder).read().experiment is None:
            Ledger(folder).mark_experiment(mark)  # killed between its start and its mark
        if not folder.exists():
            try:
                if arm.learns:
                    _prepare_learning(source, folder, arm, mark, plugins)
                else:
                    prepare_evaluation(source, folder, arm.settings, record_as="experiment_of",
                                       new_keys=(EXPERIENCE, "llm.", "env."), experiment=mark)
            except EvaluateError as exc:
                raise ExperimentError(str(exc)) from exc
        _share_the_test_draw(out, folder)
        finish_evaluation(folder, plugins, reporter)  # resumes: an arm that learns learns first
    summary = {**planned, "comparisons": summarise(plan, out)}
    if plan.name == "conflict":
        summary["second_phase"] = second_phase(out / "both", source)
    write_json_atomic(summary_file, summary)
    return summary


def _check_controls(plan: Plan, source: Path, plugins: Any) -> None:
    """An experience control the source's test splits cannot give (``other_type`` on a split of
    one task type) is refused before any arm plays, not when its arm's turn comes."""
    arm = next((a for a in plan.arms if a.settings.get(f"{EXPERIENCE}source") == OTHER_TYPE), None)
    if arm is None:
        return
    from arena.core.config.plugins import get_plugins
    from arena.core.execution.executors import build_environment

    config = OmegaConf.load(source / CONFIG)
    assert isinstance(config, DictConfig)
    for key, value in arm.settings.items():
        OmegaConf.update(config, key, value, force_add=True)
    settings = Settings.of(config)
    env = build_environment((plugins or get_plugins()).envs, config, settings)
    try:
        control = ExperienceControl(settings.eval.experience, env.tasks)
        control.check(settings.eval.splits, env.tasks)
    except ValueError as exc:
        raise ExperimentError(f"arm {arm.name}: {exc}") from exc
    finally:
        env.close()


def _reusable(plan: Plan, out: Path, learned: dict[str, Any], reuse: Iterable[Path | str]) -> dict[str, str]:
    """This plan's arms, not begun in ``out``, that a finished arm of an experiment in ``reuse``
    played already: the same source (method and learned-state digest) and the same settings.
    Only arms that evaluate the source's state again; an arm that learns is never shared."""
    found: dict[str, str] = {}
    for other in map(Path, reuse):
        if not is_experiment(other):
            raise ExperimentError(f"--reuse {other} is not an experiment's folder (no {EXPERIMENT_FILE}).")
        data = read_json(other / EXPERIMENT_FILE, "its experiment file")
        for arm in plan.arms:
            if arm.learns or arm.name in found or (out / arm.name).exists():
                continue
            for name in data.get("arms", {}):
                folder = other / name
                if (name not in data.get("learning_arms", {}) and _plays_as(folder, Path(plan.source), arm, learned)
                        and _same_test_draw(other, out, folder)):
                    found[arm.name] = os.path.relpath(folder.resolve(), out.resolve())
                    break
    return found


def _same_test_draw(other: Path, out: Path, arm: Path) -> bool:
    """Whether ``arm`` (of the experiment in ``other``) played the test layouts this experiment's
    arms play: always under a public or a board's salt; under a secret one, when this experiment
    has no draw yet (it adopts ``other``'s) or the same one."""
    if eval_salt.mode_of(Settings.of(OmegaConf.load(arm / CONFIG))) != eval_salt.SECRET:
        return True
    theirs = eval_salt.kept_secret(other / eval_salt.SALT_FILE)
    if not theirs:
        return False
    ours = eval_salt.kept_secret(out / eval_salt.SALT_FILE)
    if not ours:
        eval_salt.keep_secret(theirs, out / eval_salt.SALT_FILE)
    return ours in (None, theirs)


def _evaluated_state_of(arm: Path) -> dict[str, Any]:
    """The source an arm evaluated, as its own files record it (method, learned-state digest)."""
    made_from = Ledger(arm).read().provenance.get("experiment_of") or {}
    return {"method": read_results(arm).method, "digest": made_from.get("digest_before_eval")}


def _plays_as(arm_folder: Path, source: Path, arm: Arm, learned: dict[str, Any]) -> bool:
    """Whether the finished ``arm_folder`` evaluated ``source``'s learned state under the config
    ``arm`` would have: the same method and digest, the same config."""
    return ((arm_folder / RESULTS).is_file()
            and _evaluated_state_of(arm_folder) == {k: learned[k] for k in ("method", "digest")}
            and config_identity(OmegaConf.load(arm_folder / CONFIG), with_folders=True)
            == config_identity(OmegaConf.load(source / CONFIG), arm.settings, with_folders=True))


def _share_the_test_draw(out: Path, arm: Path) -> None:
    """Every arm plays the same test layouts: under a secret salt (``eval.salt=secret``, or
    ``auto`` with ``run.isolation=process``) one draw for the experiment, ``OUT/eval_salt``,
    copied into each arm before it plays (each arm would otherwise draw its own)."""
    settings = Settings.of(OmegaConf.load(arm / CONFIG))
    if eval_salt.mode_of(settings) != eval_salt.SECRET or eval_salt.kept_secret(arm / eval_salt.SALT_FILE):
        return
    drawn = eval_salt.resolve(settings, out)  # drawn once, read back after
    eval_salt.keep_secret(str(drawn.value), arm / eval_salt.SALT_FILE)


def _learned(source: Path) -> dict[str, Any]:
    """What tells a source apart: its method, the digest of the state its learning ended with
    and its config (the state digest covers what was learned, not how it is evaluated)."""
    if not (source / RESULTS).is_file():
        raise ExperimentError(f"{source} is not a finished run (no {RESULTS}): give the folder of a run "
                              "that finished, or finish it first with `arena run --resume`.")
    if is_experiment_arm(source):
        raise ExperimentError(f"{source} {AN_ARM}: give the run it was made from.")
    results = read_results(source)
    return {"method": results.method, "digest": results.state.digest_before_eval,
            "config": config_identity(OmegaConf.load(source / CONFIG))}


#: Config keys that name a folder or a model: they differ between checkouts and machines, and
#: what they name is in the learned state's digest (the served weights) or in its record.
NOT_IDENTIFYING = ("llm.warmstart", "llm.model", "run.continue_from")


def config_identity(config: Any, settings: dict[str, Any] | None = None, *, with_folders: bool = False) -> str:
    """A digest of ``config`` with ``settings`` laid over it, as an arm's config is made: the
    keys that name folders left out (unless ``with_folders``: two arms of one checkout name the
    same folders, and a transfer arm differs from its source in them only), the experience
    control as its settings (defaults filled in: poison's ``poison-0`` and relevance's ``own``
    are one evaluation)."""
    config = OmegaConf.create(OmegaConf.to_container(config))
    for key, value in (settings or {}).items():
        OmegaConf.update(config, key, value, force_add=True)
    experience = ExperienceSettings.from_config(OmegaConf.select(config, EXPERIENCE.rstrip(".")))
    plain = OmegaConf.to_container(config)
    for key in (*(() if with_folders else NOT_IDENTIFYING), EXPERIENCE.rstrip(".")):
        *path, name = key.split(".")
        node: Any = plain
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(name, None)
    return hashlib.sha256(json.dumps([plain, experience.describe()], sort_keys=True, default=str).encode()).hexdigest()


def _differences(before: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    """What ``before`` (an experiment file found in --out) plans otherwise than ``planned``. The
    source is told by its method and learned state, not by its path: a checkout moved to
    another folder or machine resumes its experiments (a file from before that was recorded:
    by the source's folder name)."""
    if "source_learned" in before:  # method and digest; the config too where it was recorded
        learned = planned["source_learned"]
        same_source = all(learned.get(key) == value for key, value in before["source_learned"].items())
    else:
        same_source = Path(str(before.get("source"))).name == Path(planned["source"]).name
    return (([] if same_source else ["source"])
            + [key for key, value in planned.items() if key not in ("source", "source_learned", "reused")
               and before.get(key) != value])


def _prepare_learning(source: Path, folder: Path, arm: Arm, mark: ExperimentMark, plugins: Any) -> None:
    """A new run in ``folder`` with the source's config and ``arm.settings`` over it, learning
    from nothing or (CONTINUE) from the source's learned state; marked as the experiment's arm."""
    from arena.core import protocol

    config = OmegaConf.load(source / CONFIG)
    settings = dict(arm.settings)
    # From the source's state, or from nothing even when the source itself was continued.
    settings["run.continue_from"] = str(source.resolve()) if arm.learns == CONTINUE else None
    try:
        named = Settings.of(config)
        prepared = protocol.prepare(named.method.name, named.env.name, config_file=source / CONFIG,
                                    overrides=[f"{key}={json.dumps(value)}" for key, value in settings.items()],
                                    out=folder, plugins=plugins, preset=config.method.get("preset"))
    except (ValueError, OSError, RunDirError) as exc:
        raise ExperimentError(f"arm {arm.name} cannot learn from {source}'s config: {exc}") from exc
    try:
        prepared.run_dir.ledger.mark_experiment(mark)
    finally:
        prepared.release()


def second_phase(both: Path, source: Path) -> dict[str, Any]:
    """What the second learning phase did: episodes it played and the store before and after.
    A method whose ``learn`` resumes from its own progress learns nothing again; then the
    experiment cannot test a conflict, and says so."""
    continued, before = read_results(both), read_results(source)
    episodes = int(continued.learn.used.get("episodes", 0))
    phase: dict[str, Any] = {
        "episodes": episodes, "items_before": before.state.memory_items,
        "items_after": continued.state.memory_items,
        "digest_changed": continued.state.digest_before_eval != before.state.digest_before_eval}
    if not phase["digest_changed"]:
        phase["note"] = (f"{continued.method} learned nothing in the second phase (its learned state is "
                         "the first phase's): its learn hook resumed from its own progress, so no "
                         "lesson was contradicted and `both` tests nothing `old` does not.")
    return phase


@dataclass
class ArmComparison:
    arm: str
    control: str
    split: str
    task_type: str  # "all", or one type
    pairs: int
    success_arm: float
    success_control: float
    difference: float
    ci95: tuple[float, float]
    p_value: float
    #: Protocol fields the arm differs in from its control besides the factor (should be none).
    other_differences: list[str]
    #: Share of the pairs in which the arm was shown the same experience items as its control
    #: (as a set; and in the same order): a factor on experience that changes nothing shown
    #: (a store of one task type has no other type's items to give) tests nothing.
    same_experience: float = 0.0
    same_experience_order: float = 0.0
    #: The runs of the pair (arm, control) whose results are invalid (a violation: the method
    #: changed its state while evaluated, say): their figures are shown, never read as a result.
    invalid: list[str] = field(default_factory=list)


def summarise(plan: Plan, out: Path) -> list[dict[str, Any]]:
    """Each (arm, control) pair of the plan, per split and per task type."""
    runs = {arm.name: load_run(plan.arm_path(out, arm.name), verification=False) for arm in plan.arms}
    shown_by_arm = {name: _experience_shown(run) for name, run in runs.items()}
    rows = []
    for name, control_name in plan.pairs:
        run, control = runs[name], runs[control_name]
        overall = compare_runs(run, control, allow_mixed=True)
        others = [f for f in overall["mixed_fields"] if not _in_factor(f, plan.factor)]
        invalid = [arm for arm in (name, control_name) if not runs[arm].results.valid]
        pairs = paired_outcomes(run, control, PRIMARY_VARIANT, PRIMARY_VARIANT)
        types = _task_types(run)
        shown, shown_control = shown_by_arm[name], shown_by_arm[control_name]
        for split, split_pairs in pairs.items():
            by_type: dict[str, list[tuple[str, int, bool, bool]]] = defaultdict(list)
            for pair in split_pairs:
                by_type[types[pair[0]]].append(pair)
            for task_type, chosen in [("all", split_pairs), *sorted(by_type.items())]:
                compared = compare_split(split, chosen)
                lists = [(shown.get((split, t, s), ()), shown_control.get((split, t, s), ())) for t, s, _, _ in chosen]
                rows.append(asdict(ArmComparison(
                    arm=name, control=control_name, split=split, task_type=task_type,
                    pairs=compared.pairs, success_arm=compared.success_a,
                    success_control=compared.success_b, difference=compared.difference,
                    ci95=compared.ci95, p_value=compared.p_value, other_differences=others,
                    same_experience=_share(set(a) == set(b) for a, b in lists),
                    same_experience_order=_share(a == b for a, b in lists), invalid=invalid)))
    return rows


def _experience_shown(run: Run) -> dict[tuple[str, str, int], tuple[str, ...]]:
    """(split, task, seed) -> the experience items the harness recorded as shown in that test
    episode (ids, in order)."""
    return {(record.split, record.task_id, record.seed): tuple(record.experience_ids)
            for record in run.evaluated()}


def _share(flags: Iterable[bool]) -> float:
    values = list(flags)
    return round(sum(values) / len(values), 4) if values else 0.0


def _in_factor(field_name: str, factor: list[str]) -> bool:
    return any(field_name == f or (f.endswith(".*") and field_name.startswith(f[:-1])) for f in factor)


def _task_types(run: Run) -> dict[str, str]:
    return {record.task_id: record.task_type for record in run.evaluated()}


@dataclass
class ExperimentReport:
    """A finished experiment as a board shows it, rebuilt from its arms' small files."""

    name: str
    folder: str
    source: str  # the source run's folder name
    method: str
    env: str
    factor: list[str]
    options: dict[str, Any]
    arms: list[str]
    comparisons: list[dict[str, Any]]
    second_phase: dict[str, Any] | None = None
    #: Tasks of each split every arm played (``eval.limit``); None: the full splits.
    limit: int | None = None
    #: poison's arms: what the harness added (poison items, how many from another task type).
    poisoned: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Arms another experiment played (``--reuse``): arm -> that arm's folder, relative to this one.
    reused: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def is_experiment(path: Path | str) -> bool:
    return (Path(path) / EXPERIMENT_FILE).is_file()


def load_experiment(path: Path | str) -> ExperimentReport:
    """The experiment in ``path``, its comparisons computed again from its arms."""
    path = Path(path)
    data = read_json(path / EXPERIMENT_FILE, "its experiment file")
    learns = data.get("learning_arms", {})
    plan = Plan(data["experiment"], data["source"],
                [Arm(name, settings, learns.get(name)) for name, settings in data["arms"].items()],
                [(arm, control) for arm, control in data["pairs"]], list(data["factor"]), data.get("options", {}),
                dict(data.get("reused", {})))
    unfinished = [arm.name for arm in plan.arms if not (plan.arm_path(path, arm.name) / RESULTS).is_file()]
    if unfinished:
        raise ExperimentError(f"{path}: the arms {', '.join(unfinished)} have not finished. Run the "
                              "experiment's command again with the same --out to finish them"
                              + (" (and give the experiments it reuses beside it)." if plan.reused else "."))
    first = load_run(plan.arm_path(path, plan.arms[0].name), verification=False)
    return ExperimentReport(name=plan.name, folder=path.name, source=Path(plan.source).name,
                            method=first.method, env=first.env, factor=plan.factor, options=plan.options,
                            arms=[arm.name for arm in plan.arms], comparisons=summarise(plan, path),
                            second_phase=data.get("second_phase"),
                            limit=(first.config.get("eval") or {}).get("limit"),
                            poisoned={arm.name: {k: v for k, v in poisoned.items() if k != "digest_clean"}
                                      for arm in plan.arms
                                      if (poisoned := Ledger(plan.arm_path(path, arm.name)).read().poisoned)},
                            reused=plan.reused)
