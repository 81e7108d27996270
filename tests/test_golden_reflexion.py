"""Reflexion against its authors' own outputs (tests/golden/reflexion.yaml): which earlier
reflections the acting and reflection prompts hold and how they are numbered, where the
reflection's reply begins, and the trial that ends on a repeated action."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from arena.core.config import compose
from arena.core.embedder import HashingEmbedder
from arena.core.settings import Settings
from arena.core.solver import play
from arena.core.store import ExperienceStore
from arena.core.types import Step, Task, Termination, Trajectory
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.reflexion.method import EndOnRepeat, Reflexion, reflection_experience
from arena.plugins.reflexion.prompts import reflection_prompt
from arena.testing import FakeLLM
from tests.helpers.worlds import RepeatWinEpisode, scripted_policy

CASES = yaml.safe_load((Path(__file__).parent / "golden" / "reflexion.yaml").read_text())["cases"]
EPISODES = [case for case in CASES if case["kind"] == "episode"]
TASK = Task("household/train/mug0", "household", "train", "pick", "put a mug in shelf.")


def case(kind: str) -> dict[str, Any]:
    (found,) = [c for c in CASES if c["kind"] == kind]
    return found


def paper(plugins: Any) -> Any:
    return compose(plugins, "reflexion", preset="paper", overrides=["llm.backend=fake"])


def failed_trial() -> Trajectory:
    return Trajectory(task=TASK, initial_observation="You are in the middle of a room.",
                      steps=[Step("go to shelf 1", "On the shelf 1, you see nothing.", True)],
                      status=Termination.STEP_LIMIT)


def memory_after(plugins: Any, reflections: list[str]) -> tuple[Reflexion, Any]:
    """A Reflexion whose store holds ``reflections`` as the task's trials 0, 1, ... (phase 0)."""
    cfg = paper(plugins)
    run = types.SimpleNamespace(cfg=cfg, store=ExperienceStore(None, HashingEmbedder()))
    run.store.add([reflection_experience(failed_trial(), text, trial) for trial, text in enumerate(reflections)])
    return Reflexion(run), run  # type: ignore[arg-type]


def test_the_acting_prompt_shows_the_authors_window_of_reflections(plugins) -> None:
    golden = case("acting_memory")
    method, run = memory_after(plugins, golden["input"]["earlier_reflections"])
    assert method.cfg.memory_size == golden["input"]["memory_size"]
    shown = method._memory(run, TASK, len(golden["input"]["earlier_reflections"]), 0)
    assert [e.text for e in shown] == golden["expected"]["shown"]


def test_the_reflection_prompt_holds_the_authors_plans_and_ends_where_theirs_does(plugins) -> None:
    golden = case("reflection_prompt")
    method, run = memory_after(plugins, golden["input"]["earlier_reflections"])
    earlier = method._memory(run, TASK, len(golden["input"]["earlier_reflections"]), 0)
    chat = reflection_prompt(failed_trial(), earlier, method.cfg.transcript_chars, HOUSEHOLD_INSTRUCTIONS)
    user = chat[1]["content"]
    plans = [line for line in user.splitlines() if line.startswith("Trial #")]
    assert plans == golden["expected"]["plan_lines"]
    assert chat[-1] == {"role": "assistant", "content": golden["expected"]["reply_begins"]}
    assert "put a mug in shelf." in user and "go to shelf 1" in user  # the task and the trial


@pytest.mark.parametrize("golden", EPISODES, ids=[c["name"] for c in EPISODES])
def test_a_trial_ends_on_a_repeated_action_as_the_authors(golden) -> None:
    actions, win_on = golden["input"]["actions"], golden["input"]["win_on"]
    trajectory = play(RepeatWinEpisode(actions, win_on), EndOnRepeat(scripted_policy(actions)),
                      max_steps=golden["input"]["max_steps"], max_invalid_actions=10)
    assert [step.action for step in trajectory.steps] == golden["expected"]["played"]
    assert trajectory.success is golden["expected"]["success"]
    assert trajectory.status is not Termination.ERROR, trajectory.error


def test_the_paper_preset_ends_trials_on_a_repeat_and_the_default_does_not(plugins) -> None:
    def policy_of(cfg: Any) -> Any:
        run = types.SimpleNamespace(cfg=cfg, settings=Settings.of(cfg), llm=FakeLLM(),
                                    sampling=lambda: Settings.of(cfg).learn.sampling,
                                    env=types.SimpleNamespace(instructions=HOUSEHOLD_INSTRUCTIONS),
                                    play=lambda request: request.policy)
        return Reflexion(run).solve(run, TASK, [], 0)  # type: ignore[arg-type]

    assert isinstance(policy_of(paper(plugins)), EndOnRepeat)
    assert policy_of(compose(plugins, "reflexion", overrides=["llm.backend=fake"])) == "standard"
