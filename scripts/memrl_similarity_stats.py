"""Measure the similarity statistics MemRL's retrieval depends on, for the embedder Arena uses.

    python scripts/memrl_similarity_stats.py [--env-level hard] [--tasks 1200]

MemRL ranks the memories of recalled intents by ``0.5 z(sim) + 0.5 z(Q)``, where ``z(sim)``
standardises the cosine between the new task and a recalled intent with a fixed mean and std, and
it recalls an intent at cosine >= 0.5 and merges a new memory into an intent at >= 0.9. The
authors' mean 0.5187 and std 0.1203 sit beside text-embedding-3-large in
``configs/rl_alf_config.yaml:34-35`` of MemTensor/MemRL; no script there measures them. For
all-MiniLM-L6-v2 they are measured on Arena's own intents:

* the intents are the distinct goal texts of the train split (what a learned memory files under);
* mean and population std of the cosine over all pairs of different intents;
* both thresholds keep the authors' standardised position: recall at ``mean + z_recall * std``
  with ``z_recall = (0.5 - 0.5187) / 0.1203``, merge at ``mean + z_merge * std`` with
  ``z_merge = (0.9 - 0.5187) / 0.1203``.

Prints the values ``arena/plugins/memrl/config.yaml`` holds (made with this script's defaults).
"""

from __future__ import annotations

import argparse

import numpy as np

from arena.core.services.embedder import MiniLMEmbedder
from arena.envs.household.environment import HouseholdEnvironment

AUTHORS_MEAN, AUTHORS_STD, AUTHORS_THRESHOLD, AUTHORS_MERGE = 0.5187, 0.1203, 0.5, 0.9


def measure(level: str = "hard", n_tasks: int = 1200) -> dict[str, float]:
    """The four values, from the train intents of the household world at ``level``."""
    env = HouseholdEnvironment(level=level, n_train=n_tasks, n_valid=0, n_test=0)
    goals = sorted({task.goal for task in env.tasks("train")})
    similarity = MiniLMEmbedder().similarity(goals, goals)
    pairs = similarity[~np.eye(len(goals), dtype=bool)]  # every ordered pair of different intents
    mean, std = float(pairs.mean()), float(pairs.std())
    return {
        "sim_norm_mean": mean,
        "sim_norm_std": std,
        "sim_threshold": mean + (AUTHORS_THRESHOLD - AUTHORS_MEAN) / AUTHORS_STD * std,
        "merge_threshold": mean + (AUTHORS_MERGE - AUTHORS_MEAN) / AUTHORS_STD * std,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-level", default="hard")
    parser.add_argument("--tasks", type=int, default=1200, help="train tasks (default: all 1200)")
    args = parser.parse_args()
    for name, value in measure(args.env_level, args.tasks).items():
        print(f"{name}: {value:.4f}")

if __name__ == "__main__":
    main()
