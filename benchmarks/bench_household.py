"""Speed of the household world (not part of the test suite).

Run: ``python -m pytest benchmarks/bench_household.py --benchmark-only -q``. Each benchmark
prints its throughput; the goal is at least 20,000 steps per second on one core.
"""

from __future__ import annotations

import pytest

from arena.envs.household import HouseholdEnvironment, HouseholdEpisode
from arena.testing import expert_play, random_play

STEPS_PER_ROUND = 20_000
EPISODES_PER_ROUND = 200


@pytest.fixture(scope="module")
def episodes() -> list[HouseholdEpisode]:
    env = HouseholdEnvironment()
    return [env.open(task) for task in env.tasks("train")[:EPISODES_PER_ROUND]]


def test_random_steps_per_second(benchmark, episodes: list[HouseholdEpisode]) -> None:
    taken = benchmark(random_play, episodes, STEPS_PER_ROUND, 0)
    rate = taken / benchmark.stats.stats.mean
    benchmark.extra_info["steps_per_second"] = round(rate)
    print(f"\nhousehold: {rate:,.0f} random steps/s")
    assert rate >= 20_000


def test_expert_episodes_per_second(benchmark, episodes: list[HouseholdEpisode]) -> None:
    won = benchmark(expert_play, episodes)
    rate = won / benchmark.stats.stats.mean
    benchmark.extra_info["expert_episodes_per_second"] = round(rate)
    print(f"\nhousehold: {rate:,.0f} expert episodes/s")
    assert won == len(episodes)
