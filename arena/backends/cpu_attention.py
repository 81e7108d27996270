"""Grouped-query attention on a CPU without copying the key/value heads.

transformers' ``sdpa`` attention copies each key/value head once per query head of its group
(``repeat_kv``) whenever a mask is given, because CUDA's fast kernels refuse a mask with
``enable_gqa``. Arena always gives one (its prompts are left-padded), so every decoding step
wrote three copies of the whole KV cache: for SmolLM2 (9 query heads, 3 key/value heads) and 8
prompts of 1,500 tokens, 55 MB a layer, 1.7 GB a generated token, nearly half of decoding's time
on 2 cores. PyTorch's CPU kernel takes the mask and ``enable_gqa`` together and reads the shared head
in place, with the same results bit for bit (``tests/test_cpu_attention.py``).

Only inference on a CPU goes this way; training (gradients on) and other devices keep
transformers' own path, so a trainer's numerics do not change.
"""

from __future__ import annotations

from typing import Any

import torch

#: The attention implementation's name, registered with transformers as :func:`use_on` first needs it.
CPU_SDPA = "arena_cpu_sdpa"


#: transformers' ``sdpa_attention`` module, imported once by :func:`_register` (not at import:
#: transformers must not load before ``transformers_without_sklearn``) rather than at every layer
#: of every step; its function is looked up per call, so a test can wrap it.
_sdpa: Any = None


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    grouped = key.shape[1] != query.shape[1]
    if (not grouped or attention_mask is None or query.device.type != "cpu" or torch.is_grad_enabled()
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):
        return _sdpa.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                            scaling=scaling, is_causal=is_causal, **kwargs)
    # transformers' own call with a mask (is_causal is then False), the heads shared in place.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False,
        enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def _register() -> None:
    global _sdpa
    from transformers import AttentionInterface
    from transformers.integrations import sdpa_attention
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    _sdpa = sdpa_attention
    AttentionInterface.register(CPU_SDPA, _attention)
    AttentionMaskInterface.register(CPU_SDPA, sdpa_mask)  # the very masks ``sdpa`` is given


def use_on(model: Any) -> bool:
    """Serve ``model`` (on a CPU, with transformers' ``sdpa`` attention) through :data:`CPU_SDPA`;
    False, changing nothing, for a model on another device or with another attention."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or model.device.type != "cpu":
        return False
    _register()
    model.set_attn_implementation(CPU_SDPA)
    return True
