"""Deterministic generation of one room and one goal from ``(world_seed, layout_seed, task_type)``.

Everything a task needs is rebuilt from these three values, so a task's payload stays small and
JSON-serialisable, and the same payload gives the same room on any machine. The goal is drawn
first (so it is always satisfiable), then the room is furnished around it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from arena.envs.household import catalog as cat


@dataclass(frozen=True)
class Goal:
    """What the task asks for; ``target`` is a receptacle type, ``lamp`` a lamp type."""

    task_type: str
    object_type: str
    target: str | None
    lamp: str | None
    text: str


@dataclass(frozen=True)
class Layout:
    """A furnished room at its start state.

    Receptacles and objects are stored in ALFWorld's listing order (type alphabetical, then
    number descending), so a receptacle's contents kept as sorted indices print in that order.
    """

    layout_id: str
    room: str
    receptacles: tuple[str, ...]
    receptacle_types: tuple[str, ...]
    objects: tuple[str, ...]
    object_types: tuple[str, ...]
    start: tuple[int, ...]  # receptacle index of each object at the start

    def fingerprint(self) -> tuple[object, ...]:
        """The room's content, to check that two layouts are really different rooms."""
        return (self.room, self.receptacles, self.objects, self.start)


def layout_id(world_seed: int, layout_seed: int) -> str:
    return f"w{world_seed}-l{layout_seed}"


def _listing_key(name: str) -> tuple[str, int]:
    kind, number = name.rsplit(" ", 1)
    return kind, -int(number)


def _weighted(rng: random.Random, weights: dict[str, int], allowed: set[str]) -> str:
    """One key of ``weights`` among ``allowed``, drawn by weight (in a stable key order)."""
    keys = sorted(key for key in weights if key in allowed)
    return rng.choices(keys, weights=[weights[key] for key in keys])[0]


def _draw_receptacles(rng: random.Random, room: str) -> dict[str, int]:
    counts = {}
    for kind, low, high in cat.ROOM_RECEPTACLES[room]:
        count = rng.randint(low, high)
        if count:
            counts[kind] = count
    return counts


def _draw_goal(
    rng: random.Random, task_type: str, room: str, present: set[str]
) -> tuple[str, str | None, set[str]] | None:
    """(object type, target type, receptacle types the object may start in) or None if the
    room cannot host this task type. The object never starts in a receptacle of the target
    type, so no goal holds at the start."""
    candidates: list[tuple[str, str | None, set[str]]] = []
    for obj in sorted(cat.ROOM_OBJECTS[room]):
        homes = set(cat.OBJECT_HOMES[obj]) & present
        if task_type == cat.LOOK_AT_IN_LIGHT:
            if homes:
                candidates.append((obj, None, homes))
            continue
        if task_type in cat.TRANSFORM_OBJECTS:
            if obj not in cat.TRANSFORM_OBJECTS[task_type]:
                continue
            targets = (cat.TRANSFORM_TARGETS[task_type] | cat.EXTRA_TARGETS.get(obj, set()))
            targets = targets & present
        else:
            targets = homes
        for target in sorted(targets):
            starts = homes - {target}
            if starts:
                candidates.append((obj, target, starts))
    if not candidates:
        return None
    objects = sorted({obj for obj, _, _ in candidates})
    obj = rng.choice(objects)
    return rng.choice([c for c in candidates if c[0] == obj])


@lru_cache(maxsize=4096)
def generate(world_seed: int, layout_seed: int, task_type: str) -> tuple[Layout, Goal]:
    """The room and goal of one task; pure and cached (layouts are immutable)."""
    if task_type not in cat.TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}; known: {', '.join(cat.TASK_TYPES)}")
    rng = random.Random(f"household/{world_seed}/{layout_seed}/{task_type}")
    rooms = cat.TASK_ROOMS[task_type]
    while True:  # a drawn room can rarely miss what the task needs: draw another
        room = rng.choices(sorted(rooms), weights=[rooms[r] for r in sorted(rooms)])[0]
        counts = _draw_receptacles(rng, room)
        present = set(counts)
        drawn = _draw_goal(rng, task_type, room, present)
        if drawn is None:
            continue
        if task_type == cat.LOOK_AT_IN_LIGHT and not present & set(cat.DESKLAMP_HOMES):
            continue
        break
    goal_object, target, starts = drawn

    receptacles = [f"{kind} {n}" for kind, count in counts.items() for n in range(1, count + 1)]
    by_type = {kind: [f"{kind} {n}" for n in range(1, count + 1)] for kind, count in counts.items()}

    def place(kind: str, homes: set[str]) -> str:
        home = _weighted(rng, cat.OBJECT_HOMES[kind], homes)
        return rng.choice(by_type[home])

    placed: list[tuple[str, str]] = []  # (object type, receptacle name)
    n_goal = rng.randint(2, 3) if task_type == cat.PICK_TWO_AND_PLACE else rng.randint(1, 2)
    placed += [(goal_object, place(goal_object, starts)) for _ in range(n_goal)]

    others = [
        kind
        for kind in sorted(cat.ROOM_OBJECTS[room])
        if kind != goal_object and set(cat.OBJECT_HOMES[kind]) & present
    ]
    for kind in rng.sample(others, k=min(len(others), rng.randint(5, 10))):
        count = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
        placed += [(kind, place(kind, set(cat.OBJECT_HOMES[kind]) & present)) for _ in range(count)]

    lamp_homes = present & set(cat.DESKLAMP_HOMES)
    has_lamp = task_type == cat.LOOK_AT_IN_LIGHT or (
        room in (cat.BEDROOM, cat.LIVING_ROOM) and lamp_homes and rng.random() < 0.7
    )
    if has_lamp:
        lamp_home = _weighted(rng, cat.DESKLAMP_HOMES, lamp_homes)
        placed.append((cat.DESKLAMP, rng.choice(by_type[lamp_home])))

    numbered: dict[str, int] = {}
    named: list[tuple[str, str]] = []
    for kind, where in placed:
        numbered[kind] = numbered.get(kind, 0) + 1
        named.append((f"{kind} {numbered[kind]}", where))
    named.sort(key=lambda item: _listing_key(item[0]))
    receptacles.sort(key=_listing_key)
    index = {name: i for i, name in enumerate(receptacles)}

    layout = Layout(
        layout_id=layout_id(world_seed, layout_seed),
        room=room,
        receptacles=tuple(receptacles),
        receptacle_types=tuple(name.rsplit(" ", 1)[0] for name in receptacles),
        objects=tuple(name for name, _ in named),
        object_types=tuple(name.rsplit(" ", 1)[0] for name, _ in named),
        start=tuple(index[where] for _, where in named),
    )
    template = rng.choice(cat.GOAL_TEMPLATES[task_type])
    lamp = cat.DESKLAMP if task_type == cat.LOOK_AT_IN_LIGHT else None
    goal = Goal(
        task_type=task_type,
        object_type=goal_object,
        target=target,
        lamp=lamp,
        text=template.format(o=goal_object, r=target, l=lamp),
    )
    return layout, goal
