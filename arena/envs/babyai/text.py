"""BabyAI in words: the agent's partial view described as text, the commands it may give now,
and what each command did.

The view is minigrid's own egocentric 7x7 observation (the agent at the bottom centre, looking
up the grid; cells behind walls and closed doors unseen). Each visible object is named with its
colour and its position relative to the agent in steps forward and to the side, as BALROG and
GLAM describe BabyAI; of the walls, only the nearest one straight ahead, left and right is named,
which is all a player needs to know where the room ends.
"""

from __future__ import annotations

import re
from typing import Any

from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, OBJECT_TO_IDX

TURN_LEFT = "turn left"
TURN_RIGHT = "turn right"
GO_FORWARD = "go forward"
PICK_UP = "pick up"
DROP = "drop"
TOGGLE = "toggle"
#: The commands, in the order of minigrid's actions 0..5 (its ``done``, 6, does nothing in
#: BabyAI and is not offered).
COMMANDS: tuple[str, ...] = (TURN_LEFT, TURN_RIGHT, GO_FORWARD, PICK_UP, DROP, TOGGLE)
ACTION_OF: dict[str, int] = {command: index for index, command in enumerate(COMMANDS)}
#: How the commands are explained to the agent (the environment's action description).
COMMAND_HELP = (
    "Commands: 'turn left' and 'turn right' turn you on the spot; 'go forward' moves you one "
    "step ahead; 'pick up' takes the object right in front of you (you carry one at a time); "
    "'drop' puts what you carry on the empty cell in front of you; 'toggle' opens or closes the "
    "door in front of you (a locked door opens with the key of its colour) or opens a box."
)
NOTHING_HAPPENS = "Nothing happens."
#: ``env.recolour``: every colour the agent reads renamed by one fixed swap of minigrid's six, in
#: the mission and every reply, the world otherwise unchanged (the same layouts, the same expert):
#: a changed world for experience learned under the old names (``arena experiment stale``).
RECOLOURED: dict[str, str] = {"red": "green", "green": "red", "blue": "purple", "purple": "blue",
                              "yellow": "grey", "grey": "yellow"}
_COLOUR_WORD = re.compile(r"\b(" + "|".join(RECOLOURED) + r")\b")


def recolour(text: str) -> str:
    """``text`` with every colour name swapped as :data:`RECOLOURED` says."""
    return _COLOUR_WORD.sub(lambda match: RECOLOURED[match.group(1)], text)

_WALL = OBJECT_TO_IDX["wall"]
_DOOR = OBJECT_TO_IDX["door"]
_UNSEEN = OBJECT_TO_IDX["unseen"]
#: Cells that say nothing: unseen, empty floor, walls (named apart), coloured floor, the agent.
_SILENT = frozenset(OBJECT_TO_IDX[name] for name in ("unseen", "empty", "wall", "floor", "agent"))
_DOOR_STATE = ("open", "closed", "locked")  # minigrid's state codes 0, 1, 2


def _steps(count: int, direction: str) -> str:
    return f"{count} step{'s' if count > 1 else ''} {direction}"


def _where(forward: int, side: int) -> str:
    parts = []
    if forward:
        parts.append(_steps(forward, "forward"))
    if side:
        parts.append(_steps(abs(side), "right" if side > 0 else "left"))
    return " and ".join(parts)


def _name(kind: int, color: int, state: int) -> str:
    if kind == _DOOR:
        return f"a {_DOOR_STATE[state]} {IDX_TO_COLOR[color]} door"
    return f"a {IDX_TO_COLOR[color]} {IDX_TO_OBJECT[kind]}"


def describe_view(image: Any, carrying: Any | None) -> str:
    """The sentence for one observation ``image``: minigrid's ``(7, 7, 3)`` encoding, as an
    array or as the nested lists of :func:`arena.envs.babyai.view.egocentric_view`."""
    cells = image.tolist() if hasattr(image, "tolist") else image
    size = len(cells)
    middle, back = size // 2, size - 1
    objects: list[tuple[int, int, int, str]] = []
    for column_index, column in enumerate(cells):
        side = column_index - middle
        for row_index, (kind, color, state) in enumerate(column):
            if kind in _SILENT or (side == 0 and row_index == back):
                continue
            forward = back - row_index
            objects.append((forward + abs(side), forward, side, _name(kind, color, state)))
    seen = [f"{name} {_where(forward, side)}" for _, forward, side, name in sorted(objects)]
    for line, direction in (
        ([cells[middle][row] for row in range(back - 1, -1, -1)], "forward"),
        ([cells[column][back] for column in range(middle - 1, -1, -1)], "left"),
        ([cells[column][back] for column in range(middle + 1, size)], "right"),
    ):
        for distance, (kind, _color, _state) in enumerate(line, start=1):
            if kind == _UNSEEN:
                break
            if kind == _WALL:
                seen.append(f"a wall {_steps(distance, direction)}")
                break
    text = "You see " + (", ".join(seen) if seen else "nothing but the floor") + "."
    if carrying is not None:
        text += f" You are carrying a {carrying.color} {carrying.type}."
    return text


def admissible_commands(env: Any) -> tuple[str, ...]:
    """The commands that can do something now (minigrid ignores the others silently)."""
    front = env.grid.get(*env.front_pos)
    commands = [TURN_LEFT, TURN_RIGHT]
    if front is None or front.can_overlap():
        commands.append(GO_FORWARD)
    if front is not None and front.can_pickup() and env.carrying is None:
        commands.append(PICK_UP)
    if front is None and env.carrying is not None:
        commands.append(DROP)
    if front is not None and front.type in ("door", "box"):
        commands.append(TOGGLE)
    return tuple(commands)


def before_command(env: Any, command: str) -> str:
    """What ``command`` is about to do, said before the step changes the cell in front."""
    if command in (TURN_LEFT, TURN_RIGHT):
        return f"You {command}."
    if command == GO_FORWARD:
        return "You go forward."
    front = env.grid.get(*env.front_pos)
    if command == PICK_UP:
        return f"You pick up the {front.color} {front.type}."
    if command == DROP:
        return f"You drop the {env.carrying.color} {env.carrying.type}."
    if front.type == "box":
        inside = front.contains
        held = f"a {inside.color} {inside.type}" if inside is not None else "nothing"
        return f"You open the {front.color} box; it held {held}."
    if front.is_locked:
        carrying = env.carrying
        if carrying is not None and carrying.type == "key" and carrying.color == front.color:
            return f"You unlock the {front.color} door with the key and open it."
        return f"The {front.color} door is locked; it opens with the {front.color} key."
    return f"You {'close' if front.is_open else 'open'} the {front.color} door."
