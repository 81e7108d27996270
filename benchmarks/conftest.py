"""Shared setup of the benchmarks (not part of the test suite).

Every benchmark reads the timings pytest-benchmark measured (``benchmark.stats``) to print and
check its rate. Under ``--benchmark-disable`` nothing is timed and ``benchmark.stats`` is None, so
such a run would fail on the missing figures rather than on the code; it skips instead and says
how to run the benchmarks.
"""

from __future__ import annotations

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "benchmark" in getattr(item, "fixturenames", ()) and item.config.getoption(
        "benchmark_disable", default=False
    ):
        pytest.skip(
            "this benchmark checks measured timings, which --benchmark-disable turns off; "
            "run it with --benchmark-only"
        )
