"""Difficulty levels of the household world: the same grammar and replies over smaller rooms.

A level is defined by world parameters alone (how many receptacles a room keeps, how many
distractor object types it holds, whether goal objects start in view), never by how any method
scores on it. ``hard`` is the original world: its rooms are drawn as before levels existed (its task ids
and split hashes); the easier levels trim what ``hard`` would draw, with their own random stream,
so that ``hard`` never consumes a draw it did not consume before.

Measured statistics of each level (expert steps, admissible actions, a random policy's and the
embedded model's success) are in ``docs/household_levels.md``, with the commands that made them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    """World parameters of one level (``None``: as the original world draws it)."""

    name: str
    #: Most receptacles of one type a room keeps ("cabinet 1" .. "cabinet N").
    max_per_type: int | None
    #: Most receptacles a room keeps in all; the goal's start, target and appliance always stay.
    max_receptacles: int | None
    #: Range of distractor object types placed besides the goal object (the original: 5 to 10).
    distractor_types: tuple[int, int]
    #: Chance that each goal object starts on an open surface (seen on arrival, no ``open``).
    goal_in_view: float | None
    #: Whether ``help``, ``inventory``, ``look`` and ``examine ...`` are listed as admissible.
    #: They change nothing in the world; unlisted, they still get their replies when typed.
    lists_utility_commands: bool = True

    @property
    def is_original(self) -> bool:
        return self.name == HARD


HARD = "hard"

#: The ladder, easiest first. Changing a level changes its tasks: bump ``VERSION`` in
#: ``environment.py`` if you ever do, and never after seeing a method's score on it.
LEVELS: dict[str, Level] = {
    "easy": Level(
        "easy", max_per_type=1, max_receptacles=3, distractor_types=(0, 0), goal_in_view=1.0,
        lists_utility_commands=False,
    ),
    "medium": Level(
        "medium", max_per_type=1, max_receptacles=6, distractor_types=(1, 3), goal_in_view=1.0,
        lists_utility_commands=False,
    ),
    "large": Level(
        "large", max_per_type=2, max_receptacles=12, distractor_types=(3, 6), goal_in_view=0.5
    ),
    HARD: Level(
        HARD, max_per_type=None, max_receptacles=None, distractor_types=(5, 10), goal_in_view=None
    ),
}


def get_level(name: str) -> Level:
    """The level called ``name``; a clear error naming the levels otherwise."""
    try:
        return LEVELS[name]
    except KeyError:
        raise ValueError(
            f"Unknown household level {name!r}. Available, easiest first: {', '.join(LEVELS)} "
            f"(set env.level=<name>)."
        ) from None
