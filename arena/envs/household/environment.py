"""The household environment: four splits of generated tasks, none of whose valid or test games
is a train game (each split keeps only games of its family: :func:`arena.core.contract.env.draw_games`)."""

from __future__ import annotations

from arena.core.contract.env import (
    POOL_SPLIT,
    TEST_SPLITS,
    TRAIN_SPLIT,
    VALID_SPLIT,
    Environment,
    Instructions,
    SaltedTestDraws,
    draw_games,
    drawn_seed,
)
from arena.core.contract.types import Task
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.envs.household import catalog as cat
from arena.envs.household.layout import generate
from arena.envs.household.levels import HARD, get_level
from arena.envs.household.world import HouseholdEpisode
from arena.envs.splits import SPLIT_SEED_BASE, split_sizes

#: Bump when a change alters any task, room or reply; task ids carry it. 2.0: splits keep only
#: games of their family, so no valid or test game is a train game (1.0's ``easy`` level had 21
#: test_seen games of 120 equal to train games, 39 with the same first prompt).
VERSION = "2.0"

# Layout seeds of split ``s`` are drawn from ``SPLIT_SEED_BASE[s] + draw`` (arena.envs.splits):
# disjoint ranges of seeds. A small level has far fewer distinct games than seeds, so disjoint
# seeds alone do not keep a test game out of train: the game's identity decides (``game_identity``).

#: Task types per split: test_unseen holds the types kept out of train and valid.
SPLIT_TASK_TYPES = {
    TRAIN_SPLIT: cat.SEEN_TASK_TYPES,
    VALID_SPLIT: cat.SEEN_TASK_TYPES,
    TEST_SPLITS[0]: cat.SEEN_TASK_TYPES,
    TEST_SPLITS[1]: cat.UNSEEN_TASK_TYPES,
    # The held-out types drawn like train, from their own rooms (``Environment.pool_tasks``).
    POOL_SPLIT: cat.UNSEEN_TASK_TYPES,
}


def make_task(world_seed: int, split: str, index: int, level: str = HARD, salt: str | None = None,
              draw: int | None = None) -> Task:
    """Task ``index`` of ``split`` at ``level``, its room from the split's ``draw``-th layout seed
    (by default ``index``-th: :meth:`HouseholdEnvironment.tasks` passes the draw its game was
    kept at). The levels other than ``hard`` name themselves in ids and payloads. Under an
    evaluation ``salt`` a test task's room comes from the salt
    (:func:`~arena.core.contract.env.salted_seed`); its id and type do not change."""
    types = SPLIT_TASK_TYPES[split]
    task_type = types[index % len(types)]
    draw = index if draw is None else draw
    layout_seed = drawn_seed(salt, split, draw, SPLIT_SEED_BASE[split] + draw)
    layout, goal = generate(world_seed, layout_seed, task_type, level)
    level_part = "" if level == HARD else f"{level}/"
    payload: dict[str, object] = {
        "world_seed": world_seed,
        "layout_seed": layout_seed,
        "layout_id": layout.layout_id,
        "room": layout.room,
        "object": goal.object_type,
        "target": goal.target,
        "lamp": goal.lamp,
    }
    if level != HARD:
        payload["level"] = level
    return Task(
        task_id=f"household/{VERSION}/{level_part}s{world_seed}/{split}/{index:05d}",
        env=HouseholdEnvironment.name,
        split=split,
        task_type=task_type,
        goal=goal.text,
        payload=payload,
    )


def game_identity(task: Task) -> str:
    """The game of a household task: its type and goal, the room and its receptacles, and
    which kinds of object start where. Copies of one kind and their numbers are left out: a room
    with two breads on the table is the same game as one with one bread there."""
    payload = task.payload
    layout, goal = generate(int(payload["world_seed"]), int(payload["layout_seed"]), task.task_type,
                            str(payload.get("level", HARD)))
    starts = sorted({(kind, layout.receptacles[where]) for kind, where in zip(layout.object_types, layout.start)})
    return repr((task.task_type, goal.object_type, goal.target, goal.lamp, layout.room, layout.receptacles, starts))


class HouseholdEnvironment(SaltedTestDraws, Environment):
    """A fast, deterministic ALFWorld-like text world generated from a seed.

    ``train``/``valid``/``test_seen`` hold the four pick/clean/heat/cool types; ``test_unseen``
    holds pick_two and look_at only. Each split draws its rooms from its own seed range.
    ``level`` (``levels.LEVELS``) sets the room size; ``hard`` is the original world.
    """

    name = "household"
    version = VERSION

    def __init__(
        self,
        *,
        seed: int = 0,
        n_train: int = 1200,
        n_valid: int = 120,
        n_test: int = 120,
        level: str = HARD,
        dialect: str = cat.MOVE_DIALECT,
    ) -> None:
        sizes = split_sizes(n_train, n_valid, n_test)
        if dialect not in cat.DIALECTS:
            raise ValueError(f"env.dialect={dialect!r} is not one of {', '.join(cat.DIALECTS)}: "
                             "move (`move X to Y`, the world's own) or put (`put X in/on Y`).")
        self.dialect = dialect
        self.level = get_level(level).name
        self.seed = int(seed)
        self.sizes = sizes
        self._tasks: dict[str, list[Task]] = {}

    def split_names(self) -> list[str]:
        return list(self.sizes)

    def tasks(self, split: str) -> list[Task]:
        if split not in self.sizes:
            raise ValueError(
                f"unknown split {split!r} for env {self.name!r}; "
                f"available splits: {', '.join(self.split_names())}"
            )
        if split not in self._tasks:
            self._tasks[split] = self._draw(split, self.sizes[split])
        return list(self._tasks[split])

    def _draw(self, split: str, size: int) -> list[Task]:
        def candidate(index: int, draw: int) -> tuple[Task, str]:
            task = make_task(self.seed, split, index, self.level, self._salt, draw)
            return task, game_identity(task)

        return draw_games(f"household {self.level}", split, size, candidate)

    def game_identity(self, task: Task) -> str:
        return game_identity(task)

    def pool_tasks(self) -> list[Task]:
        """The held-out types with as many tasks per type as train has (600 at the default
        size), from a layout range of their own."""
        per_type = -(-self.sizes[TRAIN_SPLIT] // len(cat.SEEN_TASK_TYPES))
        size = per_type * len(cat.UNSEEN_TASK_TYPES)
        if POOL_SPLIT not in self._tasks:
            self._tasks[POOL_SPLIT] = self._draw(POOL_SPLIT, size)
        return list(self._tasks[POOL_SPLIT])

    def instructions(self) -> Instructions:
        return HOUSEHOLD_INSTRUCTIONS

    def protocol_fields(self) -> dict[str, object]:
        # The dialect only where it is not the world's own, so earlier runs keep their fields.
        return {"level": self.level, **({"dialect": self.dialect} if self.dialect != cat.MOVE_DIALECT else {})}

    def open(self, task: Task) -> HouseholdEpisode:
        if task.env != self.name:
            raise ValueError(f"task {task.task_id} belongs to env {task.env!r}, not {self.name!r}")
        return HouseholdEpisode(task, self.dialect)
