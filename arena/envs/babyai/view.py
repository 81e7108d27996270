"""The agent's egocentric view, computed as minigrid computes it, in a tenth of the time.

Minigrid builds each observation by copying a 7x7 sub-grid, rotating it once per heading and
flooding visibility over it, object by object (about 0.4 ms a step, most of a step's cost). Here
each view cell is looked up in the full grid by the same geometry (``forward`` along the heading,
``side`` along its right vector; cells off the grid are walls, as minigrid's slice pads them),
and visibility is minigrid's own propagation rule on plain lists. The result is minigrid's
encoding cell for cell: ``tests/test_babyai.py`` compares the two over thousands of states.
"""

from __future__ import annotations

from typing import Any

from minigrid.core.constants import DIR_TO_VEC
from minigrid.core.world_object import Wall

Cell = tuple[int, int, int]
_UNSEEN: Cell = (0, 0, 0)
_EMPTY: Cell = (1, 0, 0)
_WALL = Wall()
_HEADINGS = [(int(vector[0]), int(vector[1])) for vector in DIR_TO_VEC]


def egocentric_view(env: Any) -> list[list[Cell]]:
    """``view[i][j]``: the encoded cell ``i`` columns from the left and ``j`` rows from the far
    edge of the agent's view (the agent at the bottom centre, looking up), as minigrid's
    ``gen_obs()["image"]`` has it; unseen cells are ``(0, 0, 0)``."""
    size = env.agent_view_size
    grid = env.grid
    width, height, cells = grid.width, grid.height, grid.grid
    agent_x, agent_y = env.agent_pos
    dx, dy = _HEADINGS[env.agent_dir]
    right_x, right_y = -dy, dx
    middle, back = size // 2, size - 1
    objects: list[list[Any]] = []
    for i in range(size):
        side = i - middle
        column = []
        for j in range(size):
            forward = back - j
            x = agent_x + forward * dx + side * right_x
            y = agent_y + forward * dy + side * right_y
            column.append(cells[y * width + x] if 0 <= x < width and 0 <= y < height else _WALL)
        objects.append(column)
    visible = _visibility(objects, size)
    carrying = env.carrying
    view = []
    for i in range(size):
        column_objects, column_visible = objects[i], visible[i]
        encoded: list[Cell] = []
        for j in range(size):
            if not column_visible[j]:
                encoded.append(_UNSEEN)
                continue
            obj = carrying if (i == middle and j == back) else column_objects[j]
            encoded.append(_EMPTY if obj is None else obj.encode())
        view.append(encoded)
    return view


def _visibility(objects: list[list[Any]], size: int) -> list[list[bool]]:
    """Minigrid's ``Grid.process_vis``: from the agent's cell, row by row away from it, light
    spreads sideways and one row on past every cell that can be seen through."""
    mask = [[False] * size for _ in range(size)]
    mask[size // 2][size - 1] = True

    def clear(i: int, j: int) -> bool:
        obj = objects[i][j]
        return obj is None or obj.see_behind()

    for j in reversed(range(size)):
        for i in range(size - 1):
            if mask[i][j] and clear(i, j):
                mask[i + 1][j] = True
                if j > 0:
                    mask[i + 1][j - 1] = True
                    mask[i][j - 1] = True
        for i in reversed(range(1, size)):
            if mask[i][j] and clear(i, j):
                mask[i - 1][j] = True
                if j > 0:
                    mask[i - 1][j - 1] = True
                    mask[i][j - 1] = True
    return mask
