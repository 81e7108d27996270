"""Every preset of every method starts and finishes: composed as a user would (`--preset NAME`),
then shrunk to one iteration and one evaluation task with the tiny model on CPU.

Only sizes are overridden: counts (iterations, sources, tasks, groups, optimizer steps) and
token limits (a random model never stops on its own, so every generation runs to its limit).
What a preset is for is kept: dtype, training precision, context, layout, solver mode,
aggregation, old log-probs, LoRA or full fine-tuning. A test checks that the shrinking leaves
those untouched, so a size table that grows to override one fails here rather than hiding it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from omegaconf import OmegaConf

from arena.core import protocol
from arena.core.config.compose import compose
from arena.core.config.schema import flatten
from arena.core.storage.metrics import read_metrics
from arena.testing import shrunk_overrides

#: Where the run happens, not what it is: the tiny model, the CPU, the hashing embedder (for
#: Evolving-RL's paper preset, in place of the 4B retrieval embedder it names).
MACHINE = ["llm.model=tiny", "llm.device=cpu", "embedder.name=hashing"]
#: What a preset means; shrinking must leave every one of these as the preset set it.
KEPT = ["llm.dtype", "llm.max_context", "solver.layout", "solver.mode", "solver.end_at_context_limit",
        "solver.stop_after_action", "solver.action_parser", "method.solver_samples", "method.group_of_one",
        "method.trainer", "method.rl.trainer", "method.sft.lora", "method.mode",
        "method.train_extractor", "method.train_solver", "method.unusable_cards"]

#: Methods whose learning takes optimizer steps (the others learn into memory).
RL_METHODS = ("evolving_rl", "gigpo", "grpo", "skillrl")
#: The least prompt a generation must leave room for in the context: a task, an observation and
#: the instructions (a reply that fills the context leaves none, and the call fails).
PROMPT_ROOM = 512


def _presets(plugins: Any) -> list[tuple[str, str]]:
    """Every preset of every method that has presets."""
    return [(method, preset) for method in sorted(plugins.methods.names())
            for preset in sorted(plugins.methods.get(method).presets)]


def generation_limits(cfg: Any) -> dict[str, int]:
    """Every reply length a method's config sets (``...max_tokens``, ``...max_new_tokens``)."""
    flat = flatten(OmegaConf.to_container(cfg.method, resolve=True), "method.")
    return {key: int(value) for key, value in flat.items()
            if key.rsplit(".", 1)[-1].endswith(("max_tokens", "max_new_tokens")) and isinstance(value, int)}


def _shrunk(plugins: Any, method: str, preset: str) -> list[str]:
    return shrunk_overrides(compose(plugins, method, preset=preset)) + MACHINE


def pytest_generate_tests(metafunc: Any) -> None:
    if "method_preset" in metafunc.fixturenames:
        from arena.core.config.plugins import get_plugins

        pairs = _presets(get_plugins())
        metafunc.parametrize("method_preset", pairs, ids=[f"{m}-{p}" for m, p in pairs])


def test_every_learning_method_has_its_paper_preset_here(plugins) -> None:
    pairs = set(_presets(plugins))
    assert {(method, "paper") for method in (*RL_METHODS, "expel", "mem0", "memrl", "reflexion")} <= pairs
    assert len(pairs) >= 20


def test_every_presets_replies_leave_room_for_a_prompt_in_its_context(plugins, method_preset) -> None:
    """A reply of the preset's length plus a prompt fits the preset's context (mem0's paper
    preset once asked for 2,000-token replies in a 2,048-token context: its first call failed)."""
    method, preset = method_preset
    cfg = compose(plugins, method, preset=preset)
    context = int(cfg.llm.max_context)
    for key, limit in generation_limits(cfg).items():
        assert limit + PROMPT_ROOM <= context, (
            f"{method} --preset {preset}: {key}={limit} leaves {context - limit} of llm.max_context={context} "
            f"tokens for the prompt (at least {PROMPT_ROOM} needed)")


def test_shrinking_changes_sizes_only(plugins, method_preset) -> None:
    method, preset = method_preset
    as_preset = compose(plugins, method, preset=preset)
    shrunk = compose(plugins, method, preset=preset, overrides=_shrunk(plugins, method, preset))
    for key in KEPT:
        before = OmegaConf.select(as_preset, key, default=None)
        after = OmegaConf.select(shrunk, key, default=None)
        assert OmegaConf.to_container(after) == OmegaConf.to_container(before) \
            if OmegaConf.is_config(before) else after == before, (key, before, after)


@pytest.mark.slow
def test_every_preset_runs_one_shrunk_iteration_to_valid_results(plugins, method_preset, tmp_path) -> None:
    method, preset = method_preset
    path, results = protocol.run(method, overrides=_shrunk(plugins, method, preset),
                                 out=tmp_path / "run", plugins=plugins, preset=preset)
    assert results.valid is True, results.violations
    for split in ("test_seen", "test_unseen"):
        assert results.splits[split].n_tasks == 1
    assert results.provenance.config["method"]["preset"] == preset
    assert json.loads((path / "results.json").read_text())["record"] == results.to_json()["record"]
    # The preset's learning ran: its one optimizer step was taken and counted by the harness,
    # unless the preset drops groups without signal and the random model's all were (its
    # metrics then say every sample was dropped).
    if method not in RL_METHODS:  # a memory method learned from its shrunk episodes, no step
        assert results.learn.used["episodes"] >= 1 and results.learn.used["gradient_steps"] == 0
    elif results.learn.used["gradient_steps"] == 0:
        (learned,) = [m["metrics"] for m in read_metrics(path)
                      if m["phase"] == "learn" and "samples" in m["metrics"]]
        assert learned["samples_dropped"] == learned["samples"] > 0, learned
    else:  # one RL step (SkillRL's SFT adds its own), within the budget where one is set
        budget = compose(plugins, method, preset=preset, overrides=_shrunk(plugins, method, preset)).learn.budget
        used = results.learn.used["gradient_steps"]
        assert 1 <= used <= (budget.gradient_steps or 2), results.learn.used
