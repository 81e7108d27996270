"""Grouped-query attention on a CPU without copying the KV heads (arena.backends.cpu_attention):
the same generations and scores bit for bit as transformers' ``sdpa``, and training untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arena.backends import cpu_attention
from arena.backends.transformers_backend import TransformersBackend
from arena.core.contract.llm import SamplingParams

#: Prompts of different lengths, so the batch is left-padded and every call carries a mask.
CHATS = [[{"role": "user", "content": "Go to the fridge " * repeat + f"and open it ({repeat})."}]
         for repeat in (1, 9, 30)]
OPTIONS = [["open fridge 1", "go to fridge 1", "look"]] * len(CHATS)


def outputs(llm: TransformersBackend) -> list[Any]:
    greedy = llm.generate(CHATS, SamplingParams(max_new_tokens=24))
    sampled = llm.generate(CHATS, SamplingParams(temperature=1.0, max_new_tokens=24, seed=7))
    chosen = llm.choose(CHATS, OPTIONS, SamplingParams())
    return ([(g.token_ids, g.logprobs) for g in greedy + sampled]
            + [(c.index, c.option_logprobs, c.logprobs) for c in chosen])


@pytest.fixture(scope="module")
def llm() -> TransformersBackend:
    backend = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": False, "batch_size": 8})
    shape = backend.model.config
    assert shape.num_key_value_heads < shape.num_attention_heads  # grouped, or there is nothing to test
    return backend


def test_the_backend_serves_through_it_and_gives_transformers_numbers_bit_for_bit(llm: TransformersBackend) -> None:
    assert llm.model.config._attn_implementation == cpu_attention.CPU_SDPA
    ours = outputs(llm)
    llm.model.set_attn_implementation("sdpa")
    assert llm.model.config._attn_implementation == "sdpa"
    try:
        theirs = outputs(llm)
    finally:
        cpu_attention.use_on(llm.model)
    assert ours == theirs  # token ids, sampled ones too, and every log-prob, exactly


def test_training_and_unmasked_calls_keep_transformers_attention(llm: TransformersBackend,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With gradients on (a trainer's forward) or without a mask, the call goes to transformers'
    own ``sdpa``; only masked inference shares the heads in place."""
    from transformers.integrations import sdpa_attention

    calls: list[bool] = []
    stock = sdpa_attention.sdpa_attention_forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(torch.is_grad_enabled())
        return stock(*args, **kwargs)

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", counted)
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    layers = llm.model.config.num_hidden_layers
    with torch.inference_mode():
        llm.model(input_ids=ids, attention_mask=mask)
        assert calls == []
        llm.model(input_ids=ids[1:], attention_mask=mask[1:])  # no padding: transformers passes no mask
    llm.model.train()
    try:
        llm.model(input_ids=ids, attention_mask=mask).logits.sum().backward()
    finally:
        llm.model.eval()
        llm.model.zero_grad(set_to_none=True)
    assert calls == [False] * layers + [True] * layers, calls


def test_a_model_it_does_not_apply_to_is_left_as_it_is() -> None:
    class Model:
        class config:  # a stand-in for a PretrainedConfig
            _attn_implementation = "eager"

        device = torch.device("cpu")

    assert cpu_attention.use_on(Model()) is False
    assert Model.config._attn_implementation == "eager"
