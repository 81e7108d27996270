"""The warm-start base: built from the expert on train tasks by a declared recipe, cached by its
digests, merged into the served weights, recorded in every run, never pooled with another base."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from arena.backends.embedded import tiny_model_dir
from arena.core.config.compose import ConfigError
from arena.report.aggregate import build_tables
from arena.report.runs import ReportError, load_run
from arena.testing import run_method
from arena.warmstart import build, load_recipe

RECIPE = """\
name: tiny-household
env: {name: household, level: easy, n_train: 60, n_valid: 12, n_test: 12}
demonstrations: 4
epochs: 1
batch_size: 16
lr: 1.0e-2
lora: {r: 2, alpha: 4}
prompt: {layout: window, history: 2, show_admissible: true, mode: choose}
max_length: 512
seed: 0
"""
TINY = ["llm.backend=transformers", "llm.model=tiny", "eval.limit=2", "eval.max_steps=4",
        "eval.concurrency=2", "embedder.name=hashing", "env.level=easy", "env.n_train=60",
        "env.n_valid=12", "env.n_test=12"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, build.WarmStart]:
    """One build of the tiny recipe, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("warmstart")
    recipe = root / "tiny.yaml"
    recipe.write_text(RECIPE)
    cache = root / "cache"
    warm = build.resolve(str(recipe), tiny_model_dir(), cache_dir=cache, say=lambda _: None)
    return recipe, cache, warm


@pytest.mark.slow
def test_a_build_records_its_recipe_demonstrations_and_digests(built: tuple[Path, Path, build.WarmStart]) -> None:
    recipe_path, _, warm = built
    recipe = load_recipe(str(recipe_path))
    manifest = warm.manifest
    assert manifest["recipe"] == "tiny-household" and manifest["recipe_sha256"] == recipe.digest()
    assert manifest["base_weights_sha256"] == build.base_weights_digest(tiny_model_dir())
    assert manifest["demonstrations"] == 4 and manifest["expert_lost"] == 0
    # One example per expert step, and only train tasks were played.
    assert manifest["examples"] >= 4 and manifest["steps"] == -(-manifest["examples"] // 16)
    assert manifest["adapter_sha256"] == build.adapter_digest(warm.adapter_dir)
    assert (warm.folder / build.RECIPE_FILE).is_file()


def test_demonstrations_are_train_tasks_rendered_as_the_solver_prompts_them(tmp_path: Path) -> None:
    recipe_path = tmp_path / "tiny.yaml"
    recipe_path.write_text(RECIPE)
    recipe = load_recipe(str(recipe_path))
    env = build.make_environment(recipe)
    try:
        rows, stats = build.demonstrations(recipe, env, say=lambda _: None)
        train_goals = {task.goal for task in env.tasks("train")}
    finally:
        env.close()
    assert stats["demonstrations"] == 4 and len(rows) == stats["examples"]
    first = rows[0]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["prompt"][1]["content"].endswith("Your next action:")
    assert "Admissible actions:" in first["prompt"][1]["content"]
    # The completion is the expert's action, and it is admissible where it was taken.
    action = first["completion"][0]["content"]
    assert action in first["prompt"][1]["content"].split("Admissible actions: ", 1)[1]
    assert any(goal in first["prompt"][1]["content"] for goal in train_goals)
    # Later steps show the window of recent steps, as the solver does.
    assert any("Recent steps:" in row["prompt"][1]["content"] for row in rows)


@pytest.mark.slow
def test_the_cache_is_reused_and_a_tampered_adapter_is_refused(built: tuple[Path, Path, build.WarmStart],
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    recipe, cache, warm = built

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("built again although the cache holds it")

    monkeypatch.setattr(build, "build", no_build)
    again = build.resolve(str(recipe), tiny_model_dir(), cache_dir=cache, say=lambda _: None)
    assert again.folder == warm.folder and again.manifest == warm.manifest

    copy = build.copy_to(warm, tmp_path / "base")
    assert build.load(copy).manifest["adapter_sha256"] == warm.manifest["adapter_sha256"]
    weights = copy / build.ADAPTER / build.ADAPTER_WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="does not match its manifest"):
        build.load(copy)


@pytest.mark.slow
def test_a_warm_start_of_another_base_model_is_refused(built: tuple[Path, Path, build.WarmStart],
                                                       tmp_path: Path) -> None:
    _, _, warm = built
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir(), other)
    weights = next(other.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="built on another base model"):
        build.resolve(str(warm.folder), other, say=lambda _: None)


@pytest.mark.slow
def test_a_run_serves_the_merged_weights_and_records_the_base(built: tuple[Path, Path, build.WarmStart],
                                                              tmp_path: Path) -> None:
    _, _, warm = built
    plain = run_method("base", TINY, out=tmp_path / "plain", fast=False)
    warmed = run_method("base", [*TINY, f"llm.warmstart={warm.folder}"], out=tmp_path / "warm", fast=False)
    plain_model = plain.results.provenance.model
    warm_model = warmed.results.provenance.model
    assert "warmstart" not in plain_model
    assert warm_model["warmstart"]["adapter_sha256"] == warm.manifest["adapter_sha256"]
    assert warm_model["warmstart"]["recipe"] == "tiny-household"
    assert warm_model["weights_sha256"] != plain_model["weights_sha256"]  # the adapter is merged

    # One table never ranks two bases: the refusal names the field and both values.
    runs = [load_run(tmp_path / "plain"), load_run(tmp_path / "warm")]
    with pytest.raises(ReportError, match=r"llm\.warmstart differs: none in .*tiny-household@"):
        build_tables(runs)
    tables = build_tables(runs, allow_mixed=True)
    assert tables[0].mixed_fields == ["llm.warmstart"]


@pytest.mark.slow
def test_a_continued_run_serves_the_warm_start_its_source_learned_on(built: tuple[Path, Path, build.WarmStart],
                                                                    tmp_path: Path) -> None:
    from arena.core.storage.rundir import RunDirError

    _, _, warm = built
    source = run_method("base", [*TINY, f"llm.warmstart={warm.folder}"], out=tmp_path / "source", fast=False)
    moved = tmp_path / "elsewhere" / warm.folder.name  # the same build at another path: the same base
    shutil.copytree(warm.folder, moved)
    continued = run_method("base", [*TINY, f"llm.warmstart={moved}", f"run.continue_from={source.path}"],
                           out=tmp_path / "continued", fast=False)
    assert continued.results.valid
    assert continued.results.learn.continued_from["warmstart_adapter_sha256"] == warm.manifest["adapter_sha256"]
    with pytest.raises(RunDirError, match=r"learned on the warm start with adapter .*this run serves no warm start"):
        run_method("base", [*TINY, f"run.continue_from={source.path}"], out=tmp_path / "plain", fast=False)
    assert not (tmp_path / "plain").exists()  # nothing was played: no folder is left behind


def test_a_method_may_not_choose_the_base(tmp_path: Path) -> None:
    config = tmp_path / "method.yaml"
    config.write_text("llm: {warmstart: household-easy}\n")

    class Sneaky:
        def __init__(self, run: object) -> None:
            pass

    with pytest.raises(ConfigError, match=r"sets \['llm.warmstart'\]"):
        run_method(Sneaky, out=tmp_path / "run", config=config)


def test_a_recipe_names_its_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'household-easy'"):
        load_recipe("household-eazy")
    bad = tmp_path / "bad.yaml"
    bad.write_text(RECIPE + "epoch: 3\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['epoch'\]"):
        load_recipe(str(bad))
    assert json.dumps(load_recipe("household-easy").to_dict())  # the shipped recipes load
    assert load_recipe("household-easy").env == {"name": "household", "level": "easy"}


@pytest.mark.slow
def test_a_build_is_reproducible_on_one_machine(built: tuple[Path, Path, build.WarmStart], tmp_path: Path) -> None:
    """The same recipe and base give the same adapter bit for bit here (same kernels and
    threads); across CPUs float rounding differs, which is why a board commits its base/."""
    recipe, _, warm = built
    again = build.resolve(str(recipe), tiny_model_dir(), cache_dir=tmp_path / "cache", say=lambda _: None)
    assert again.folder != warm.folder
    assert again.manifest["adapter_sha256"] == warm.manifest["adapter_sha256"]
