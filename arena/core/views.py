"""What a method may see of the environment and its tasks (``run.env``, the tasks it is given).

The harness plays every credited episode itself and keeps the real :class:`Environment`; a
method gets an :class:`EnvironmentView`, whose answers depend on the phase: while learning, the
tasks of the learning splits and episodes of them (an expert plan included, e.g. SkillRL's
demonstrations); while evaluating, no episode at all (a shadow game with the expert's moves
would win without the model) and test tasks without their payload (layout seeds, targets).
An in-process plugin can still reach past these views (``docs/security.md`` says how, and what
stops it then: replay verification and digests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from arena.core.env import POOL_SPLIT, TEST_SPLITS, Environment, Episode
from arena.core.types import Task

if TYPE_CHECKING:
    from arena.core.context import RunContext


def public_task(task: Task) -> Task:
    """The task as a method sees it at evaluation: id, split, type and goal, no payload."""
    return dataclasses.replace(task, payload={}) if task.payload else task


class EnvironmentView:
    """``run.env`` for methods: the environment's public face, guarded by the run's phase."""

    def __init__(self, env: Environment, run: RunContext,
                 refuse: Callable[[str], Exception]) -> None:
        self._env = env
        self._run = run
        self._refuse = refuse
        self.name = env.name
        self.version = env.version
        self.max_steps = env.max_steps

    def split_names(self) -> list[str]:
        return self._env.split_names()

    def tasks(self, split: str) -> list[Task]:
        """As :meth:`RunContext.tasks`: the phase's guard applies (and is recorded)."""
        return self._run.tasks(split)

    def pool_tasks(self) -> list[Task]:
        """The source pool's extra tasks: only at evaluation, and only under
        ``eval.source_pool: all_types`` (use :meth:`RunContext.source_pool`)."""
        if self._run.is_learning():
            raise self._refuse(f"Method '{self._run.method_name}' asked for the test-time source "
                               "pool while learning; it is open at evaluation only.")
        return [t for t in self._run.source_pool() if t.split == POOL_SPLIT]

    def split_hash(self, split: str) -> str:
        return self._env.split_hash(split)

    def protocol_fields(self) -> dict[str, object]:
        return self._env.protocol_fields()

    def open(self, task: Task) -> Episode:
        """An episode of a learning task, while learning only. At evaluation the harness plays
        every episode (``run.play``, ``run.standard_solve``, ``run.play_policy``)."""
        if not self._run.is_learning():
            raise self._refuse(
                f"Method '{self._run.method_name}' opened an episode of {task.task_id} itself "
                "during evaluation; play episodes through run.play / run.standard_solve / "
                "run.play_policy, which the harness verifies.")
        if task.split in (*TEST_SPLITS, POOL_SPLIT):
            raise self._refuse(f"Method '{self._run.method_name}' opened an episode of "
                               f"{task.split} task {task.task_id} while learning.")
        return self._env.open(task)

    def close(self) -> None:
        """The harness closes the environment; a method's call does nothing."""
