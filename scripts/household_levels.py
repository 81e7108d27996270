"""Measure each household level with model-free players: the expert and a uniform random policy.

    python scripts/household_levels.py [--tasks 120] [--max-steps 30] [--seeds 0 1 2 3 4]

Prints a markdown table per split (the one in docs/household_levels.md): receptacles per room,
admissible actions per step, the expert's steps and success, and a random policy's success at the
step limit; then the random policy's success per task type of the test splits, and how many of a
split's games are distinct and how many are train games (none since world 2.0). The embedded
model's ``base`` success comes from ``arena run`` (see that page).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict

from arena.envs.household.environment import HouseholdEnvironment
from arena.envs.household.levels import LEVELS

SPLITS = ("train", "test_seen", "test_unseen")


def expert_episode(env: HouseholdEnvironment, task, max_steps: int) -> tuple[bool, int, float]:
    """(won, steps, mean admissible actions) of the expert on ``task``."""
    episode = env.open(task)
    observation = episode.reset()
    sizes = []
    for step in range(1, max_steps + 1):
        sizes.append(len(observation.admissible_actions))
        action = episode.expert_action()
        if action is None:
            return False, step, statistics.fmean(sizes)
        observation = episode.step(action)
        if observation.won:
            return True, step, statistics.fmean(sizes)
    return False, max_steps, statistics.fmean(sizes)


def random_episode(env: HouseholdEnvironment, task, max_steps: int, rng: random.Random) -> bool:
    episode = env.open(task)
    observation = episode.reset()
    for _ in range(max_steps):
        observation = episode.step(rng.choice(observation.admissible_actions))
        if observation.won:
            return True
    return False


def measure(level: str, split: str, n_tasks: int, max_steps: int, seeds: list[int]) -> dict:
    env = HouseholdEnvironment(level=level, n_train=n_tasks, n_valid=0, n_test=n_tasks)
    tasks = env.tasks(split)
    expert = [expert_episode(env, task, max_steps) for task in tasks]
    wins = 0
    by_type: dict[str, list[bool]] = defaultdict(list)
    for seed in seeds:
        rng = random.Random(seed)
        for task in tasks:
            won = random_episode(env, task, max_steps, rng)
            by_type[task.task_type].append(won)
            wins += won
    games = [env.game_identity(task) for task in tasks]
    train = {env.game_identity(task) for task in HouseholdEnvironment(level=level).tasks("train")}
    receptacles = [len(env.open(task).world.layout.receptacles) for task in tasks]
    return {
        "receptacles": statistics.fmean(receptacles),
        "admissible": statistics.fmean(size for _, _, size in expert),
        "expert_success": sum(won for won, _, _ in expert) / len(tasks),
        "expert_steps": statistics.fmean(steps for won, steps, _ in expert if won),
        "random_success": wins / (len(tasks) * len(seeds)),
        "episodes": len(tasks) * len(seeds),
        "random_by_type": {kind: sum(won) / len(won) for kind, won in sorted(by_type.items())},
        "distinct_games": len(set(games)),
        "train_games": sum(game in train for game in games) if split != "train" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=120, help="tasks per split (default 120)")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    for split in SPLITS:
        print(f"\n{split} ({args.tasks} tasks; random policy: {len(args.seeds)} seeds, "
              f"{args.max_steps} steps)\n")
        print("| level | receptacles | admissible actions | expert success | expert steps "
              "| random success |")
        print("|---|---|---|---|---|---|")
        rows = {level: measure(level, split, args.tasks, args.max_steps, args.seeds) for level in LEVELS}
        for level, row in rows.items():
            print(
                f"| {level} | {row['receptacles']:.1f} | {row['admissible']:.1f} | "
                f"{row['expert_success']:.1%} | {row['expert_steps']:.1f} | "
                f"{row['random_success']:.1%} (n={row['episodes']}) |"
            )
        print(f"\n{split}: distinct games of {args.tasks}, and how many are games of the default train "
              "split (1,200)\n")
        for level, row in rows.items():
            print(f"- {level}: {row['distinct_games']} distinct, {row['train_games']} train games")
        if split == "train":
            continue
        print(f"\n{split}: random policy's success per task type\n")
        kinds = sorted({kind for row in rows.values() for kind in row["random_by_type"]})
        print("| level | " + " | ".join(kinds) + " |")
        print("|---|" + "---|" * len(kinds))
        for level, row in rows.items():
            print(f"| {level} | " + " | ".join(f"{row['random_by_type'][kind]:.1%}" for kind in kinds) + " |")


if __name__ == "__main__":
    main()
