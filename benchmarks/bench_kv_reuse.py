"""What a rollout step costs against what it must cost: prompt tokens computed against the tokens a
step adds, the harness's step latency against a bare forward over the same tokens, and a full-split
``base`` evaluation's wall time. Embedded SmolLM2-135M, household world, 2 threads.

Run, all three (the full split takes several minutes per layout):
``python -m pytest benchmarks/bench_kv_reuse.py --benchmark-only -q -s``
or one: ``-k tokens``, ``-k latency``, ``-k full_split``. ``ARENA_BENCH_LAYOUTS=transcript:changes``
picks the layouts of the first two (``layout[:admissible_turns]``, comma-separated),
``ARENA_BENCH_FULL`` the full split's (default ``window``, the default layout).

Definitions (per ``choose`` call, i.e. per step):
- *appended*: tokens of the step's prompt after its longest common prefix with the previous step's
  prompt of the same episode (what a perfect cache would have to compute);
- *new information*: the previous action and the observation it got, tokenised alone (the issue's
  22.4 tokens a step; admissible-action lists and chat markup are not counted);
- *computed*: prompt tokens the backend ran through the model (the prefix cache's count).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.testing import ChoiceRecorder, RecordedChoice

os.environ.setdefault("HF_HUB_OFFLINE", "1")
LAYOUTS = os.environ.get("ARENA_BENCH_LAYOUTS", "window,transcript:full,transcript:changes").split(",")
COMMON = ["embedder.name=hashing", "eval.concurrency=8", "llm.threads=2"]


def layout_overrides(spec: str) -> list[str]:
    layout, _, turns = spec.partition(":")
    return [f"solver.layout={layout}"] + ([f"solver.admissible_turns={turns}"] if turns else [])


def recorded_run(tmp_path: Path, spec: str, extra: list[str]) -> tuple[ChoiceRecorder, dict[str, Any], Path]:
    plugins = Plugins()
    plugins.load_defaults()
    recorder = ChoiceRecorder(plugins)
    overrides = [*COMMON, "llm.backend=recording", *layout_overrides(spec), *extra]
    out = tmp_path / f"{spec.replace(':', '-')}-{time.time_ns()}"
    _, results = protocol.run("base", overrides=overrides, out=out, plugins=plugins)
    return recorder, results, out


def ids(call: RecordedChoice) -> list[int]:
    return call.choice.prompt_token_ids


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def step_figures(recorder: ChoiceRecorder, run_dir: Path) -> dict[str, float]:
    """Mean appended, new-information and computed tokens per step (episodes told apart by their
    task message; ``base`` shows no experiences, so that is the first observation)."""
    import json

    backend = recorder.backends[-1]
    by_episode: dict[str, list[RecordedChoice]] = {}
    for call in recorder.calls:
        first_user = next(m["content"] for m in call.prompt if m["role"] == "user")
        for marker in ("\n\nRecent steps:", "\n\nCurrent observation:", "\n\nAdmissible actions"):
            first_user = first_user.split(marker)[0]  # the task alone, in either layout
        by_episode.setdefault(first_user, []).append(call)
    appended = [len(ids(later)) - shared_prefix(ids(earlier), ids(later))
                for calls in by_episode.values() for earlier, later in zip(calls, calls[1:])]
    information = [
        len(backend.tokenizer(step["action"] + "\n" + step["observation"]).input_ids)
        for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
        for step in json.loads(line)["steps"]
    ]
    steps = len(recorder.calls)
    return {"steps": steps, "appended": statistics.mean(appended), "information": statistics.mean(information),
            "computed": backend.prefix_cache_stats["tokens_computed"] / steps,
            "prompt": statistics.mean(len(ids(c)) for c in recorder.calls),
            "cache_mb": backend.prefix_cache_memory()["bytes"] / 2**20}


def test_tokens_computed_per_step_against_tokens_appended(benchmark, tmp_path):
    """Goal: computed <= 1.3 x appended in the transcript layout."""
    figures = {}

    def measure() -> None:
        for spec in LAYOUTS:
            recorder, _, out = recorded_run(tmp_path, spec, ["eval.limit=4"])
            figures[spec] = step_figures(recorder, out)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    for spec, f in figures.items():
        benchmark.extra_info[spec] = f
        print(f"\n{spec:20s} {f['steps']} steps: prompt {f['prompt']:.0f} tokens, computed "
              f"{f['computed']:.1f}/step, appended {f['appended']:.1f}/step, new information "
              f"{f['information']:.1f}/step; computed/appended {f['computed'] / f['appended']:.2f}, "
              f"computed/information {f['computed'] / f['information']:.2f}; cache holds "
              f"{f['cache_mb']:.0f} MB at the end (8 episodes side by side)")


def test_step_latency_against_a_bare_forward(benchmark, tmp_path):
    """Goal: bare / harness >= 0.8. The bare forward is one ``model(...)`` call over exactly the
    tokens the harness computes for that step (the prompt's uncached tokens, then the option
    tree's nodes as a plain sequence) on the same cached prefix; the harness adds the cache
    lookup, the tree mask, the option log-probs and the choice."""
    from transformers import DynamicCache

    from arena.backends.transformers_backend import _OptionTree

    results = {}

    def measure() -> None:
        for spec in LAYOUTS:
            recorder, _, _ = recorded_run(tmp_path, spec, ["eval.limit=2", "eval.concurrency=1"])
            backend = recorder.backends[-1]
            harness_s = sum(c.seconds for c in recorder.calls[1:])
            bare_s, previous = 0.0, recorder.calls[0]
            for call in recorder.calls[1:]:
                reused = min(shared_prefix(ids(previous), ids(call)), len(ids(call)) - 1)
                tree = _OptionTree([backend._encode_option(o) for o in call.options])
                with torch.inference_mode():
                    cache = DynamicCache(config=backend.model.config)
                    backend.model(input_ids=torch.tensor([ids(call)[:reused]]), past_key_values=cache,
                                  use_cache=True, logits_to_keep=1)
                    tokens = torch.tensor([ids(call)[reused:] + tree.tokens])
                    started = time.perf_counter()
                    backend.model(input_ids=tokens, past_key_values=cache, use_cache=True,
                                  logits_to_keep=1 + len(tree.tokens))
                    bare_s += time.perf_counter() - started
                previous = call
            results[spec] = (bare_s, harness_s, len(recorder.calls) - 1)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    for spec, (bare_s, harness_s, steps) in results.items():
        benchmark.extra_info[spec] = {"bare_s": bare_s, "harness_s": harness_s, "ratio": bare_s / harness_s}
        print(f"\n{spec:20s} {steps} steps: harness {1000 * harness_s / steps:.1f} ms/step, bare forward "
              f"{1000 * bare_s / steps:.1f} ms/step: bare/harness {bare_s / harness_s:.2f}")


def test_full_split_base_evaluation(benchmark, tmp_path):
    """Goal: all 240 household test tasks, one seed, in 10 minutes or less on 2 cores."""
    spec = os.environ.get("ARENA_BENCH_FULL", "window")  # the default layout
    results: dict[str, Any] = {}

    def measure() -> None:
        _, results["r"], _ = recorded_run(tmp_path, spec, ["eval.limit=null"])

    benchmark.pedantic(measure, rounds=1, iterations=1)
    evaluate = results["r"]["cost"]["evaluate"]
    splits = results["r"]["splits"]
    episodes = sum(s["n_episodes"] for s in splits.values())
    benchmark.extra_info.update(layout=spec, evaluate_wall_s=evaluate["wall_s"], episodes=episodes)
    print(f"\nfull split ({spec}): {episodes} episodes in {evaluate['wall_s']:.0f} s of evaluation "
          f"({evaluate['wall_s'] / 60:.1f} min); success " +
          ", ".join(f"{name} {s['success_rate']:.3f}" for name, s in splits.items()))


def test_many_long_episodes_reuse_their_own_prefix(benchmark, monkeypatch):
    """Eight episodes side by side whose prompts carry three retrieved experiences of about 750
    characters (a memory method's evaluation: MemRL, RAG), scored step after step with the
    prefix cache's automatic bound, first as the cache now keeps entries (a step's entry replaces
    the one it was served by, ``SUPERSEDED``), then as it kept them before (both, the served one
    renewed). Reported: prompt tokens computed per step and seconds per step of each.
    ``ARENA_BENCH_MODEL=tiny ARENA_BENCH_CACHE_TOKENS=11676`` counts the same tokens in seconds
    (the tiny model, with the cache bound the embedded model's ``auto`` gives in float32)."""
    from arena.backends import transformers_backend
    from arena.backends.transformers_backend import TransformersBackend
    from arena.core.contract.llm import SamplingParams
    from arena.core.contract.types import Experience, Observation, Provenance, Step, Task, Trajectory
    from arena.core.execution.solver import build_prompt

    llm = TransformersBackend({"model": os.environ.get("ARENA_BENCH_MODEL", "embedded"), "dtype": "float32",
                               "threads": 2, "prefix_cache_tokens": int(os.environ.get("ARENA_BENCH_CACHE_TOKENS", 0))
                               or "auto"})
    places = [f"{p} {n}" for p in ("cabinet", "countertop", "drawer", "fridge", "shelf") for n in (1, 2, 3)]

    def experience(k: int, j: int) -> Experience:
        loop = "; ".join(f"go to {places[(k + j + i) % len(places)]}" for i in range(40))
        text = (f"FAILED experience (pattern to avoid). Task: put a clean mug {k}{j} in coffeemachine 1.\n"
                f"Reflection: the mug was in sinkbasin {j}, never looked at.\nFailed actions: {loop}")
        return Experience(kind="memory", text=text[:750], provenance=Provenance((f"train/{k}{j}",), "train"))

    episodes = [(Task(f"test/{k}", "household", "test_seen", "pick_clean_then_place_in_recep",
                      f"put a clean mug in coffeemachine {k}."), [experience(k, j) for j in range(3)])
                for k in range(8)]

    def prompts(step: int) -> list[tuple[list[dict[str, str]], list[str]]]:
        shown = []
        for task, experiences in episodes:
            trajectory = Trajectory(task=task, initial_observation="You are in the middle of a room.")
            for i in range(step):
                place = places[(i * 7 + len(task.goal)) % len(places)]
                trajectory.steps.append(Step(action=f"go to {place}", valid=True,
                                             observation=f"You arrive at {place}. On it, you see a mug {i}."))
            admissible = tuple(f"go to {p}" for p in places) + ("look", "inventory")
            chat = build_prompt(task, Observation(text="", admissible_actions=admissible), trajectory,
                                experiences, history=2, show_admissible=True, max_experiences=4,
                                max_experience_chars=800)
            shown.append((chat, list(admissible)))
        return shown

    figures: dict[str, dict[str, float]] = {}

    def measure() -> None:
        for policy, superseded in (("replaces", transformers_backend.SUPERSEDED), ("keeps both", float("inf"))):
            monkeypatch.setattr(transformers_backend, "SUPERSEDED", superseded)
            llm.drop_cached_states()
            before = dict(llm.prefix_cache_stats)
            started, steps = time.perf_counter(), 0
            for step in range(6):
                for chat, options in prompts(step):
                    llm.choose([chat], [options], SamplingParams())
                    steps += 1
            stats = llm.prefix_cache_stats
            figures[policy] = {"computed_per_step": (stats["tokens_computed"] - before["tokens_computed"]) / steps,
                               "reused_per_step": (stats["tokens_reused"] - before["tokens_reused"]) / steps,
                               "s_per_step": (time.perf_counter() - started) / steps}

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    for policy, f in figures.items():
        print(f"\n{policy:10s}: computed {f['computed_per_step']:.0f} prompt tokens/step, reused "
              f"{f['reused_per_step']:.0f}, {f['s_per_step']:.2f} s/step")
    assert figures["replaces"]["computed_per_step"] <= figures["keeps both"]["computed_per_step"]
