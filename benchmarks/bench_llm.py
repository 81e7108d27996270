"""Speed of the embedded model through the transformers backend (not part of the test suite).

Run: ``HF_HUB_OFFLINE=1 pytest benchmarks/bench_llm.py --benchmark-columns=mean,stddev,rounds``

Prompts look like an agent step in a text game: a system message and a user message with goal,
recent history and the admissible actions (about 265 prompt tokens), and 25 options of about 6
tokens each. Both dtypes are measured because ``dtype: auto`` picks between them on this basis.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from arena.backends.transformers_backend import TransformersBackend
from arena.core.contract.llm import Chat, SamplingParams

SYSTEM = (
    "You are an agent in a household text game. Pick one admissible action; reply with it only."
)
PLACES = ["cabinet", "countertop", "drawer", "fridge", "shelf", "sinkbasin", "stoveburner"]
OBJECTS = ["apple", "mug", "knife", "plate", "tomato", "spatula", "egg", "bread"]


def options_for(step: int) -> list[str]:
    """25 admissible actions of 4 to 8 tokens, varied per prompt like a real game."""
    actions = [f"go to {PLACES[(step + k) % len(PLACES)]} {k % 4 + 1}" for k in range(10)]
    actions += [f"take {OBJECTS[(step + k) % len(OBJECTS)]} {k + 1} from desk 1" for k in range(8)]
    actions += [f"open {PLACES[k % len(PLACES)]} {k + 2}" for k in range(4)]
    return actions + ["look", "inventory", f"examine {OBJECTS[step % len(OBJECTS)]} 1"]


def prompt_for(step: int) -> Chat:
    history = "\n".join(
        f"> go to {PLACES[(step + k) % len(PLACES)]} {k + 1}\nYou arrive at "
        f"{PLACES[(step + k) % len(PLACES)]} {k + 1}. On it, you see a {OBJECTS[k % len(OBJECTS)]} "
        f"{k + 1}, and a {OBJECTS[(k + 3) % len(OBJECTS)]} 2."
        for k in range(1)
    )
    user = (
        f"Your task is to: put a clean {OBJECTS[step % len(OBJECTS)]} in the fridge.\n"
        f"Recent history:\n{history}\n"
        f"Admissible actions: {', '.join(options_for(step))}.\nYour next action:"
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def backend(request: pytest.FixtureRequest) -> TransformersBackend:
    return TransformersBackend({"model": "embedded", "dtype": request.param, "batch_size": 8})


@pytest.mark.parametrize("batch", [1, 8])
def test_choose(benchmark, backend: TransformersBackend, batch: int) -> None:
    prompts = [prompt_for(step) for step in range(batch)]
    options = [options_for(step) for step in range(batch)]
    results = benchmark.pedantic(
        backend.choose, args=(prompts, options, SamplingParams()), rounds=3, warmup_rounds=1
    )
    assert all(r.text in opts for r, opts in zip(results, options))
    benchmark.extra_info["prompt_tokens"] = [r.tokens_in for r in results]


@pytest.mark.parametrize("batch", [1, 8])
def test_generate_64(benchmark, backend: TransformersBackend, batch: int) -> None:
    prompts = [prompt_for(step) for step in range(batch)]
    # greedy: the same replies every round, and on these prompts none stops before 64 tokens
    params = SamplingParams(max_new_tokens=64)
    results = benchmark.pedantic(
        backend.generate, args=(prompts, params), rounds=2, warmup_rounds=1
    )
    benchmark.extra_info["tokens_out"] = [r.tokens_out for r in results]


def long_prompt_for(step: int) -> Chat:
    """A card-writing prompt's size: a played episode's transcript, about 1,500 tokens."""
    lines = [f"> go to {PLACES[(step + k) % len(PLACES)]} {k % 4 + 1}\nYou arrive at "
             f"{PLACES[(step + k) % len(PLACES)]} {k % 4 + 1}. On it, you see a "
             f"{OBJECTS[(step + k) % len(OBJECTS)]} {k % 3 + 1}." for k in range(50)]
    user = "Write a skill card from this episode.\n" + "\n".join(lines)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


@pytest.mark.parametrize("cache", ["in_place", "concatenated"])
def test_generate_from_long_prompts(benchmark, cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 prompts of ~1,500 tokens, 64 greedy tokens, float32: the decode cache written in place
    (arena.backends.reserved_cache) against transformers' DynamicCache, which copies it per step."""
    from arena.backends import reserved_cache

    if cache == "concatenated":
        monkeypatch.setattr(reserved_cache, "reserved_cache", lambda config, capacity: None)
    backend = TransformersBackend({"model": "embedded", "dtype": "float32", "batch_size": 8})
    prompts = [long_prompt_for(step) for step in range(8)]
    results = benchmark.pedantic(backend.generate, args=(prompts, SamplingParams(max_new_tokens=64)),
                                 rounds=2, warmup_rounds=1)
    benchmark.extra_info["prompt_tokens"] = [r.tokens_in for r in results]
    benchmark.extra_info["tokens_out"] = [r.tokens_out for r in results]
