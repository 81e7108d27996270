"""Reflexion against its authors' own outputs (tests/golden/reflexion.yaml): which earlier
reflections the acting and reflection prompts hold and how they are numbered, where the
reflection's reply begins, and the trial that ends on a repeated action."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from arena.core.config.compose import compose
from arena.core.contract.types import Step, Task, Termination, Trajectory
from arena.core.services.embedder import HashingEmbedder
from arena.core.services.store import ExperienceStore
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.reflexion.method import EndOnRepeat, Reflexion, reflection_experience
from arena.plugins.reflexion.prompts import reflection_prompt
from tests.helpers import golden

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


@pytest.mark.parametrize("case", EPISODES, ids=golden.names(EPISODES))
def test_a_trial_ends_on_a_repeated_action_as_the_authors(case) -> None:
    golden.assert_ends_on_repeat(case)


def test_the_paper_preset_ends_trials_on_a_repeat_and_the_default_does_not(plugins) -> None:
    def policy_of(cfg: Any) -> Any:
        run = golden.solving_run(cfg, HOUSEHOLD_INSTRUCTIONS)
        return Reflexion(run).solve(run, TASK, [], 0)  # type: ignore[arg-type]

    assert isinstance(policy_of(paper(plugins)), EndOnRepeat)
    assert policy_of(compose(plugins, "reflexion", overrides=["llm.backend=fake"])) == "standard"
