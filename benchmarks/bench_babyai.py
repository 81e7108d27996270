"""Speed of BabyAI-Text (not part of the test suite).

Run: ``python -m pytest benchmarks/bench_babyai.py --benchmark-only -s``. Each benchmark prints
its throughput; the goal is at least 5,000 steps per second on one core (random admissible
commands, resets included), so the environment never dominates a CPU run. Most of a step is
minigrid's own egocentric view (``gen_obs``); the text rendering is about a tenth.
"""

from __future__ import annotations

import random

import pytest

from arena.envs.babyai.environment import BabyAIEnvironment, BabyAIEpisode

STEPS_PER_ROUND = 10_000
EPISODES_PER_ROUND = 100


@pytest.fixture(scope="module")
def episodes() -> list[BabyAIEpisode]:
    env = BabyAIEnvironment(n_train=EPISODES_PER_ROUND)
    return [env.open(task) for task in env.tasks("train")]


def random_play(episodes: list[BabyAIEpisode], steps: int, seed: int) -> int:
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


def expert_play(episodes: list[BabyAIEpisode]) -> int:
    """Every episode solved by minigrid's BabyAI bot from a reset; returns episodes won."""
    won = 0
    for episode in episodes:
        observation = episode.reset()
        while not observation.done:
            observation = episode.step(episode.expert_action() or "")
        won += observation.won
    return won


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
