"""Golden cases (tests/golden/<method>.yaml): what the authors' code returned for fixed inputs."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import yaml

from arena.core.contract.settings import Settings
from arena.core.contract.types import Observation, Task, Termination, Trajectory
from arena.core.execution.solver import EndOnRepeat, play
from arena.testing import FakeLLM
from tests.helpers.worlds import RepeatWinEpisode, scripted_policy

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def load(method: str) -> list[dict[str, Any]]:
    """The method's cases, in file order (a list, or a mapping with ``cases``)."""
    data = yaml.safe_load((GOLDEN / f"{method}.yaml").read_text())
    return list(data["cases"] if isinstance(data, dict) else data)


def action_played(solver: Any) -> str:
    """The action ``solver`` plays at its first step in a room of three admissible actions."""
    task = Task("room", "toy", "train", "toy", "look around")
    observation = Observation("You are in a room.", ("go to desk 1", "look", "open drawer 1"))
    return solver.policy(task, [], seed=0)(observation, Trajectory(task=task, initial_observation=observation.text)).text


def paper_config(method: str) -> Any:
    """The method's config under its paper preset (the authors' settings the cases run with)."""
    from arena.core.config.compose import compose
    from arena.core.config.plugins import get_plugins

    return compose(get_plugins(), method, preset="paper")


def by_kind(cases: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    found = [case for case in cases if case["kind"] == kind]
    assert found, f"no golden case of kind {kind}"
    return found


def names(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


def solving_run(cfg: Any, instructions: Any) -> Any:
    """A run that hands back the policy a ``solve`` plays its episode with (``run.play``), for
    reading which policy a config makes."""
    settings = Settings.of(cfg)
    return types.SimpleNamespace(cfg=cfg, settings=settings, llm=FakeLLM(), sampling=lambda: settings.learn.sampling,
                                 env=types.SimpleNamespace(instructions=instructions),
                                 play=lambda request: request.policy)


def assert_ends_on_repeat(case: dict[str, Any]) -> None:
    """An episode-ending case: the scripted actions under :class:`arena.EndOnRepeat` play as the
    authors' environment played them, and end won or lost as there."""
    actions, win_on = case["input"]["actions"], case["input"]["win_on"]
    trajectory = play(RepeatWinEpisode(actions, win_on), EndOnRepeat(scripted_policy(actions)),
                      max_steps=case["input"]["max_steps"], max_invalid_actions=10)
    assert [step.action for step in trajectory.steps] == case["expected"]["played"]
    assert trajectory.success is case["expected"]["success"]
    assert trajectory.status is not Termination.ERROR, trajectory.error
