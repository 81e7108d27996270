"""A KV cache for decoding that writes each new token's keys and values in place.

transformers' ``DynamicCache`` appends a decoding step's states with ``torch.cat``, which copies
the whole cache of every layer at every step. For the long prompts a method writes from (an
Evolving-RL card: 8 to 16 prompts of some 1,500 tokens) that copy was 47 % of a decoding step,
more than the weights' matrix products (a torch profile of SmolLM2-135M in float32 on one CPU
thread, 8 prompts of 1,500 tokens: ``aten::cat`` 175 ms of a 370 ms step; docs/speed.md). Here each layer holds buffers
sized for the prompt and the reply from the start, and attention reads a view of the part
written so far: the same keys and values in the same order, so the same results bit for bit
(``tests/test_backend_transformers.py``).

Imported where a decode starts, not with the backend: transformers must not load before
:func:`arena.core.host.torch_utils.transformers_without_sklearn` has run.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A full-attention layer's cache in buffers of ``capacity`` positions, grown (doubled) only
    if a caller feeds more than it reserved. The states written so far are ``keys`` and
    ``values``, views of the buffers; where a cache operation replaced them (``crop`` keeps a
    view, ``reorder_cache`` makes new tensors) the next update goes on from what they hold."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if not self._views_of_buffers() or end > cast(torch.Tensor, self._key_buffer).shape[-2]:
            self._move_to_buffers(key_states, value_states, start, max(end, 2 * start, self.capacity))
        keys, values = cast(torch.Tensor, self._key_buffer), cast(torch.Tensor, self._value_buffer)
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values

    def _views_of_buffers(self) -> bool:
        return (self._key_buffer is not None and self._value_buffer is not None
                and self.keys is not None and self.values is not None
                and self.keys.data_ptr() == self._key_buffer.data_ptr()
                and self.values.data_ptr() == self._value_buffer.data_ptr())

    def _move_to_buffers(self, key_states: torch.Tensor, value_states: torch.Tensor, start: int,
                         capacity: int) -> None:
        """Fresh buffers of ``capacity`` positions holding the ``start`` states written so far."""

        def buffer(new: torch.Tensor, held: torch.Tensor | None) -> torch.Tensor:
            fresh = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
            if start and held is not None:
                fresh[:, :, :start] = held
            return fresh

        self._key_buffer = buffer(key_states, self.keys)
        self._value_buffer = buffer(value_states, self.values)


def reserved_cache(config: Any, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers reserve ``capacity``
    positions (prompt width + reply tokens); other layer kinds (sliding windows) stay as
    transformers makes them."""
    cache = DynamicCache(config=config)
    cache.layers = [ReservedLayer(capacity) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache
