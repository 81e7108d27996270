"""The ``random`` method: a uniformly random admissible action each step, the floor of a board.

It calls no model at all, so its success rate is what the world gives away by chance under the
same step and invalid-action limits as every other method. Registered like any plugin.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import arena
from arena import Action, Experience, Observation, Run, Task, Trajectory


class RandomPolicy:
    """Uniform over the admissible actions; seeded per episode, so a rerun plays the same."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, observation: Observation, trajectory: Trajectory) -> Action:
        return Action(text=self.rng.choice(list(observation.admissible_actions)))


class RandomMethod:
    def __init__(self, run: Run) -> None:
        self.run = run

    @arena.hookimpl
    def solve(self, run: Run, task: Task, experiences: list[Experience], seed: int) -> Trajectory:
        return run.play(arena.EpisodeRequest(task, experiences, policy=RandomPolicy(seed)))


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("random", RandomMethod, **arena.plugin_files(__file__),
             description="A uniformly random admissible action each step, no model (the floor).")
