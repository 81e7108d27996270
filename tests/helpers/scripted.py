"""A room nothing ends and a backend that hands back scripted replies: the free-text solver's
turns, played without a model (Evolving-RL's episode-ending tests and golden cases)."""

from __future__ import annotations

from typing import Any

from arena.core.contract.env import Episode
from arena.core.contract.llm import Generation, SamplingParams
from arena.core.contract.types import Observation, Task, Trajectory
from arena.core.execution.solver import StandardSolver, play
from arena.testing import FakeLLM

#: Scripted turns by name: (reply, tokens out or None for the call's whole limit, prompt cut).
TURNS: dict[str, tuple[str, int | None, bool]] = {
    "fits": ("<reasoning>r</reasoning><action>look</action>", 5, False),
    "reply_at_limit": ("<reasoning>" + "so " * 20, None, False),
    "prompt_cut": ("<reasoning>r</reasoning><action>wait</action>", 5, True),
    "closed_at_limit": ("<reasoning>r</reasoning><action>look</action>", None, False),
}


class Room(Episode):
    """Every action answers "a room"; nothing ends the game. ``played`` lists what reached it."""

    def __init__(self) -> None:
        self.task = Task("room", "toy", "train", "toy", "look around")
        self.played: list[str] = []

    def reset(self) -> Observation:
        return Observation("You are in a room.", ("look", "wait"))

    def step(self, action: str) -> Observation:
        self.played.append(action)
        return Observation("a room", ("look", "wait"))


class ScriptedLLM(FakeLLM):
    """Hands back one scripted generation per call, (text, tokens out, prompt cut) or a name of
    :data:`TURNS`; ``asked`` keeps each call's sampling parameters."""

    def __init__(self, script: list[tuple[str, int | None, bool] | str]) -> None:
        super().__init__()
        self.script = iter(script)
        self.asked: list[SamplingParams] = []

    def generate(self, prompts: list[Any], params: SamplingParams) -> list[Generation]:
        self.asked.append(params)
        turn = next(self.script)
        text, out, cut = TURNS[turn] if isinstance(turn, str) else turn
        out = params.max_new_tokens if out is None else out
        return [Generation(text, list(range(out)), [-0.1] * out, 40, out, [1, 2, 3], prompt_cut=cut)]


def play_script(solver: StandardSolver, steps: int) -> tuple[Trajectory, Room]:
    """One episode of ``solver`` in a :class:`Room`, at most ``steps`` steps."""
    room = Room()
    return play(room, solver.policy(room.task, [], seed=0), max_steps=steps, max_invalid_actions=10), room
