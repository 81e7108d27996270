"""The environment interface every environment plugin implements.

An :class:`Environment` owns the task lists of its splits; :meth:`Environment.open` starts one
independent :class:`Episode`, so many episodes can run side by side (batched or in workers).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from arena.core.contract.types import Observation, Task, Trajectory

#: Split names the protocol knows. ``train`` is learned on; the two test splits are evaluated on.
TRAIN_SPLIT = "train"
VALID_SPLIT = "valid"
TEST_SPLITS = ("test_seen", "test_unseen")
#: Split name of :meth:`Environment.pool_tasks`: train-like tasks of the types train holds out,
#: consulted at test time only (``eval.source_pool: all_types``), never learned from.
POOL_SPLIT = "pool"


@dataclass(frozen=True)
class Instructions:
    """What an environment tells the agent about its world, and how its episodes read as text.

    The harness's solver builds its system prompt from them; methods name the domain in their own
    prompts (``f"similar {instructions.domain} tasks"``) and render trajectories for extraction
    with :meth:`render`, so no core module or method assumes one kind of world. An environment
    whose transcripts read differently overrides :meth:`render` in a subclass.
    """

    #: Where the agent is, after "You are an agent in": "a grid world", say.
    setting: str = "a text environment"
    #: The kind of task, as an adjective before "tasks" ("grid-world tasks").
    domain: str = "text-based"
    #: How the commands work, appended to the system prompt; empty where the admissible
    #: commands explain themselves ("take apple 1 from countertop 2").
    actions: str = ""

    def system_prompt(self, mode: str = "choose") -> str:
        """The standard solver's system prompt: ``choose`` (reply with one admissible action)
        or ``react`` (reasoning and an action in tags, Evolving-RL's authors' format)."""
        lead = f"You are an agent in {self.setting}. Each turn you read an observation and "
        if mode == "react":
            body = ("the admissible actions. First think about the situation inside <reasoning> "
                    "and </reasoning>, then give exactly one admissible action, copied verbatim, "
                    "inside <action> and </action>. Reach the task's goal in as few steps as possible.")
        else:
            body = ("reply with exactly one of the admissible actions, copied verbatim. Reach the "
                    "task's goal in as few steps as possible.")
        return lead + body + (f" {self.actions}" if self.actions else "")

    def render(self, trajectory: Trajectory, max_steps: int | None = None, reasoning: bool = False) -> str:
        """An episode as text for prompts and extractors (the last ``max_steps`` steps; with
        ``reasoning``, what a free-text solver reasoned before each action)."""
        return trajectory.render(max_steps=max_steps, reasoning=reasoning)


class Episode(ABC):
    """One running game. ``reset`` first, then ``step`` until ``Observation.done``."""

    task: Task

    @abstractmethod
    def reset(self) -> Observation:
        """Start (or restart) the game and return the first observation."""

    @abstractmethod
    def step(self, action: str) -> Observation:
        """Apply one command. An inadmissible command changes nothing and answers as the game
        does (``Nothing happens.`` in the built-in worlds)."""

    def expert_action(self) -> str | None:
        """The next action of an expert plan from the current state, or None if there is none."""
        return None

    def close(self) -> None:
        """Release resources (processes, files)."""


class Environment(ABC):
    """A named, versioned family of tasks split into train / valid / test_seen / test_unseen."""

    name: str = ""
    version: str = ""
    #: The environment's own step limit per episode, used where ``eval.max_steps`` is null.
    max_steps: int = 30
    #: Distributions that define the world (a game engine, its data), whose versions every run
    #: records beside the harness's own.
    packages: tuple[str, ...] = ()

    @abstractmethod
    def split_names(self) -> list[str]:
        """The splits this environment has, e.g. ``["train", "valid", "test_seen", "test_unseen"]``."""

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """All tasks of one split, in a stable order."""

    @abstractmethod
    def open(self, task: Task) -> Episode:
        """A fresh episode of ``task`` (call ``reset`` on it before stepping)."""

    def game_identity(self, task: Task) -> str | None:
        """What makes ``task`` the game it is (its room or grid, objects, goal and start, as
        text), so that two tasks of the same game are seen to be one: no valid or test game may
        be a train game (:func:`draw_games`; ``tests/test_splits.py``). None: this world does
        not say (its splits come from elsewhere, e.g. a benchmark's own lists)."""
        return None

    def pool_tasks(self) -> list[Task]:
        """Train-like tasks of the task types the train split holds out (split ``pool``).

        Drawn the way train is (the same kind of rooms or games, none of them in a test split),
        they exist for one protocol choice: ``eval.source_pool: all_types`` lets a method consult,
        at test time, a pool of train tasks of every type, as Evolving-RL's authors retrieve
        their source game from a train pool of all six types. They are never open while
        learning. Empty (the default) where train already holds every type.
        """
        return []

    def instructions(self) -> Instructions:
        """What the agent is told about this world (see :class:`Instructions`); the generic
        wording by default."""
        return Instructions()

    def protocol_fields(self) -> dict[str, object]:
        """World settings that change what is measured (a difficulty level, say).

        The harness records them in results.json's ``protocol.env`` and the leaderboard never
        ranks runs that differ in them together. JSON values only.
        """
        return {}

    def split_hash(self, split: str) -> str:
        """Content hash of a split: recorded with results so that two runs can be compared."""
        return tasks_hash(self.pool_tasks() if split == POOL_SPLIT else self.tasks(split))

    def draw_tests_with(self, salt: str) -> None:
        """Draw the test splits' layouts from ``salt`` (``eval.salt``), not from the public task
        ids alone, so a method that knows the world's code still cannot rebuild a test world.
        Task ids, types and goals' kinds stay as they are. Procedural worlds implement it (see
        :func:`salted_seed`); an environment whose test tasks are fixed data refuses."""
        raise SaltUnsupported(
            f"The {self.name or type(self).__name__} environment's test tasks are fixed data, not drawn "
            "from seeds, so eval.salt cannot redraw them: set eval.salt=public.")

    def close(self) -> None:
        """Release resources shared by the episodes."""


class SaltUnsupported(ValueError):
    """``eval.salt`` asked of an environment whose test tasks cannot be redrawn."""


#: Seeds of salted test layouts start here: far above every public range, so a salted test room
#: is never a train, valid or pool room.
SALTED_SEED_BASE = 1 << 40


def salted_seed(salt: str, split: str, index: int) -> int:
    """The layout seed of test task ``index`` of ``split`` under ``salt``: 40 bits of a hash, so
    1,200 tasks collide with odds of about one in a million, and nothing of it is guessable
    without the salt."""
    digest = hashlib.sha256(f"{salt}|{split}|{index}".encode()).digest()
    return SALTED_SEED_BASE + int.from_bytes(digest[:5], "big")


def drawn_seed(salt: str | None, split: str, index: int, public: int) -> int:
    """The seed task ``index`` of ``split`` is drawn from: ``public`` (the split's own range), or
    under a salt, for a test split, :func:`salted_seed`."""
    if salt is not None and split in TEST_SPLITS:
        return salted_seed(salt, split, index)
    return public


#: The family of splits a game may be drawn for, fixed by the game's identity alone: a split
#: keeps a drawn game only where the game's bucket (a hash of its identity, 0 to 99) lies in its
#: family's range. So no valid or test game is ever a train (or pool) game, whatever the sizes,
#: the seeds or a test salt, and the rule needs no list of the other splits' games.
GAME_FAMILIES: dict[str, range] = {"learn": range(0, 70), "valid": range(70, 80), "test": range(80, 100)}
FAMILY_OF_SPLIT: dict[str, str] = {TRAIN_SPLIT: "learn", POOL_SPLIT: "learn", VALID_SPLIT: "valid",
                                   TEST_SPLITS[0]: "test", TEST_SPLITS[1]: "test"}
#: How many draws a split may spend per task before its world is called too small for it.
DRAWS_PER_TASK = 60

T = TypeVar("T")


def game_family(identity: str) -> str:
    """The family of splits (``learn``, ``valid`` or ``test``) the game ``identity`` belongs to."""
    bucket = int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "big") % 100
    return next(family for family, buckets in GAME_FAMILIES.items() if bucket in buckets)


def draw_games(world: str, split: str, size: int, candidate: Callable[[int, int], tuple[T, str]]) -> list[T]:
    """The ``size`` tasks of ``split``: task ``i`` is the first candidate after those task ``i-1``
    used whose game is of the split's family. ``candidate(i, draw)`` makes task ``i`` from the
    ``draw``-th draw and returns it with its game identity. A task depends on the split's
    earlier tasks only, so sizes only cut lists short. (Two tasks of one split may still be one
    game where a world has few: that repeats an evaluation game, it leaks no training game.)"""
    family = FAMILY_OF_SPLIT[split]
    tasks: list[T] = []
    draw = 0
    for index in range(size):
        while True:
            if draw >= DRAWS_PER_TASK * (index + 1):
                raise ValueError(
                    f"{world}: split {split!r} found {index} games of its family in {draw} draws, fewer than "
                    f"the {size} asked for; this world has too few games of some task type.")
            task, identity = candidate(index, draw)
            draw += 1
            if game_family(identity) == family:
                tasks.append(task)
                break
    return tasks


class SaltedTestDraws:
    """``draw_tests_with`` for a procedural environment whose task lists are cached in
    ``self._tasks`` by split and drawn with :func:`drawn_seed` from ``self._salt``."""

    _salt: str | None = None
    _tasks: dict[str, list[Task]]

    def draw_tests_with(self, salt: str) -> None:
        self._salt = salt
        for split in TEST_SPLITS:
            self._tasks.pop(split, None)  # drawn again, from the salt


def tasks_hash(tasks: list[Task]) -> str:
    """Content hash of a list of tasks, in their order."""
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(task.content_hash().encode())
    return digest.hexdigest()
