"""The BabyAI levels Arena offers, easiest first, and the default held-out choice.

Each level is one of minigrid's registered BabyAI environments. Its family says which skill it
tests (going to, picking up, opening, putting next to, unlocking, or several in sequence), so a
split can hold whole families out of training. ``docs/babyai_levels.md`` has each level's
measured expert and random-policy statistics.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    """One BabyAI level: its short name (the task type), minigrid's id and what it asks."""

    name: str
    family: str
    description: str

    @property
    def gym_id(self) -> str:
        return f"BabyAI-{self.name}-v0"


#: Easiest first (by the expert's steps and the room count).
LADDER: tuple[Level, ...] = (
    Level("GoToRedBallNoDists", "goto", "one room, go to the only object (a red ball)"),
    Level("GoToObj", "goto", "one room, go to the only object"),
    Level("GoToRedBall", "goto", "one room, go to the red ball among grey distractors"),
    Level("GoToLocal", "goto", "one room, go to one object among 7 distractors"),
    Level("PickupDist", "pickup", "one 7x7 room, pick up an object named by type, colour or both"),
    Level("PickupLoc", "pickup", "one room, pick up an object, possibly named by where it lies"),
    Level("OpenRedDoor", "open", "two small rooms, open the red door"),
    Level("PutNextLocalS5N3", "putnext", "one 5x5 room, put an object next to another (3 objects)"),
    Level("PutNextLocal", "putnext", "one room, put an object next to another"),
    Level("GoToObjDoor", "goto", "nine rooms, go to an object or a door in the starting room"),
    Level("OpenDoor", "open", "nine rooms, open a door named by colour or position"),
    Level("OpenDoorLoc", "open", "nine rooms, open the door named by its position"),
    Level("OpenTwoDoors", "open", "nine rooms, open two doors in order"),
    Level("UnlockLocal", "unlock", "nine rooms, fetch the key and open the locked door"),
    Level("PickupAbove", "pickup", "nine rooms, pick up an object in the room above"),
    Level("GoTo", "goto", "nine rooms, go to an object anywhere"),
    Level("Pickup", "pickup", "nine rooms, pick up an object anywhere"),
    Level("UnblockPickup", "pickup", "nine rooms, pick up an object; a blocker may stand in a door"),
    Level("Unlock", "unlock", "nine rooms, open a locked door; its key may be anywhere"),
    Level("SynthLoc", "synth", "nine rooms, one instruction of any kind, with locations"),
    Level("GoToSeq", "synth", "nine rooms, a sequence of go-to instructions"),
    Level("MiniBossLevel", "synth", "four small rooms, any instruction sequence"),
    Level("BossLevel", "synth", "nine rooms, any instruction sequence (BabyAI's hardest)"),
)
BY_NAME: dict[str, Level] = {level.name: level for level in LADDER}

#: Train, valid and test_seen draw from these (the go-to and pick-up families, single room).
DEFAULT_SEEN: tuple[str, ...] = ("GoToObj", "GoToLocal", "PickupDist", "PickupLoc")
#: test_unseen: families never trained on (opening a door; putting one object next to another).
DEFAULT_UNSEEN: tuple[str, ...] = ("OpenRedDoor", "PutNextLocalS5N3")


def get_level(name: str) -> Level:
    """The level called ``name``; an unknown name is an error that lists the ladder."""
    if name in BY_NAME:
        return BY_NAME[name]
    close = difflib.get_close_matches(name, list(BY_NAME), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"Unknown BabyAI level {name!r}.{hint} Levels, easiest first: {', '.join(BY_NAME)}")


def check_held_out(seen: tuple[str, ...], unseen: tuple[str, ...]) -> None:
    """test_unseen must hold levels that training never meets."""
    for names, what in ((seen, "env.seen_levels"), (unseen, "env.unseen_levels")):
        if not names:
            raise ValueError(f"{what} is empty: name at least one level ({', '.join(BY_NAME)})")
        for name in names:
            get_level(name)
        if len(set(names)) != len(names):
            raise ValueError(f"{what} names a level twice: {list(names)}")
    shared = sorted(set(seen) & set(unseen))
    if shared:
        raise ValueError(
            f"Levels {shared} are in both env.seen_levels and env.unseen_levels; test_unseen must "
            "hold levels that training never meets. Remove them from one of the two lists."
        )
