"""Shared fixtures: offline settings, fresh plugins, and fast run overrides."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# The record key of this test session (arena.core.storage.integrity), never the user's own.
os.environ.setdefault("ARENA_RECORD_KEY_FILE",
                      os.path.join(tempfile.mkdtemp(prefix="arena-tests-"), "record.key"))

import pytest

# The helpers' asserts report as the test modules' do (before tests.helpers is first imported).
pytest.register_assert_rewrite("tests.helpers")

from arena.core.config.plugins import Plugins  # noqa: E402
from tests.helpers.overrides import FAST  # noqa: E402


@pytest.fixture
def plugins() -> Plugins:
    """Built-in plugins only (no third-party entry points), fresh for each test."""
    loaded = Plugins()
    loaded.load_defaults()
    return loaded


@pytest.fixture
def fast() -> list[str]:
    return list(FAST)
