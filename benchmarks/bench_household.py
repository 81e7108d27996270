"""Speed of the household world (not part of the test suite).

Run: ``python -m pytest benchmarks/bench_household.py --benchmark-only -q``. Each benchmark
prints its throughput; the goal is at least 20,000 steps per second on one core.
"""

from __future__ import annotations

import random

import pytest

from arena.envs.household import HouseholdEnvironment, HouseholdEpisode

STEPS_PER_ROUND = 20_000
EPISODES_PER_ROUND = 200


@pytest.fixture(scope="module")
def episodes() -> list[HouseholdEpisode]:
    env = HouseholdEnvironment()
    return [env.open(task) for task in env.tasks("train")[:EPISODES_PER_ROUND]]


def random_play(episodes: list[HouseholdEpisode], steps: int, seed: int) -> int:
    """Random admissible commands, resetting each finished game; returns steps taken."""
    rng = random.Random(seed)
    per_episode = steps // len(episodes)
    taken = 0
    for episode in episodes:
        observation = episode.reset()
        for _ in range(per_episode):
            observation = episode.step(rng.choice(observation.admissible_actions))
            taken += 1
            if observation.done:
                observation = episode.reset()
    return taken


def expert_play(episodes: list[HouseholdEpisode]) -> int:
    """Every episode solved by the expert from a reset; returns episodes won."""
    won = 0
    for episode in episodes:
        observation = episode.reset()
        while not observation.done:
            observation = episode.step(episode.expert_action())
        won += observation.won
    return won


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
