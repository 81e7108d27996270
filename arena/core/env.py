"""The environment interface every environment plugin implements.

An :class:`Environment` owns the task lists of its splits; :meth:`Environment.open` starts one
independent :class:`Episode`, so many episodes can run side by side (batched or in workers).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod

from arena.core.types import Observation, Task

#: Split names the protocol knows. ``train`` is learned on; the two test splits are evaluated on.
TRAIN_SPLIT = "train"
VALID_SPLIT = "valid"
TEST_SPLITS = ("test_seen", "test_unseen")
#: Split name of :meth:`Environment.pool_tasks`: train-like tasks of the types train holds out,
#: consulted at test time only (``eval.source_pool: all_types``), never learned from.
POOL_SPLIT = "pool"


class Episode(ABC):
    """One running game. ``reset`` first, then ``step`` until ``Observation.done``."""

    task: Task

    @abstractmethod
    def reset(self) -> Observation:
        """Start (or restart) the game and return the first observation."""

    @abstractmethod
    def step(self, action: str) -> Observation:
        """Apply one command. An inadmissible command changes nothing and answers as the game does
        (ALFWorld: ``Nothing happens.``)."""

    def expert_action(self) -> str | None:
        """The next action of an expert plan from the current state, or None if there is none."""
        return None

    def close(self) -> None:
        """Release resources (processes, files)."""


class Environment(ABC):
    """A named, versioned family of tasks split into train / valid / test_seen / test_unseen."""

    name: str = ""
    version: str = ""
    #: The environment's own step limit per episode, used where ``eval.max_steps`` is null
    #: (ALFWorld's usual 50; the household world's 30).
    max_steps: int = 30

    @abstractmethod
    def split_names(self) -> list[str]:
        """The splits this environment has, e.g. ``["train", "valid", "test_seen", "test_unseen"]``."""

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """All tasks of one split, in a stable order."""

    @abstractmethod
    def open(self, task: Task) -> Episode:
        """A fresh episode of ``task`` (call ``reset`` on it before stepping)."""

    def pool_tasks(self) -> list[Task]:
        """Train-like tasks of the task types the train split holds out (split ``pool``).

        Drawn the way train is (the same kind of rooms or games, none of them in a test split),
        they exist for one protocol choice: ``eval.source_pool: all_types`` lets a method consult,
        at test time, a pool of train tasks of every type, as Evolving-RL's authors retrieve
        their source game from a train pool of all six types. They are never open while
        learning. Empty (the default) where train already holds every type.
        """
        return []

    def protocol_fields(self) -> dict[str, object]:
        """World settings that change what is measured (a difficulty level, say).

        The harness records them in results.json's ``protocol.env`` and the leaderboard never
        ranks runs that differ in them together. JSON values only.
        """
        return {}

    def split_hash(self, split: str) -> str:
        """Content hash of a split: recorded with results so that two runs can be compared."""
        return tasks_hash(self.pool_tasks() if split == POOL_SPLIT else self.tasks(split))

    def close(self) -> None:
        """Release resources shared by the episodes."""


def tasks_hash(tasks: list[Task]) -> str:
    """Content hash of a list of tasks, in their order."""
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(task.content_hash().encode())
    return digest.hexdigest()
