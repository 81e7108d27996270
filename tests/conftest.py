"""Shared fixtures: offline settings, fresh plugins, and fast run overrides."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

import pytest  # noqa: E402

from arena.core.plugins import Plugins  # noqa: E402

#: A small household world, the fake LLM and the model-free embedder: a whole run in a second.
FAST = [
    "llm.backend=fake",
    "eval.limit=null",
    "embedder.name=hashing",
    "env.n_train=60",
    "env.n_valid=12",
    "env.n_test=12",
    "eval.max_steps=12",
    "eval.concurrency=2",
]


@pytest.fixture
def plugins() -> Plugins:
    """Built-in plugins only (no third-party entry points), fresh for each test."""
    loaded = Plugins()
    loaded.load_defaults()
    return loaded


@pytest.fixture
def fast() -> list[str]:
    return list(FAST)
