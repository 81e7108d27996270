"""Small torch helpers shared by backends and trainers."""

from __future__ import annotations

import sys
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


def transformers_without_sklearn() -> None:
    """Keep transformers from importing scikit-learn (with SciPy and pandas: 0.14 GB resident).

    transformers imports ``sklearn.metrics`` when its model classes load, for one feature Arena
    never uses (the confidence threshold of assisted decoding, which then reports scikit-learn
    as missing). Call before the first model class is imported; afterwards it changes nothing.
    """
    if "transformers.generation.candidate_generator" in sys.modules:
        return
    import transformers.utils
    import transformers.utils.import_utils

    def unavailable() -> bool:
        return False

    transformers.utils.is_sklearn_available = unavailable
    transformers.utils.import_utils.is_sklearn_available = unavailable
