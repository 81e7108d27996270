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
from arena.envs.household.levels import HARD, Level, get_level


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


def layout_id(world_seed: int, layout_seed: int, level: str = HARD) -> str:
    base = f"w{world_seed}-l{layout_seed}"
    return base if level == HARD else f"{base}-{level}"


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
            targets = frozenset((cat.TRANSFORM_TARGETS[task_type] | cat.EXTRA_TARGETS.get(obj, set()))
                                & present)
        else:
            targets = frozenset(homes)
        for target in sorted(targets):
            starts = homes - {target}
            if starts:
                candidates.append((obj, target, starts))
    if not candidates:
        return None
    objects = sorted({obj for obj, _, _ in candidates})
    obj = rng.choice(objects)
    return rng.choice([c for c in candidates if c[0] == obj])


def _keep_for_level(
    rng: random.Random,
    level: Level,
    task_type: str,
    counts: dict[str, int],
    target: str | None,
    starts: set[str],
) -> tuple[dict[str, int], set[str]]:
    """Trim the drawn receptacles to the level's room size (receptacle counts, kept types).

    The goal stays satisfiable: its target type, its appliance and one type it may start in
    (one in view when the level puts goal objects in view) are always kept; for look_at, one
    desk lamp home too. Returns the kept counts and the start types left.
    """
    if level.max_per_type is not None:
        counts = {kind: min(count, level.max_per_type) for kind, count in counts.items()}
    in_view = {kind for kind in starts if kind not in cat.OPENABLE}
    first_start = sorted(in_view if in_view and level.goal_in_view else starts)
    required = [rng.choice(first_start)]
    if target is not None:
        required.append(target)
    appliance = {
        cat.HEAT_AND_PLACE: cat.HEAT_APPLIANCE,
        cat.COOL_AND_PLACE: cat.COOL_APPLIANCE,
        cat.CLEAN_AND_PLACE: cat.CLEAN_APPLIANCE,
    }.get(task_type)
    if appliance is not None:
        required.append(appliance)
    if task_type == cat.LOOK_AT_IN_LIGHT:
        lamp_homes = sorted(set(counts) & set(cat.DESKLAMP_HOMES))
        required.append(rng.choice(lamp_homes))
    kept = {kind: counts[kind] for kind in dict.fromkeys(required)}
    if level.max_receptacles is not None:
        others = [kind for kind in sorted(counts) if kind not in kept]
        rng.shuffle(others)
        for kind in others:
            if sum(kept.values()) + counts[kind] <= level.max_receptacles:
                kept[kind] = counts[kind]
    else:
        kept = counts
    ordered = {kind: kept[kind] for kind in counts if kind in kept}  # the room's own order
    return ordered, starts & set(ordered)


@lru_cache(maxsize=4096)
def generate(
    world_seed: int, layout_seed: int, task_type: str, level: str = HARD
) -> tuple[Layout, Goal]:
    """The room and goal of one task at ``level``; pure and cached (layouts are immutable).

    ``hard`` is the original world; an easier level trims the same drawn room with a random
    stream of its own, so ``hard`` draws exactly what it always drew.
    """
    spec = get_level(level)
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
    level_rng = None
    if not spec.is_original:
        level_rng = random.Random(f"household/{level}/{world_seed}/{layout_seed}/{task_type}")
        counts, starts = _keep_for_level(level_rng, spec, task_type, counts, target, starts)
        present = set(counts)

    receptacles = [f"{kind} {n}" for kind, count in counts.items() for n in range(1, count + 1)]
    by_type = {kind: [f"{kind} {n}" for n in range(1, count + 1)] for kind, count in counts.items()}

    def place(kind: str, homes: set[str]) -> str:
        home = _weighted(rng, cat.OBJECT_HOMES[kind], homes)
        return rng.choice(by_type[home])

    placed: list[tuple[str, str]] = []  # (object type, receptacle name)
    n_goal = rng.randint(2, 3) if task_type == cat.PICK_TWO_AND_PLACE else rng.randint(1, 2)
    in_view = {kind for kind in starts if kind not in cat.OPENABLE}
    for _ in range(n_goal):
        homes = starts
        if level_rng is not None and in_view and level_rng.random() < (spec.goal_in_view or 0.0):
            homes = in_view
        placed.append((goal_object, place(goal_object, homes)))

    others = [
        kind
        for kind in sorted(cat.ROOM_OBJECTS[room])
        if kind != goal_object and set(cat.OBJECT_HOMES[kind]) & present
    ]
    for kind in rng.sample(others, k=min(len(others), rng.randint(*spec.distractor_types))):
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
        layout_id=layout_id(world_seed, layout_seed, level),
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
