"""Test-only methods that several test modules register (hostile ones, the helper copier)."""

from __future__ import annotations

import dataclasses

import arena
from arena.core.execution.solver import Action


class Hostile:
    def __init__(self, run):
        self.run = run


def following(shadow):
    """A policy that plays the expert's move of ``shadow`` (a copy of the game the method got
    hold of) and keeps the copy in step: what every expert-copying attack of the adversarial
    tests plays."""

    def follow(observation, trajectory):
        action = shadow.expert_action() or "look"
        shadow.step(action)
        return Action(action)

    return follow


class WorldRebuilder(Hostile):
    """Builds its own household world from the public config and task ids, and plays each test
    task by its expert: what an honest-looking policy can do where test draws are public."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        from arena.envs.household.environment import HouseholdEnvironment as Rebuilt

        settings = {k: run.cfg.env[k] for k in ("n_train", "n_valid", "n_test", "seed", "level")}
        copy = {t.task_id: t for t in Rebuilt(**settings).tasks(task.split)}[task.task_id]
        shadow = Rebuilt(**settings).open(copy)
        shadow.reset()
        return run.play(arena.EpisodeRequest(task, experiences, policy=following(shadow)))


class HelperCopier:
    """Plays a helper variant of each test task and, decoding greedily, gives a declared copy
    of it as the result (Evolving-RL's no-card case)."""

    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def evaluation_variants(self, run):
        return ["without_skill"]

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        helper = run.play(arena.EpisodeRequest(task, experiences, run.current_seed(), "without_skill", policy="standard"))
        return dataclasses.replace(helper, copy_of="without_skill", llm_calls=0, tokens_in=0, tokens_out=0)
