"""The real ALFWorld text games behind Arena's environment interface.

Games are played through TextWorld's PDDL engine with ALFWorld's own wrappers
(``AlfredDemangler`` for object names such as ``apple 1``, ``AlfredInfos``), straight from
``game.tw-pddl`` files: the plain TextWorld path, not ``AlfredTWEnv``, which needs ALFRED's
``traj_data.json`` files as well. ``textworld`` and ``alfworld`` are imported only when a game is
played, so listing tasks and checking data work without them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arena.core.contract.env import (
    POOL_SPLIT,
    TEST_SPLITS,
    TRAIN_SPLIT,
    VALID_SPLIT,
    Environment,
    Episode,
    Instructions,
)
from arena.core.contract.types import Observation, Task
from arena.envs import alfworld_tasks as tasks
from arena.envs.alfworld import data

#: Bump when a change alters any task or reply; results record it with the data release.
ADAPTER_VERSION = "1"
VERSION = f"{data.RELEASE}+arena{ADAPTER_VERSION}"
INSTALL_COMMAND = "pip install 'arena[alfworld]'"
#: TextWorld's PDDL parser (one shared TatSu parser) and Fast Downward's translator keep
#: module-level state: two threads loading or stepping games at once corrupt it ("pop from empty
#: list"). Games of one process therefore take turns (they hold the GIL anyway); parallelism
#: comes from worker processes (``env.workers``).
ENGINE_LOCK = threading.RLock()

#: Protocol split -> (ALFWorld split, task types) for each split scheme.
SPLIT_SCHEMES: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    # Evolving-RL's type split: learn on four types; test on unseen rooms, trained vs held-out types.
    "type": {
        TRAIN_SPLIT: ("train", data.SEEN_TYPES),
        VALID_SPLIT: ("valid_seen", data.SEEN_TYPES),
        TEST_SPLITS[0]: ("valid_unseen", data.SEEN_TYPES),
        TEST_SPLITS[1]: ("valid_unseen", data.UNSEEN_TYPES),
    },
    # ALFWorld's own split: all six types; seen rooms (in-distribution) vs unseen rooms.
    "alfworld": {
        TRAIN_SPLIT: ("train", data.TASK_TYPES),
        TEST_SPLITS[0]: ("valid_seen", data.TASK_TYPES),
        TEST_SPLITS[1]: ("valid_unseen", data.TASK_TYPES),
    },
}


class AlfworldNotInstalled(ImportError, ValueError):
    """The ``alfworld`` package (with TextWorld) is missing; the message says how to install it.
    (A ValueError too: the command line reports those as user errors, without a traceback.)"""


def missing_engine_packages() -> list[str]:
    """Which of ``textworld`` and ``alfworld`` cannot be imported (checked without importing)."""
    missing = []
    for name in ("textworld", "alfworld"):
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):  # ValueError: a module blocked in sys.modules
            missing.append(name)
    return missing


def require_engine() -> None:
    missing = missing_engine_packages()
    if missing:
        raise AlfworldNotInstalled(
            f"The alfworld environment needs {' and '.join(missing)}, which are not installed. "
            f"Install them with: {INSTALL_COMMAND} (alfworld==0.4.2; it compiles two source "
            "packages, so cmake, g++ and make must be on the machine, and takes a few minutes)."
        )


def engine() -> tuple[Any, list[Any]]:
    """TextWorld and ALFWorld's wrappers, imported on first use."""
    require_engine()
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    return textworld, [AlfredDemangler(), AlfredInfos]


# -- progress -------------------------------------------------------------------------------

_GOAL_SECTION = re.compile(r"\(:goal(.*)", re.S)
_OBJECT_TYPE = re.compile(r"\(objectType \?(\w+) (\w+)\)")
_RECEPTACLE_TYPE = re.compile(r"\(receptacleType \?\w+ (\w+)\)")
_TOGGLED = re.compile(r"\(isToggled \?(\w+)\)")
#: The state a transforming task asks of its object, as a PDDL fact name.
_TRANSFORM_FACT = {
    tasks.HEAT_AND_PLACE: "ishot",
    tasks.COOL_AND_PLACE: "iscool",
    tasks.CLEAN_AND_PLACE: "isclean",
}


@dataclass(frozen=True)
class GoalTypes:
    """The object, target receptacle and lamp types a game's PDDL goal names (lower case, as in
    the engine's facts: ``appletype``)."""

    task_type: str
    object_type: str
    receptacle_type: str | None
    lamp_type: str | None

    @classmethod
    def parse(cls, task_type: str, pddl_problem: str) -> GoalTypes:
        match = _GOAL_SECTION.search(pddl_problem)
        goal = match.group(1) if match else ""
        lamp_vars = set(_TOGGLED.findall(goal))
        objects = [(var, kind.lower()) for var, kind in _OBJECT_TYPE.findall(goal)]
        targets = [kind.lower() for kind in _RECEPTACLE_TYPE.findall(goal)]
        goal_objects = [kind for var, kind in objects if var not in lamp_vars]
        lamps = [kind for var, kind in objects if var in lamp_vars]
        if not goal_objects:
            raise ValueError("the game's PDDL goal names no object type")
        return cls(task_type, goal_objects[0], targets[0] if targets else None,
                   lamps[0] if lamps else None)


class Progress:
    """Subgoals met, as in the household world: a goal object picked up (ever); then the second
    subgoal (object transformed / one of two placed / lamp switched on); then the goal itself.
    pick_and_place_simple has only the first and the goal."""

    def __init__(self, goal: GoalTypes, facts: list[Any]) -> None:
        self.goal = goal
        self.objects: set[str] = set()
        self.targets: set[str] = set()
        self.lamps: set[str] = set()
        for fact in facts:  # types never change during a game: collect them once
            if fact.name == "objecttype":
                name, kind = fact.arguments[0].name, fact.arguments[1].name
                if kind == goal.object_type:
                    self.objects.add(name)
                elif kind == goal.lamp_type:
                    self.lamps.add(name)
            elif fact.name == "receptacletype" and fact.arguments[1].name == goal.receptacle_type:
                self.targets.add(fact.arguments[0].name)
        self.picked = False

    def update(self, facts: list[Any], won: bool) -> float:
        if won:
            return 1.0
        task_type = self.goal.task_type
        second = False
        transform = _TRANSFORM_FACT.get(task_type)
        for fact in facts:
            name = fact.name
            if name == "holds" and fact.arguments[1].name in self.objects:
                self.picked = True
            elif transform is not None and name == transform:
                second = second or fact.arguments[0].name in self.objects
            elif task_type == tasks.PICK_TWO_AND_PLACE and name == "inreceptacle":
                second = second or (fact.arguments[0].name in self.objects
                                    and fact.arguments[1].name in self.targets)
            elif task_type == tasks.LOOK_AT_IN_LIGHT and name == "istoggled":
                second = second or fact.arguments[0].name in self.lamps
        if task_type == tasks.PICK_AND_PLACE:
            return 0.5 if self.picked else 0.0
        return (self.picked + second) / 3


# -- episodes -------------------------------------------------------------------------------


class AlfworldEpisode(Episode):
    """One ALFWorld game. The game loads on the first ``reset`` (about a second of CPU) and is
    kept for later resets; ``step`` takes 30 to 120 ms (the engine lists every admissible
    command). Engine calls hold :data:`ENGINE_LOCK`, so episodes in threads take turns."""

    def __init__(self, task: Task, game_path: Path, *, max_steps: int) -> None:
        self.task = task
        self.game_path = Path(game_path)
        self.max_steps = int(max_steps)
        self._game: Any = None
        self._goal_types: GoalTypes | None = None
        self._walkthrough: list[str] = []
        self._taken: list[str] = []
        self._won = False
        self._progress: Progress | None = None

    def reset(self) -> Observation:
        with ENGINE_LOCK:
            return self._reset()

    def _reset(self) -> Observation:
        if self._game is None:
            if not self.game_path.is_file():
                raise data.AlfworldDataError(
                    f"Game file of task {self.task.task_id} not found: {self.game_path}. "
                    f"{data.INSTALL_HINT}."
                )
            textworld, wrappers = engine()
            infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["walkthrough"])
            self._game = textworld.start(str(self.game_path), infos, wrappers=wrappers)
            problem = json.loads(self.game_path.read_text(encoding="utf-8"))["pddl_problem"]
            self._goal_types = GoalTypes.parse(self.task.task_type, problem)
        assert self._goal_types is not None
        state = self._game.reset()
        self._walkthrough = list(state.get("extra.walkthrough") or [])
        self._taken = []
        self._won = False
        self._progress = Progress(self._goal_types, state["_facts"])
        return self._observe(state, reward=0.0)

    def step(self, action: str) -> Observation:
        if self._game is None or self._progress is None:
            raise RuntimeError("call reset() before step()")
        if self._won or len(self._taken) >= self.max_steps:
            raise RuntimeError(f"episode of {self.task.task_id} is over; reset() to play again")
        with ENGINE_LOCK:
            state, _score, _done = self._game.step(action)
        self._taken.append(action)
        won_now = bool(state["won"]) and not self._won
        self._won = self._won or bool(state["won"])
        return self._observe(state, reward=1.0 if won_now else 0.0)

    def _observe(self, state: Any, reward: float) -> Observation:
        assert self._progress is not None
        return Observation(
            text=str(state.feedback),
            admissible_actions=tuple(state["admissible_commands"]),
            reward=reward,
            done=self._won or len(self._taken) >= self.max_steps,
            won=self._won,
            progress=self._progress.update(state["_facts"], self._won),
            truncated=not self._won and len(self._taken) >= self.max_steps,
        )

    def expert_action(self) -> str | None:
        """The game's walkthrough while the episode has followed it; after a detour, the first
        command of a fresh plan from TextWorld's PDDL planner (None if it finds none)."""
        if self._game is None or self._won:
            return None
        position = len(self._taken)
        if self._taken == self._walkthrough[:position] and position < len(self._walkthrough):
            return self._walkthrough[position]
        return self._replan()

    def _replan(self) -> str | None:
        pddl_env = self._game
        while hasattr(pddl_env, "_wrapped_env"):  # below ALFWorld's wrappers: TextWorld's PddlEnv
            pddl_env = pddl_env._wrapped_env
        try:
            with ENGINE_LOCK:
                plan = pddl_env._pddl_state.replan(pddl_env._entity_infos)
        except Exception:  # a planner failure means "no expert here", not a broken episode
            return None
        return plan[0] if plan else None

    def close(self) -> None:
        if self._game is not None:
            with ENGINE_LOCK:
                self._game.close()
            self._game = None


# -- the environment ------------------------------------------------------------------------


class AlfworldEnvironment(Environment):
    """ALFWorld's 3827 json_2.1.1 games under one of two split schemes (``SPLIT_SCHEMES``):
    ``type`` (Evolving-RL's, the default) or ``alfworld`` (ALFWorld's seen / unseen rooms)."""

    name = "alfworld"
    version = VERSION
    packages = ("alfworld", "textworld")

    def __init__(self, data_dir: Path | str, *, split_scheme: str = "type", max_steps: int = 50) -> None:
        if split_scheme not in SPLIT_SCHEMES:
            raise ValueError(
                f"Unknown ALFWorld split scheme '{split_scheme}'; env.split must be one of "
                f"{', '.join(SPLIT_SCHEMES)}."
            )
        if int(max_steps) < 1:
            raise ValueError(f"env.max_steps must be at least 1, got {max_steps}")
        self.data_dir = Path(data_dir)
        self.split_scheme = split_scheme
        self.max_steps = int(max_steps)
        self._games: dict[str, list[data.Game]] = {}

    def split_names(self) -> list[str]:
        return list(SPLIT_SCHEMES[self.split_scheme])

    def games(self, alfworld_split: str) -> list[data.Game]:
        """Every game of one of ALFWorld's own splits (train, valid_seen, valid_unseen)."""
        if alfworld_split not in data.ALFWORLD_SPLITS:
            raise ValueError(
                f"unknown ALFWorld split {alfworld_split!r}; splits: {', '.join(data.ALFWORLD_SPLITS)}"
            )
        if alfworld_split not in self._games:
            data.require_data(self.data_dir, [alfworld_split])
            self._games[alfworld_split] = data.scan_games(self.data_dir, alfworld_split)
        return list(self._games[alfworld_split])

    def task_of(self, game: data.Game, split: str) -> Task:
        return Task(
            task_id=f"{self.name}/{game.game_id}",
            env=self.name,
            split=split,
            task_type=game.task_type,
            goal=game.goal,
            payload={"game": game.relative_path, "alfworld_split": game.alfworld_split},
        )

    def tasks(self, split: str) -> list[Task]:
        scheme = SPLIT_SCHEMES[self.split_scheme]
        if split not in scheme:
            raise ValueError(
                f"unknown split {split!r} for env {self.name!r} (env.split={self.split_scheme}); "
                f"available splits: {', '.join(self.split_names())}"
            )
        alfworld_split, types = scheme[split]
        return [self.task_of(g, split) for g in self.games(alfworld_split) if g.task_type in types]

    def pool_tasks(self) -> list[Task]:
        """ALFWorld's train games of the types this scheme's train split holds out (under the
        type split: pick_two and look_at; under ALFWorld's own split: none)."""
        alfworld_split, types = SPLIT_SCHEMES[self.split_scheme][TRAIN_SPLIT]
        return [self.task_of(g, POOL_SPLIT) for g in self.games(alfworld_split)
                if g.task_type not in types]

    def all_tasks(self, alfworld_split: str) -> list[Task]:
        """Every game of an ALFWorld split as a task whose ``split`` is that ALFWorld split
        (for replaying all games; the protocol uses :meth:`tasks`)."""
        return [self.task_of(g, alfworld_split) for g in self.games(alfworld_split)]

    def instructions(self) -> Instructions:
        return tasks.HOUSEHOLD_INSTRUCTIONS

    def open(self, task: Task) -> AlfworldEpisode:
        if task.env != self.name:
            raise ValueError(f"task {task.task_id} belongs to env {task.env!r}, not {self.name!r}")
        try:
            relative = task.payload["game"]
        except KeyError:
            raise ValueError(f"task {task.task_id} lacks payload field 'game'") from None
        return AlfworldEpisode(task, self.data_dir / relative, max_steps=self.max_steps)
