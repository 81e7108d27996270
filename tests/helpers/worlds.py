"""Environments for the worker and executor tests: a small household world and a scripted one."""

from __future__ import annotations

import functools
import os
import random
import time

from arena.core.contract.env import Environment, Episode
from arena.core.contract.types import Observation, Task
from arena.envs.household import HouseholdEnvironment

HOUSEHOLD = functools.partial(HouseholdEnvironment, seed=0, n_train=8, n_valid=2, n_test=6)


# -- a scripted environment whose episodes fail on command (importable by the workers) ---------


class ScriptedEpisode(Episode):
    def __init__(self, task: Task) -> None:
        self.task = task
        self.steps = 0

    def reset(self) -> Observation:
        self.steps = 0
        return Observation(f"start {self.task.task_id}", ("ok",))

    def step(self, action: str) -> Observation:
        if action == "boom":
            raise ValueError("boom on purpose")
        if action == "exit":
            os._exit(3)
        if action == "unpicklable":
            return Observation("never sent", (lambda: "ok",))  # type: ignore[arg-type]
        if action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
        self.steps += 1
        return Observation(f"{action} #{self.steps} pid {os.getpid()}", ("ok",))

    def expert_action(self) -> str | None:
        return "ok"


class ScriptedEnvironment(Environment):
    name = "scripted"
    version = "1"

    def __init__(self, fail: bool = False) -> None:
        if fail:
            raise RuntimeError("cannot build on purpose")

    def split_names(self) -> list[str]:
        return ["train"]

    def tasks(self, split: str) -> list[Task]:
        return [Task(f"scripted/{i}", self.name, split, "scripted", "goal") for i in range(4)]

    def open(self, task: Task) -> ScriptedEpisode:
        return ScriptedEpisode(task)


def play_script(env: Environment, task: Task, seed: int) -> list[tuple[Observation, str | None]]:
    """Expert and random admissible commands and one inadmissible one; every observation and
    expert answer along the way."""
    rng = random.Random(seed)
    episode = env.open(task)
    observation = episode.reset()
    seen = [(observation, episode.expert_action())]
    try:
        for number in range(14):
            if observation.done:
                break
            if number == 5:
                action = "dance with the fridge"
            elif number % 3 == 0:
                action = rng.choice(observation.admissible_actions)
            else:
                action = episode.expert_action() or "look"
            observation = episode.step(action)
            seen.append((observation, episode.expert_action()))
    finally:
        episode.close()
    return seen


# -- a game for episode-ending rules (the golden cases of ExpeL and Reflexion) -----------------


class RepeatWinEpisode(Episode):
    """Every action is admissible and answered; ``win_on`` wins when played twice in a row (so a
    repeated action can be the winning one). The game never ends on its own otherwise."""

    def __init__(self, actions: list[str], win_on: str | None = None) -> None:
        self.task = Task("toy/train/repeat", "toy", "train", "toy", "play the script")
        self.actions = tuple(dict.fromkeys(actions))
        self.win_on = win_on
        self.last: str | None = None

    def reset(self) -> Observation:
        self.last = None
        return Observation("start", self.actions)

    def step(self, action: str) -> Observation:
        won = action == self.win_on and self.last == action
        self.last = action
        return Observation(f"obs of {action}", () if won else self.actions, reward=float(won),
                           done=won, won=won)


def scripted_policy(actions: list[str]):
    """A policy that plays ``actions`` in order, one per step."""
    from arena.core.contract.types import Action

    return lambda observation, trajectory: Action(actions[len(trajectory.steps)])
