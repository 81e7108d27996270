"""Small torch helpers shared by backends and trainers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout), then restore whatever mode the model was in: a trainer and
    a backend share one module, and neither may leave the other's mode changed."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


