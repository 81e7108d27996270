"""Speed of BabyAI-Text (not part of the test suite).

Run: ``python -m pytest benchmarks/bench_babyai.py --benchmark-only -s``. Each benchmark prints
its throughput; the goal is at least 5,000 steps per second on one core (random admissible
commands, resets included), so the environment never dominates a CPU run. A step is minigrid's
rules, Arena's view of the grid (``arena/envs/babyai/view.py``) and its text; a reset is
minigrid's level generator.
"""

from __future__ import annotations

import pytest

from arena.envs.babyai.environment import BabyAIEnvironment, BabyAIEpisode
from arena.testing import expert_play, random_play

STEPS_PER_ROUND = 10_000
EPISODES_PER_ROUND = 100


@pytest.fixture(scope="module")
def episodes() -> list[BabyAIEpisode]:
    env = BabyAIEnvironment(n_train=EPISODES_PER_ROUND)
    return [env.open(task) for task in env.tasks("train")]


def test_random_steps_per_second(benchmark, episodes: list[BabyAIEpisode]) -> None:
    taken = benchmark(random_play, episodes, STEPS_PER_ROUND, 0)
    rate = taken / benchmark.stats.stats.mean
    benchmark.extra_info["steps_per_second"] = round(rate)
    print(f"\nbabyai: {rate:,.0f} random steps/s (resets included)")
    assert rate >= 5_000


def test_expert_episodes_per_second(benchmark, episodes: list[BabyAIEpisode]) -> None:
    won = benchmark(expert_play, episodes)
    rate = len(episodes) / benchmark.stats.stats.mean
    benchmark.extra_info["episodes_per_second"] = round(rate)
    print(f"\nbabyai: {rate:,.0f} expert episodes/s")
    assert won == len(episodes)
