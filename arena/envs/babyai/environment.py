"""BabyAI-Text: minigrid's BabyAI levels as text games, split by seed range and by level.

``train``, ``valid`` and ``test_seen`` draw their tasks from the seen levels, each from its own
range of minigrid seeds (so a test layout is never a train layout); ``test_unseen`` holds levels
training never meets (by default whole families: opening doors, putting objects next to others).
A task's seed fixes its layout and mission; its level is its task type.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from typing import Any, cast

import gymnasium
import minigrid
from gymnasium.envs.registration import load_env_creator
from minigrid.core.roomgrid import RoomGrid
from minigrid.envs.babyai.core.roomgrid_level import RejectSampling
from minigrid.envs.babyai.core.verifier import SeqInstr
from minigrid.utils.baby_ai_bot import BabyAIBot

from arena.core.contract.env import (
    POOL_SPLIT,
    TEST_SPLITS,
    TRAIN_SPLIT,
    Environment,
    Episode,
    Instructions,
    SaltedTestDraws,
    draw_games,
    drawn_seed,
)
from arena.core.contract.types import Observation, Task
from arena.envs.babyai import text
from arena.envs.babyai.levels import DEFAULT_SEEN, DEFAULT_UNSEEN, check_held_out, get_level
from arena.envs.babyai.view import egocentric_view
from arena.envs.splits import SPLIT_SEED_BASE, split_sizes

#: Bump when a change alters any task or reply. Task ids carry it with minigrid's version, whose
#: level generators define the layouts. 2.0: splits keep only games of their family, so no valid
#: or test game is a train game (1.0's test_seen 00024 was train 00956: same grid, position and
#: direction).
VERSION = f"2.0-minigrid{importlib.metadata.version('minigrid')}"
#: Minigrid seeds of split ``s`` are drawn from ``world seed * WORLD_STRIDE + SPLIT_SEED_BASE[s] +
#: draw`` (arena.envs.splits); a split keeps the draws whose game is of its family
#: (:func:`~arena.core.contract.env.draw_games`).
WORLD_STRIDE = 10_000_000

INSTRUCTIONS = Instructions(
    setting="a grid world",
    domain="grid-world",
    actions=text.COMMAND_HELP,
)

assert minigrid  # imported for its registration of the BabyAI levels with gymnasium


@functools.cache
def _text_level_class(level: str) -> tuple[type, dict[str, Any]]:
    """Minigrid's class of ``level`` with the fast view (:mod:`arena.envs.babyai.view`) as its
    observation, and the keyword arguments minigrid registers the level with."""
    spec = gymnasium.spec(get_level(level).gym_id)
    base = load_env_creator(str(spec.entry_point))
    if not isinstance(base, type):  # minigrid registers every BabyAI level by its class
        raise TypeError(f"{spec.id} is registered with {spec.entry_point!r}, not a class")

    def gen_obs(self: Any) -> dict[str, Any]:
        return {"image": egocentric_view(self), "direction": self.agent_dir, "mission": self.mission}

    def _gen_grid(self: Any, width: int, height: int) -> None:
        """minigrid's ``RoomGridLevel._gen_grid`` without its print of every rejected sample:
        the same retries drawing from the same generator, so the same layout for a seed."""
        while True:
            try:
                RoomGrid._gen_grid(self, width, height)
                self.gen_mission()
                self.validate_instrs(self.instrs)
            except (RecursionError, RejectSampling):
                continue
            break
        self.surface = self.instrs.surface(self)
        self.mission = self.surface

    text_class = type(f"Text{base.__name__}", (base,), {
        "gen_obs": gen_obs,
        "_gen_grid": _gen_grid,
        "__doc__": f"minigrid's {base.__name__}, observed through arena.envs.babyai.view, generated quietly.",
    })
    return text_class, dict(spec.kwargs)


def _new_level_env(level: str) -> Any:
    """A fresh environment of ``level``: minigrid's level, observed through the fast view."""
    text_class, kwargs = _text_level_class(level)
    return text_class(**kwargs)


def _reset(env: Any, seed: int) -> dict[str, Any]:
    """Reset to the layout of ``seed``; the first observation."""
    observation, _ = env.reset(seed=seed)
    return dict(observation)


@functools.lru_cache(maxsize=64)
def _mission_env(level: str) -> Any:
    return _new_level_env(level)


def mission_of(level: str, seed: int) -> tuple[str, int]:
    """The mission and step limit of ``level`` at ``seed`` (what a task records)."""
    mission, limit, _ = game_of(level, seed)
    return mission, limit


def game_of(level: str, seed: int) -> tuple[str, int, str]:
    """The mission, step limit and game identity of ``level`` at ``seed``: the level, the
    mission, the whole grid (every cell's object, colour and state) and the agent's start."""
    env = _mission_env(level)
    observation = _reset(env, seed)
    world = env.unwrapped
    grid = hashlib.sha256(world.grid.encode().tobytes()).hexdigest()
    identity = repr((level, str(observation["mission"]), grid, tuple(int(v) for v in world.agent_pos),
                     int(world.agent_dir)))
    return str(observation["mission"]), int(env.max_steps), identity


class BotStuck(RuntimeError):
    """minigrid's bot searched past :attr:`BoundedBot.MAX_SEARCHES_PER_STEP` in one step."""


class BoundedBot(BabyAIBot):
    """minigrid's BabyAI bot with a cap on the path searches of one step. On a few multi-room
    layouts its replanning never ends (minigrid 3.2.0, ``BabyAI-Unlock-v0`` at seed 3,000,031:
    after 140 steps one ``replan`` call searches forever); capped, the expert has no command
    there instead of hanging the run. A step takes at most 10 searches otherwise (measured on
    Unlock, GoTo and BossLevel)."""

    MAX_SEARCHES_PER_STEP = 500

    def __init__(self, mission: Any) -> None:
        self._searches = 0
        super().__init__(mission)

    def replan(self, action_taken: Any = None) -> Any:
        self._searches = 0
        return super().replan(action_taken)

    def _breadth_first_search(self, *args: Any, **kwargs: Any) -> Any:
        self._searches += 1
        if self._searches > self.MAX_SEARCHES_PER_STEP:
            raise BotStuck(f"the bot searched {self._searches} times in one step")
        return super()._breadth_first_search(*args, **kwargs)


def _subgoals(instruction: Any, finished: bool) -> tuple[int, int]:
    """(done, total) leaf instructions of a BabyAI instruction tree (a sequence records in
    ``a_done``/``b_done`` which of its two parts succeeded)."""
    if isinstance(instruction, SeqInstr):
        instruction = cast(Any, instruction)
        done_a, total_a = _subgoals(instruction.instr_a, finished or instruction.a_done == "success")
        done_b, total_b = _subgoals(instruction.instr_b, finished or instruction.b_done == "success")
        return done_a + done_b, total_a + total_b
    return int(finished), 1


class BabyAIEpisode(Episode):
    """One BabyAI level at one seed, played with text commands.

    A command that is not admissible now (``go forward`` into a wall, ``pick up`` with full
    hands) is not sent to minigrid: the reply is ``Nothing happens.`` and the level's own step
    count does not move, as an invalid command in ALFWorld changes nothing.
    """

    def __init__(self, task: Task, recolour: bool = False) -> None:
        self.task = task
        #: What the agent reads: the world's words, or (``env.recolour``) its colours renamed.
        self._words = text.recolour if recolour else str
        self._env = _new_level_env(str(task.payload["level"]))
        self._bot: Any = None
        self._suggestion: int | None = None
        self._bot_failed = False
        self._won = False
        #: The commands admissible in the current state (set with each observation).
        self._admissible: tuple[str, ...] = ()

    def _view(self, minigrid_obs: dict[str, Any]) -> str:
        """The view's sentence; the state's admissible commands are kept beside it."""
        self._admissible = text.admissible_commands(self._env)
        return self._words(text.describe_view(minigrid_obs["image"], self._env.carrying))

    def reset(self) -> Observation:
        minigrid_obs = _reset(self._env, int(self.task.payload["seed"]))
        self._bot, self._suggestion, self._bot_failed, self._won = None, None, False, False
        view = self._view(minigrid_obs)
        return Observation(text=f"Your mission: {self.task.goal}.\n{view}", admissible_actions=self._admissible)

    def step(self, action: str) -> Observation:
        command = action.strip().lower()
        if command not in self._admissible:
            return Observation(text=text.NOTHING_HAPPENS, admissible_actions=self._admissible)
        said = self._words(text.before_command(self._env, command))
        minigrid_obs, reward, terminated, truncated, _ = self._env.step(text.ACTION_OF[command])
        self._won = bool(terminated and reward > 0)
        self._advise(text.ACTION_OF[command])
        done_subgoals, total = _subgoals(self._env.instrs, self._won)
        view = self._view(minigrid_obs)
        return Observation(
            text=f"{said} {view}",
            admissible_actions=self._admissible,
            reward=float(reward),
            done=bool(terminated or truncated),
            won=self._won,
            progress=done_subgoals / total,
            truncated=bool(truncated and not terminated),
        )

    def _advise(self, taken: int | None) -> None:
        """Keep the bot's plan in step with the game: BabyAI's bot replans once per state,
        told which action was taken (it advises any player, not only itself)."""
        if self._bot is None or self._bot_failed:
            return
        try:
            self._suggestion = int(self._bot.replan(taken))
        except Exception:  # it asserts on states its plans never reach (an opened box), or is stuck
            self._bot_failed, self._suggestion = True, None

    def expert_action(self) -> str | None:
        """minigrid's BabyAI bot's next command from the current state (None once won, or
        where the bot cannot plan or is stuck: :class:`BoundedBot`). Started at the first call;
        from then on it is told every command played, so its plan follows the game."""
        if self._won or self._bot_failed:
            return None
        if self._bot is None:
            self._bot = BoundedBot(self._env)
            self._advise(None)
        if self._suggestion is None or self._suggestion >= len(text.COMMANDS):
            return None
        command = text.COMMANDS[self._suggestion]
        return command if command in self._admissible else None

    def close(self) -> None:
        self._env.close()


class BabyAIEnvironment(SaltedTestDraws, Environment):
    """BabyAI-Text over minigrid: the seen levels in train/valid/test_seen (disjoint seed ranges),
    the held-out levels in test_unseen. Task ``i`` of a split plays level ``i mod n_levels``."""

    name = "babyai"
    version = VERSION
    packages = ("minigrid", "gymnasium")

    def __init__(
        self,
        *,
        seed: int = 0,
        n_train: int = 1000,
        n_valid: int = 100,
        n_test: int = 100,
        seen_levels: tuple[str, ...] | list[str] = DEFAULT_SEEN,
        unseen_levels: tuple[str, ...] | list[str] = DEFAULT_UNSEEN,
        recolour: bool = False,
    ) -> None:
        sizes = split_sizes(n_train, n_valid, n_test)
        if seed < 0:
            raise ValueError(f"env.seed must be 0 or more, got {seed}")
        self.seen_levels, self.unseen_levels = tuple(seen_levels), tuple(unseen_levels)
        check_held_out(self.seen_levels, self.unseen_levels)
        self.seed = int(seed)
        self.recolour = bool(recolour)
        self.sizes = sizes
        self._tasks: dict[str, list[Task]] = {}

    def split_names(self) -> list[str]:
        return list(self.sizes)

    def levels_of(self, split: str) -> tuple[str, ...]:
        return self.unseen_levels if split in (TEST_SPLITS[1], POOL_SPLIT) else self.seen_levels

    def _make_task(self, split: str, index: int, draw: int) -> tuple[Task, str]:
        levels = self.levels_of(split)
        level = levels[index % len(levels)]
        seed = drawn_seed(self._salt, split, draw, self.seed * WORLD_STRIDE + SPLIT_SEED_BASE[split] + draw)
        mission, limit, identity = game_of(level, seed)
        return Task(
            task_id=f"babyai/{VERSION}/s{self.seed}/{split}/{index:05d}",
            env=self.name,
            split=split,
            task_type=level,
            goal=text.recolour(mission) if self.recolour else mission,
            payload={"level": level, "seed": seed, "max_steps": limit},
        ), identity

    def _draw(self, split: str, size: int) -> list[Task]:
        return draw_games("babyai", split, size, lambda index, draw: self._make_task(split, index, draw))

    def game_identity(self, task: Task) -> str:
        return game_of(str(task.payload["level"]), int(task.payload["seed"]))[2]

    def tasks(self, split: str) -> list[Task]:
        if split not in self.sizes:
            raise ValueError(f"unknown split {split!r} for env {self.name!r}; "
                             f"available splits: {', '.join(self.split_names())}")
        if split not in self._tasks:
            self._tasks[split] = self._draw(split, self.sizes[split])
        return list(self._tasks[split])

    def pool_tasks(self) -> list[Task]:
        """The held-out levels with as many tasks per level as train has, from their own seeds."""
        per_level = -(-self.sizes[TRAIN_SPLIT] // len(self.seen_levels))
        if POOL_SPLIT not in self._tasks:
            self._tasks[POOL_SPLIT] = self._draw(POOL_SPLIT, per_level * len(self.unseen_levels))
        return list(self._tasks[POOL_SPLIT])

    @functools.cached_property
    def max_steps(self) -> int:  # type: ignore[override]
        """The longest of the levels' own limits over every split (each episode also ends at its
        level's own); computed once, since the harness reads it per episode."""
        limits = [int(task.payload["max_steps"]) for split in self.sizes for task in self.tasks(split)]
        return max(limits, default=64)

    def instructions(self) -> Instructions:
        return INSTRUCTIONS

    def protocol_fields(self) -> dict[str, object]:
        # The recolouring only where it is on, so earlier runs keep their fields.
        return {"seen_levels": list(self.seen_levels), "unseen_levels": list(self.unseen_levels),
                **({"recolour": True} if self.recolour else {})}

    def open(self, task: Task) -> BabyAIEpisode:
        if task.env != self.name:
            raise ValueError(f"task {task.task_id} belongs to env {task.env!r}, not {self.name!r}")
        return BabyAIEpisode(task, self.recolour)
