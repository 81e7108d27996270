"""The household game: ALFWorld's commands and replies over a generated room, and its expert.

The state is a handful of flat lists indexed by receptacle or object number, and everything that
does not change during an episode (command strings, the ``go to`` part of the admissible list,
which receptacle is an appliance) is compiled once per layout. That keeps a step to a dictionary
look-up, a few list writes and one sort of the admissible commands.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from arena.core.contract.env import Episode
from arena.core.contract.types import Observation, Task
from arena.envs.household import catalog as cat
from arena.envs.household.layout import Goal, Layout, generate
from arena.envs.household.levels import HARD, get_level

NOTHING_HAPPENS = "Nothing happens."
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
LOOK_MIDDLE = "You are in the middle of a room. Looking quickly around you, you see nothing."

# Command codes of the per-step command table.
_OPEN, _CLOSE, _TAKE, _MOVE, _HEAT, _COOL, _CLEAN, _USE, _EXAMINE_RECEPTACLE, _EXAMINE_OBJECT = (
    range(10)
)
_STATE_CHANGING = frozenset({_OPEN, _CLOSE, _TAKE, _MOVE, _HEAT, _COOL, _CLEAN, _USE})
_APPLIANCE_CODE = {
    cat.HEAT_APPLIANCE: _HEAT,
    cat.COOL_APPLIANCE: _COOL,
    cat.CLEAN_APPLIANCE: _CLEAN,
}
_TRANSFORM_VERB = {_HEAT: "heat", _COOL: "cool", _CLEAN: "clean"}
_TRANSFORM_OF_TASK = {
    cat.HEAT_AND_PLACE: _HEAT,
    cat.COOL_AND_PLACE: _COOL,
    cat.CLEAN_AND_PLACE: _CLEAN,
}


def _join(items: list[str]) -> str:
    """ALFWorld's lists: ``nothing`` / ``a x`` / ``a x, and a y`` / ``a x, a y, and a z``."""
    if not items:
        return "nothing"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def _search_order(layout: Layout, likely: dict[str, int]) -> tuple[int, ...]:
    """Receptacles in the order an expert searches them: the likeliest types first (by the
    catalog's weights), then the others; by number within a type."""

    def key(r: int) -> tuple[int, str, int]:
        kind, number = layout.receptacles[r].rsplit(" ", 1)
        return (-likely.get(kind, 0), kind, int(number))

    return tuple(sorted(range(len(layout.receptacles)), key=key))


@dataclass(frozen=True)
class CompiledWorld:
    """Everything about one task that stays fixed during its episodes."""

    layout: Layout
    goal: Goal
    intro: str
    go_commands: dict[str, int]  # "go to X" -> receptacle index
    base_admissible: tuple[tuple[str, ...], ...]  # per location + 1: go to others, help, ...
    lists_examine: bool  # whether "examine ..." commands are listed as admissible
    openable: tuple[bool, ...]
    appliance: tuple[int, ...]  # per receptacle: _HEAT/_COOL/_CLEAN code, or -1
    can_transform: tuple[frozenset[int], ...]  # per object: codes it accepts
    pickupable: tuple[bool, ...]
    lamps_at: tuple[tuple[int, ...], ...]  # per receptacle: lamps standing on it
    listed: tuple[str, ...]  # per object: "a apple 1"
    goal_objects: tuple[int, ...]
    is_target: tuple[bool, ...]  # per receptacle: of the goal's target type
    search_order: tuple[int, ...]  # where the expert looks for the goal object
    lamp_search_order: tuple[int, ...]  # where the expert looks for the lamp
    appliance_for_goal: int  # receptacle index of the goal's appliance, or -1


@lru_cache(maxsize=4096)
def compile_world(
    world_seed: int, layout_seed: int, task_type: str, level: str = HARD
) -> CompiledWorld:
    """Precompute a task's fixed strings and tables once, so that steps stay cheap."""
    layout, goal = generate(world_seed, layout_seed, task_type, level)
    names = layout.receptacles
    n = len(names)
    go_commands = {f"go to {name}": r for r, name in enumerate(names)}
    listed_always = get_level(level).lists_utility_commands
    always = ["help", "inventory", "look"] if listed_always else []
    base = []
    for here in range(-1, n):
        commands = [f"go to {name}" for r, name in enumerate(names) if r != here] + always
        base.append(tuple(sorted(commands)))
    appliance = tuple(_APPLIANCE_CODE.get(kind, -1) for kind in layout.receptacle_types)
    accepted = {_HEAT: cat.HEATABLE, _COOL: cat.COOLABLE, _CLEAN: cat.CLEANABLE}
    lamps_at: list[list[int]] = [[] for _ in range(n)]
    for o, kind in enumerate(layout.object_types):
        if kind == cat.DESKLAMP:
            lamps_at[layout.start[o]].append(o)
    transform = _TRANSFORM_OF_TASK.get(goal.task_type)
    by_number = _search_order(layout, {})
    goal_appliance = next(
        (r for r in by_number if transform is not None and appliance[r] == transform), -1
    )
    intro = (
        f"{WELCOME}\n\nYou are in the middle of a room. Looking quickly around you, you see "
        f"{_join(['a ' + name for name in names])}.\n\nYour task is to: {goal.text}"
    )
    return CompiledWorld(
        layout=layout,
        goal=goal,
        intro=intro,
        go_commands=go_commands,
        base_admissible=tuple(base),
        lists_examine=listed_always,
        openable=tuple(kind in cat.OPENABLE for kind in layout.receptacle_types),
        appliance=appliance,
        can_transform=tuple(
            frozenset(code for code, kinds in accepted.items() if kind in kinds)
            for kind in layout.object_types
        ),
        pickupable=tuple(kind != cat.DESKLAMP for kind in layout.object_types),
        lamps_at=tuple(tuple(lamps) for lamps in lamps_at),
        listed=tuple("a " + name for name in layout.objects),
        goal_objects=tuple(
            o for o, kind in enumerate(layout.object_types) if kind == goal.object_type
        ),
        is_target=tuple(kind == goal.target for kind in layout.receptacle_types),
        search_order=_search_order(layout, cat.OBJECT_HOMES[goal.object_type]),
        lamp_search_order=_search_order(layout, cat.DESKLAMP_HOMES),
        appliance_for_goal=goal_appliance,
    )


def compiled_for(task: Task) -> CompiledWorld:
    """The compiled world of a task, checked against what its payload says it is."""
    payload: dict[str, Any] = task.payload
    try:
        world = compile_world(
            int(payload["world_seed"]),
            int(payload["layout_seed"]),
            task.task_type,
            str(payload.get("level", HARD)),
        )
    except KeyError as missing:
        raise ValueError(f"task {task.task_id} lacks payload field {missing}") from None
    built = (world.layout.layout_id, world.goal.object_type, world.goal.text)
    claimed = (payload.get("layout_id"), payload.get("object"), task.goal)
    if built != claimed:
        raise ValueError(
            f"task {task.task_id} does not match this household world (version differs?): "
            f"task says {claimed}, world builds {built}"
        )
    return world


class HouseholdEpisode(Episode):
    """One game in a household room. ``reset`` first; every command answers as ALFWorld does."""

    def __init__(self, task: Task, dialect: str = cat.MOVE_DIALECT) -> None:
        self.task = task
        self.world = compiled_for(task)
        put = dialect == cat.PUT_DIALECT
        self._place = "put {o} in/on {r}" if put else "move {o} to {r}"
        self._placed = "You put the {o} in/on the {r}." if put else "You move the {o} to the {r}."
        self._help = cat.PUT_HELP_TEXT if put else cat.HELP_TEXT
        self.reset()

    # -- state ----------------------------------------------------------------------------

    def reset(self) -> Observation:
        world = self.world
        layout = world.layout
        n_receptacles = len(layout.receptacles)
        n_objects = len(layout.objects)
        self.location = -1  # -1: the middle of the room
        self.held = -1
        self.where = list(layout.start)  # receptacle of each object, -1 while held
        self.contents: list[list[int]] = [[] for _ in range(n_receptacles)]
        for o, r in enumerate(layout.start):
            self.contents[r].append(o)  # objects are in listing order, so lists stay sorted
        self.opened = [False] * n_receptacles
        self.seen = [False] * n_receptacles  # contents observed (the expert's memory)
        self.hot = [False] * n_objects
        self.cool = [False] * n_objects
        self.clean = [False] * n_objects
        self.toggled = [False] * n_objects
        self.picked_goal_object = False
        self.won = False
        self._refresh()
        return Observation(text=world.intro, admissible_actions=self._admissible)

    def _refresh(self) -> None:
        """Rebuild the command table of the current state (after a state change only)."""
        world = self.world
        here = self.location
        commands: dict[str, tuple[int, int]] = {}
        if here >= 0:
            name = world.layout.receptacles[here]
            visible = True
            if world.openable[here]:
                visible = self.opened[here]
                commands[("close " if visible else "open ") + name] = (
                    (_CLOSE if visible else _OPEN),
                    here,
                )
            commands["examine " + name] = (_EXAMINE_RECEPTACLE, here)
            held = self.held
            if held < 0:
                if visible:
                    objects = world.layout.objects
                    pickupable = world.pickupable
                    for o in self.contents[here]:
                        if pickupable[o]:
                            commands[f"take {objects[o]} from {name}"] = (_TAKE, o)
            else:
                held_name = world.layout.objects[held]
                commands["examine " + held_name] = (_EXAMINE_OBJECT, held)
                if visible:
                    commands[self._place.format(o=held_name, r=name)] = (_MOVE, held)
                code = world.appliance[here]
                if code >= 0 and code in world.can_transform[held]:
                    commands[f"{_TRANSFORM_VERB[code]} {held_name} with {name}"] = (code, held)
            for lamp in world.lamps_at[here]:
                commands["use " + world.layout.objects[lamp]] = (_USE, lamp)
        self._commands = commands
        admissible = list(world.base_admissible[here + 1])
        if world.lists_examine:
            admissible += commands
        else:  # still understood when typed, only not listed (see levels.Level)
            admissible += [c for c, (code, _) in commands.items()
                           if code not in (_EXAMINE_RECEPTACLE, _EXAMINE_OBJECT)]
        admissible.sort()
        self._admissible = tuple(admissible)

    # -- stepping -------------------------------------------------------------------------

    def step(self, action: str) -> Observation:
        command = " ".join(action.lower().split())
        entry = self._commands.get(command)
        changed = False
        if entry is not None:
            text = self._apply(entry[0], entry[1])
            changed = entry[0] in _STATE_CHANGING
        else:
            target = self.world.go_commands.get(command)
            if target is not None and target != self.location:
                text = self._go(target)
                changed = True
            elif command == "look":
                text = self._look()
            elif command == "inventory":
                text = self._inventory()
            elif command == "help":
                text = self._help
            else:
                text = NOTHING_HAPPENS
        reward = 0.0
        if changed:
            self._refresh()
            if not self.won and self._goal_holds():
                self.won = True
                reward = 1.0
        return Observation(
            text=text,
            admissible_actions=self._admissible,
            reward=reward,
            done=self.won,
            won=self.won,
            progress=self.progress(),
        )

    def _go(self, r: int) -> str:
        self.location = r
        if not self.world.openable[r] or self.opened[r]:
            self.seen[r] = True
        return f"You arrive at {self.world.layout.receptacles[r]}. {self._describe(r)}"

    def _apply(self, code: int, arg: int) -> str:
        world = self.world
        objects = world.layout.objects
        here = self.location
        here_name = world.layout.receptacles[here]
        if code == _TAKE:
            self.contents[here].remove(arg)
            self.where[arg] = -1
            self.held = arg
            if world.layout.object_types[arg] == world.goal.object_type:
                self.picked_goal_object = True
            return f"You pick up the {objects[arg]} from the {here_name}."
        if code == _MOVE:
            insort(self.contents[here], arg)
            self.where[arg] = here
            self.held = -1
            return self._placed.format(o=objects[arg], r=here_name)
        if code == _OPEN:
            self.opened[here] = True
            self.seen[here] = True
            return f"You open the {here_name}. {self._describe(here)}"
        if code == _CLOSE:
            self.opened[here] = False
            return f"You close the {here_name}."
        if code == _HEAT:
            self.hot[arg], self.cool[arg] = True, False
        elif code == _COOL:
            self.cool[arg], self.hot[arg] = True, False
        elif code == _CLEAN:
            self.clean[arg] = True
        elif code == _USE:
            self.toggled[arg] = True  # ALFWorld's goal asks for a lamp that has been switched
            return f"You turn on the {objects[arg]}."
        elif code == _EXAMINE_RECEPTACLE:
            return self._describe(here)
        elif code == _EXAMINE_OBJECT:
            return self._examine_object(arg)
        return f"You {_TRANSFORM_VERB[code]} the {objects[arg]} using the {here_name}."

    # -- texts ----------------------------------------------------------------------------

    def _describe(self, r: int) -> str:
        name = self.world.layout.receptacles[r]
        listed = self.world.listed
        things = _join([listed[o] for o in self.contents[r]])
        if self.world.openable[r]:
            if not self.opened[r]:
                return f"The {name} is closed."
            return f"The {name} is open. In it, you see {things}."
        return f"On the {name}, you see {things}."

    def _examine_object(self, o: int) -> str:
        name = self.world.layout.objects[o]
        if self.world.layout.object_types[o] in cat.RECEPTACLE_OBJECTS:
            return f"This is a normal {name}. In it, you see nothing."
        hot, cool, clean = self.hot[o], self.cool[o], self.clean[o]
        if clean and hot:
            return f"This is a hot and clean {name}."
        if clean and cool:
            return f"This is a cool and clean {name}."
        if hot:
            return f"This is a hot {name}."
        if clean:
            return f"This is a clean {name}."
        if cool:
            return f"This is a cold {name}."
        return f"There's nothing special about {name}."

    def _look(self) -> str:
        if self.location < 0:
            return LOOK_MIDDLE
        name = self.world.layout.receptacles[self.location]
        return f"You are facing the {name}. Next to it, you see nothing."

    def _inventory(self) -> str:
        if self.held < 0:
            return "You are not carrying anything."
        return f"You are carrying: {self.world.listed[self.held]}."

    # -- goal -----------------------------------------------------------------------------

    def _has_state(self, o: int) -> bool:
        """Whether object ``o`` has the transformation the goal asks for (always, if none)."""
        task_type = self.world.goal.task_type
        if task_type == cat.HEAT_AND_PLACE:
            return self.hot[o]
        if task_type == cat.COOL_AND_PLACE:
            return self.cool[o]
        if task_type == cat.CLEAN_AND_PLACE:
            return self.clean[o]
        return True

    def _goal_count_in_targets(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        is_target = self.world.is_target
        for o in self.world.goal_objects:
            r = self.where[o]
            if r >= 0 and is_target[r]:
                counts[r] = counts.get(r, 0) + 1
        return counts

    def _lamp_on_here(self) -> bool:
        return self.location >= 0 and any(
            self.toggled[lamp] for lamp in self.world.lamps_at[self.location]
        )

    def _goal_holds(self) -> bool:
        world = self.world
        task_type = world.goal.task_type
        if task_type == cat.LOOK_AT_IN_LIGHT:
            held = self.held
            return (
                held >= 0
                and world.layout.object_types[held] == world.goal.object_type
                and self._lamp_on_here()
            )
        if task_type == cat.PICK_TWO_AND_PLACE:
            return any(count >= 2 for count in self._goal_count_in_targets().values())
        is_target = world.is_target
        return any(
            self.where[o] >= 0 and is_target[self.where[o]] and self._has_state(o)
            for o in world.goal_objects
        )

    def progress(self) -> float:
        """Fraction of the goal's subgoals met: picked up a goal object; transformed it / put
        one in place / switched the lamp on; the goal itself."""
        if self.won:
            return 1.0
        task_type = self.world.goal.task_type
        first = self.picked_goal_object
        if task_type == cat.PICK_AND_PLACE:
            return 0.5 if first else 0.0
        if task_type == cat.PICK_TWO_AND_PLACE:
            second = bool(self._goal_count_in_targets())
        elif task_type == cat.LOOK_AT_IN_LIGHT:
            second = any(self.toggled)
        else:
            second = any(self._has_state(o) for o in self.world.goal_objects)
        return (first + second) / 3

    @property
    def admissible_actions(self) -> tuple[str, ...]:
        return self._admissible

    # -- expert ---------------------------------------------------------------------------

    def expert_action(self) -> str | None:
        """The next command of a plan from the current state.

        The expert searches like a player: it looks only into receptacles whose contents it has
        seen in this episode (likely ones first, opening closed ones), then takes a goal object,
        transforms it if needed, and carries it to a target; twice for pick_two; for look_at it
        carries the object to a lamp and switches it on. Replanning from the state each call
        makes it correct after any sequence of earlier commands.
        """
        if self.won:
            return None
        world = self.world
        held = self.held
        if held >= 0 and world.layout.object_types[held] != world.goal.object_type:
            return self._put_down_here()
        if held < 0:
            return self._fetch_goal_object()
        if world.goal.task_type == cat.LOOK_AT_IN_LIGHT:
            return self._bring_to_lamp()
        if not self._has_state(held):
            appliance = world.appliance_for_goal
            if self.location != appliance:
                return self._go_command(appliance)
            code = world.appliance[appliance]
            return self._command_for(code, held)
        return self._place_at(self._placement_target(), held)

    def _go_command(self, r: int) -> str:
        return f"go to {self.world.layout.receptacles[r]}"

    def _command_for(self, code: int, arg: int) -> str:
        for command, entry in self._commands.items():
            if entry == (code, arg):
                return command
        raise RuntimeError(f"expert command {code} for {arg} is not admissible")  # a bug

    def _put_down_here(self) -> str:
        here = self.location
        if self.world.openable[here] and not self.opened[here]:
            return self._command_for(_OPEN, here)
        return self._command_for(_MOVE, self.held)

    def _placement_target(self) -> int:
        """Where the goal object goes: for pick_two the target already holding most of them."""
        world = self.world
        counts = self._goal_count_in_targets()
        targets = [r for r in world.search_order if world.is_target[r]]
        return min(
            targets,
            key=lambda r: (-counts.get(r, 0), r != self.location, targets.index(r)),
        )

    def _place_at(self, r: int, held: int) -> str:
        if self.location != r:
            return self._go_command(r)
        if self.world.openable[r] and not self.opened[r]:
            return self._command_for(_OPEN, r)
        return self._command_for(_MOVE, held)

    def _fetch_goal_object(self) -> str | None:
        world = self.world
        keep_in = (
            self._placement_target() if world.goal.task_type == cat.PICK_TWO_AND_PLACE else -2
        )
        rank = {r: i for i, r in enumerate(world.search_order)}
        known = [
            o
            for o in world.goal_objects
            if self.where[o] >= 0 and self.seen[self.where[o]] and self.where[o] != keep_in
        ]
        if known:
            best = min(
                known,
                key=lambda o: (
                    not self._has_state(o),
                    self.where[o] != self.location,
                    rank[self.where[o]],
                ),
            )
            r = self.where[best]
            if self.location != r:
                return self._go_command(r)
            if world.openable[r] and not self.opened[r]:
                return self._command_for(_OPEN, r)
            return self._command_for(_TAKE, best)
        return self._explore(world.search_order)

    def _explore(self, order: tuple[int, ...]) -> str | None:
        """Look into the next receptacle not yet seen: go there, then open it if closed."""
        for r in order:
            if not self.seen[r]:
                if self.location != r:
                    return self._go_command(r)
                return self._command_for(_OPEN, r)
        return None

    def _bring_to_lamp(self) -> str | None:
        world = self.world
        lamp_places = [
            r for r in world.lamp_search_order if world.lamps_at[r] and self.seen[r]
        ]
        if not lamp_places:
            return self._explore(world.lamp_search_order)
        r = lamp_places[0]
        if self.location != r:
            return self._go_command(r)
        return self._command_for(_USE, world.lamps_at[r][0])
