"""The household environment: four splits of generated tasks over disjoint ranges of layouts."""

from __future__ import annotations

from arena.core.env import (
    POOL_SPLIT,
    TEST_SPLITS,
    TRAIN_SPLIT,
    VALID_SPLIT,
    Environment,
    Instructions,
    SaltedTestDraws,
    drawn_seed,
)
from arena.core.types import Task
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.envs.household import catalog as cat
from arena.envs.household.layout import generate
from arena.envs.household.levels import HARD, get_level
from arena.envs.household.world import HouseholdEpisode

#: Bump when a change alters any task, room or reply; task ids carry it.
VERSION = "1.0"

#: Layout seeds of split ``s`` are ``SPLIT_SEED_BASE[s] + index``: disjoint ranges, so a test
#: room is never a train or valid room.
SPLIT_SEED_BASE = {
    TRAIN_SPLIT: 0,
    VALID_SPLIT: 1_000_000,
    TEST_SPLITS[0]: 2_000_000,
    TEST_SPLITS[1]: 3_000_000,
    POOL_SPLIT: 4_000_000,
}
MAX_SPLIT_SIZE = 1_000_000

#: Task types per split: test_unseen holds the types kept out of train and valid.
SPLIT_TASK_TYPES = {
    TRAIN_SPLIT: cat.SEEN_TASK_TYPES,
    VALID_SPLIT: cat.SEEN_TASK_TYPES,
    TEST_SPLITS[0]: cat.SEEN_TASK_TYPES,
    TEST_SPLITS[1]: cat.UNSEEN_TASK_TYPES,
    # The held-out types drawn like train, from their own rooms (``Environment.pool_tasks``).
    POOL_SPLIT: cat.UNSEEN_TASK_TYPES,
}


def make_task(world_seed: int, split: str, index: int, level: str = HARD, salt: str | None = None) -> Task:
    """Task ``index`` of ``split`` at ``level``; it depends on nothing else, so sizes only cut
    lists short. The original level's ids and payloads are those of the world before levels
    existed (so its split hashes, and the runs made on it, stay valid); the others name their
    level in both. Under an evaluation ``salt`` a test task's room comes from the salt
    (:func:`~arena.core.env.salted_seed`); its id and type do not change."""
    types = SPLIT_TASK_TYPES[split]
    task_type = types[index % len(types)]
    layout_seed = drawn_seed(salt, split, index, SPLIT_SEED_BASE[split] + index)
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
        sizes = {
            TRAIN_SPLIT: n_train,
            VALID_SPLIT: n_valid,
            TEST_SPLITS[0]: n_test,
            TEST_SPLITS[1]: n_test,
        }
        for split, size in sizes.items():
            if not 0 <= size <= MAX_SPLIT_SIZE:
                raise ValueError(f"{split} size must be in [0, {MAX_SPLIT_SIZE}], got {size}")
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
            self._tasks[split] = [
                make_task(self.seed, split, i, self.level, self._salt) for i in range(self.sizes[split])
            ]
        return list(self._tasks[split])

    def pool_tasks(self) -> list[Task]:
        """The held-out types with as many tasks per type as train has (600 at the default
        size), from a layout range of their own."""
        per_type = -(-self.sizes[TRAIN_SPLIT] // len(cat.SEEN_TASK_TYPES))
        size = per_type * len(cat.UNSEEN_TASK_TYPES)
        if POOL_SPLIT not in self._tasks:
            self._tasks[POOL_SPLIT] = [make_task(self.seed, POOL_SPLIT, i, self.level)
                                       for i in range(size)]
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
