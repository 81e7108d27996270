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
import threading

from arena.core.contract.env import POOL_SPLIT, TEST_SPLITS, TRAIN_SPLIT, VALID_SPLIT, Environment, Episode
from arena.core.contract.types import Task
from arena.core.execution.phase import PhaseGuard, ViolationLog


def public_task(task: Task) -> Task:
    """The task as a method sees it at evaluation: id, split, type and goal, no payload."""
    return dataclasses.replace(task, payload={}) if task.payload else task


def shown_task(task: Task) -> Task:
    """The copy of the harness's ``task`` a method is handed: a test or pool task without its
    payload (layout seed, objects, target), a learning task whole (its payload is no secret)."""
    return public_task(task) if task.split in (*TEST_SPLITS, POOL_SPLIT) else task


class TaskGate:
    """The tasks a method may ask for, by phase: while learning, train (and valid, recorded);
    at evaluation the test tasks without their payload (the gate keeps the full copies the
    harness plays) and, with ``eval.source_pool: all_types``, the environment's source pool."""

    def __init__(self, env: Environment, phases: PhaseGuard, violations: ViolationLog,
                 source_pool: str) -> None:
        self._env = env
        self._phases = phases
        self._violations = violations
        self._source_pool = source_pool
        self._test_tasks: dict[str, Task] = {}
        self._index: dict[str, Task] | None = None  # every split's tasks by id, built once
        self._pool_indexed = False
        self._lock = threading.Lock()
        #: The splits a method learned from (train, and valid if it asked for it).
        self.used_for_learning: set[str] = set()

    def tasks(self, split: str) -> list[Task]:
        """Tasks of a split. While learning only train (and valid, which is recorded) are open."""
        if self._phases.is_learning():
            if split in (*TEST_SPLITS, POOL_SPLIT):
                kind = "the test-time source pool" if split == POOL_SPLIT else f"test split '{split}'"
                raise self._violations.refusal(
                    f"Method '{self._violations.method}' asked for {kind} while learning; "
                    f"learn from '{TRAIN_SPLIT}' (or '{VALID_SPLIT}', recorded as such).")
            self.used_for_learning.add(split)
        tasks = self._env.tasks(split)
        return [public_task(t) for t in tasks] if split in TEST_SPLITS else tasks

    def source_pool(self) -> list[Task]:
        """The train tasks a method may consult at test time (to retrieve a source game, say).

        The train split; at evaluation with ``eval.source_pool: all_types`` also the
        environment's pool of train-like tasks of the types train holds out. While learning it is
        the train split alone: the pool is for test time, never for learning.
        """
        train = self.tasks(TRAIN_SPLIT)
        if self._phases.is_learning() or self._source_pool == "train":
            return train
        return train + self._env.pool_tasks()

    def open_evaluation(self, tasks: list[Task]) -> None:
        """The evaluation's test tasks with their payloads (the harness's call)."""
        self._test_tasks = {task.task_id: task for task in tasks}

    def is_test_task(self, task_id: str) -> bool:
        return task_id in self._test_tasks

    def own_task(self, task: Task) -> Task:
        """The harness's own copy of ``task``, found by its id (the evaluation's test tasks
        first, then every split of the environment, then its pool): its split, type, goal and
        payload are the environment's, whatever the copy a method passes claims. So a test task
        relabelled ``train`` is still a test task, and a result's split and type are never the
        method's word. An id of no split is refused (on record)."""
        found = self._test_tasks.get(task.task_id)
        if found is not None:
            return found
        with self._lock:
            if self._index is None:
                self._index = {t.task_id: t for split in self._env.split_names() for t in self._env.tasks(split)}
            found = self._index.get(task.task_id)
            if found is None and not self._pool_indexed:
                self._pool_indexed = True
                self._index.update({t.task_id: t for t in self._env.pool_tasks()})
                found = self._index.get(task.task_id)
        if found is None:
            raise self._violations.refusal(
                f"Method '{self._violations.method}' asked to play task {task.task_id!r}, which is no "
                f"task of environment '{self._env.name}'; play the tasks run.tasks(...) returns.")
        return found


class EnvironmentView:
    """``run.env`` for methods: the environment's public face, guarded by the run's phase."""

    def __init__(self, env: Environment, gate: TaskGate, phases: PhaseGuard,
                 violations: ViolationLog) -> None:
        self._env = env
        self._gate = gate
        self._phases = phases
        self._violations = violations
        self.name = env.name
        self.version = env.version
        self.max_steps = env.max_steps
        #: What the agent is told about this world; methods name its ``domain`` in their own
        #: prompts and render trajectories with its ``render``.
        self.instructions = env.instructions()

    def split_names(self) -> list[str]:
        return self._env.split_names()

    def tasks(self, split: str) -> list[Task]:
        """As :meth:`RunContext.tasks`: the phase's guard applies (and is recorded)."""
        return self._gate.tasks(split)

    def pool_tasks(self) -> list[Task]:
        """The source pool's extra tasks: only at evaluation, and only under
        ``eval.source_pool: all_types`` (use :meth:`RunContext.source_pool`)."""
        if self._phases.is_learning():
            raise self._violations.refusal(
                f"Method '{self._violations.method}' asked for the test-time source pool while "
                "learning; it is open at evaluation only.")
        return [t for t in self._gate.source_pool() if t.split == POOL_SPLIT]

    def split_hash(self, split: str) -> str:
        return self._env.split_hash(split)

    def protocol_fields(self) -> dict[str, object]:
        return self._env.protocol_fields()

    def open(self, task: Task) -> Episode:
        """An episode of a learning task, while learning only. At evaluation the harness plays
        every episode (``run.play``, with the method's ``solve`` or a policy it passes)."""
        method = self._violations.method
        if not self._phases.is_learning():
            raise self._violations.refusal(
                f"Method '{method}' opened an episode of {task.task_id} itself during "
                "evaluation; play episodes through run.play (with a policy if need be), which "
                "the harness verifies.")
        if task.split in (*TEST_SPLITS, POOL_SPLIT):
            raise self._violations.refusal(f"Method '{method}' opened an episode of "
                                           f"{task.split} task {task.task_id} while learning.")
        return self._env.open(task)

    def close(self) -> None:
        """The harness closes the environment; a method's call does nothing."""
