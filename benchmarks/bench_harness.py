"""Harness overhead and batching, with the embedded model (not part of the test suite).

Run: ``python -m pytest benchmarks/bench_harness.py --benchmark-only -s``

* ``bare`` plays the same episodes with the same prompt and model in a plain loop;
  ``harness`` runs them through ``arena run`` (protocol, hooks, records, digests). Goal: the
  harness costs <= 5 % over the bare loop.
* ``sequential`` vs ``batched``: the same evaluation at ``eval.concurrency=1`` and ``8``.
"""

from __future__ import annotations

import os
import time

import pytest

from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.core.contract.llm import SamplingParams
from arena.core.contract.types import Trajectory
from arena.core.execution.solver import Action, build_prompt, play

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LIMIT = 2  # tasks per test split
MAX_STEPS = 8
COMMON = ["embedder.name=hashing", f"eval.limit={LIMIT}", f"eval.max_steps={MAX_STEPS}"]
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def plugins() -> Plugins:
    loaded = Plugins()
    loaded.load_defaults()
    return loaded


def bare_loop(plugins: Plugins) -> float:
    """Same tasks, prompt and constrained choice as `base`, with no harness around them."""
    cfg = protocol.compose(plugins, "base", overrides=COMMON)
    env = plugins.envs.get("household").factory(cfg.env)
    llm = plugins.backends.get("transformers").factory(cfg.llm)
    started = time.perf_counter()
    for split in cfg.eval.splits:
        for task in protocol.select_tasks(env.tasks(split), LIMIT):

            def act(observation, trajectory: Trajectory, task=task) -> Action:
                prompt = build_prompt(task, observation, trajectory, [], history=cfg.solver.history,
                                      show_admissible=True, max_experiences=4, max_experience_chars=800)
                (choice,) = llm.choose([prompt], [list(observation.admissible_actions)], SamplingParams())
                return Action(choice.text)

            play(env.open(task), act, max_steps=MAX_STEPS, max_invalid_actions=10)
    return time.perf_counter() - started


def harness_run(plugins: Plugins, tmp_path, concurrency: int) -> float:
    started = time.perf_counter()
    protocol.run("base", overrides=COMMON + [f"eval.concurrency={concurrency}"],
                 out=tmp_path / f"run-{concurrency}-{time.time_ns()}", plugins=plugins)
    return time.perf_counter() - started


def test_overhead_paired(benchmark, plugins, tmp_path):
    """Bare and harness runs alternate, so machine noise hits both alike; median of the ratios."""
    bare_loop(plugins)  # warm: conversion cache, kernels
    ratios = []

    def pair() -> None:
        bare = bare_loop(plugins)
        harness = harness_run(plugins, tmp_path, 1)
        ratios.append(harness / bare)

    benchmark.pedantic(pair, rounds=3, iterations=1)
    ratios.sort()
    benchmark.extra_info["overhead_ratios"] = [round(r - 1, 4) for r in ratios]
    print(f"\nharness overhead vs bare loop, per pair: {[f'{r - 1:+.1%}' for r in ratios]}, "
          f"median {ratios[len(ratios) // 2] - 1:+.1%}")


def test_bare_loop(benchmark, plugins):
    bare_loop(plugins)  # warm: conversion cache, kernels
    FIGURES["bare"] = benchmark.pedantic(bare_loop, args=(plugins,), rounds=2, iterations=1)


def test_harness_sequential(benchmark, plugins, tmp_path):
    FIGURES["harness"] = benchmark.pedantic(harness_run, args=(plugins, tmp_path, 1), rounds=2, iterations=1)
    if "bare" in FIGURES:
        overhead = FIGURES["harness"] / FIGURES["bare"] - 1
        benchmark.extra_info["overhead_vs_bare"] = round(overhead, 4)
        print(f"\nharness {FIGURES['harness']:.2f} s vs bare {FIGURES['bare']:.2f} s: overhead {overhead:+.1%}")


def test_harness_batched(benchmark, plugins, tmp_path):
    FIGURES["batched"] = benchmark.pedantic(harness_run, args=(plugins, tmp_path, 8), rounds=2, iterations=1)
    if "harness" in FIGURES:
        speedup = FIGURES["harness"] / FIGURES["batched"]
        benchmark.extra_info["speedup_vs_sequential"] = round(speedup, 3)
        print(f"\nbatched (8) {FIGURES['batched']:.2f} s vs sequential {FIGURES['harness']:.2f} s: x{speedup:.2f}")
