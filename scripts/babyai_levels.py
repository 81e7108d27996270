"""Measure every BabyAI level of the ladder with model-free players: minigrid's bot (the expert)
and a uniform random policy over the admissible commands.

    python scripts/babyai_levels.py [--tasks 100] [--levels GoToObj Pickup ...]

Prints the markdown table of docs/babyai.md: each level's own step limit, the expert's success
and its steps when it wins (mean and most), and the random policy's success within the level's
limit and within 30 steps.
Tasks are drawn as test_unseen draws them (their own seed range), ``--tasks`` per level. The
nine-room levels take minutes each: the bot searches the whole maze at every step.
"""

from __future__ import annotations

import argparse
import random
import statistics

from arena.envs.babyai.environment import BabyAIEnvironment
from arena.envs.babyai.levels import LADDER
from arena.testing import expert_episode


def measure(level: str, tasks: int) -> dict[str, float]:
    other = "GoToLocal" if level == "GoToObj" else "GoToObj"  # seen levels are not measured
    env = BabyAIEnvironment(n_train=0, n_valid=0, n_test=tasks, seen_levels=(other,), unseen_levels=(level,))
    limits, expert, won, won_early, expert_won = [], [], 0, 0, 0
    for task in env.tasks("test_unseen"):
        limits.append(int(task.payload["max_steps"]))
        episode = env.open(task)
        observation, steps = expert_episode(episode)
        expert_won += observation.won
        if observation.won:
            expert.append(steps)
        rng = random.Random(int(task.payload["seed"]))
        observation, steps = episode.reset(), 0
        while not observation.done:
            observation = episode.step(rng.choice(observation.admissible_actions))
            steps += 1
        won += observation.won
        won_early += observation.won and steps <= 30
    return {"limit": statistics.mean(limits), "expert_success": expert_won / tasks,
            "expert": statistics.mean(expert), "expert_max": max(expert),
            "random": won / tasks, "random_30": won_early / tasks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100, help="tasks per level")
    parser.add_argument("--levels", nargs="*", help="levels to measure (default: the whole ladder)")
    args = parser.parse_args()
    print("| level | family | step limit | expert success | expert steps when it wins: mean (most) | "
          "random success, own limit | random success within 30 steps |")
    print("|---|---|---|---|---|---|---|")
    for level in LADDER:
        if args.levels and level.name not in args.levels:
            continue
        row = measure(level.name, args.tasks)
        print(f"| {level.name} | {level.family} | {row['limit']:.0f} | {row['expert_success']:.0%} | "
              f"{row['expert']:.1f} ({row['expert_max']}) | "
              f"{row['random']:.0%} | {row['random_30']:.0%} |", flush=True)


if __name__ == "__main__":
    main()
