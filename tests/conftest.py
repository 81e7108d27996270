"""Shared fixtures: offline settings, fresh plugins, and fast run overrides."""

from __future__ import annotations

import os
import sys
import tempfile

#: Workers for ``-n auto`` (pytest-xdist, the second command of the README): one per core, at most
#: this many, since each holds torch and a model (1 to 2 GB) and starts its own subprocesses.
MAX_WORKERS = 4


def _cores() -> int:
    """The cores this process may use (all of them where the OS cannot say, as on macOS)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    # Each worker gets its share of the cores for torch's threads, and so do the runs it starts:
    # N workers with a thread per core each would spin against each other.
    _share = max(1, _cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    if "torch" in sys.modules:  # imported before this file (a pytest plugin): set it here too
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# The record key of this test session (arena.core.storage.integrity), never the user's own.
os.environ.setdefault("ARENA_RECORD_KEY_FILE",
                      os.path.join(tempfile.mkdtemp(prefix="arena-tests-"), "record.key"))

import pytest  # noqa: E402 (after the environment above)

# The helpers' asserts report as the test modules' do (before tests.helpers is first imported).
pytest.register_assert_rewrite("tests.helpers")

from arena.core.config.plugins import Plugins  # noqa: E402
from tests.helpers.overrides import FAST  # noqa: E402


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return min(MAX_WORKERS, _cores())


@pytest.fixture
def plugins() -> Plugins:
    """Built-in plugins only (no third-party entry points), fresh for each test."""
    loaded = Plugins()
    loaded.load_defaults()
    return loaded


@pytest.fixture
def fast() -> list[str]:
    return list(FAST)
