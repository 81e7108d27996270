"""The GRPO baseline against its authors' own outputs (tests/golden/grpo.yaml): the rewards and
advantages of one task's group of rollouts, the action read from a reply and where an episode
ends, each run through Arena's grpo with its paper preset. Arena's grpo follows Evolving-RL's own
GRPO functions (population std, eps 1e-6, a group of one left as it is), not verl-agent's."""

from __future__ import annotations

from typing import Any

import pytest

from arena.api import typed_config
from arena.core.contract.types import RolloutTokens, Step, Task, Termination, Trajectory
from arena.core.execution.solver import StandardSolver
from arena.plugins.evolving_rl.method import grpo_samples
from arena.plugins.evolving_rl.settings import EvolvingRLSettings
from tests.helpers import golden
from tests.helpers.scripted import ScriptedLLM, play_script

CASES = golden.load("grpo")


@pytest.fixture(scope="module")
def paper() -> Any:
    return golden.paper_config("grpo")


def test_every_case_names_its_source() -> None:
    assert {case["kind"] for case in CASES} == {"grpo_group", "action", "turn_end"}
    for case in CASES:
        assert case["source"].startswith("Fanzy27/Evolving-RL@3049822 "), case["name"]


def _episode(won: bool) -> Trajectory:
    task = Task("t", "household", "train", "pick_and_place_simple", "put a mug in cabinet.")
    return Trajectory(task=task, initial_observation="start",
                      steps=[Step("look", "ok", True, rollout=RolloutTokens([1, 2, 3], [4, 5], [-0.5, -0.1]))],
                      status=Termination.SUCCESS if won else Termination.FAILURE)


@pytest.mark.parametrize("case", golden.by_kind(CASES, "grpo_group"), ids=golden.names(golden.by_kind(CASES, "grpo_group")))
def test_a_groups_rewards_and_advantages_are_the_authors(case: dict[str, Any], paper: Any) -> None:
    cfg = typed_config(paper.method, EvolvingRLSettings)
    assert cfg.mode == "grpo"
    wins = case["input"]
    samples = grpo_samples([_episode(bool(w)) for w in wins], ["task0"] * len(wins), cfg)
    assert [s.reward for s in samples] == pytest.approx(case["expected"]["rewards"])
    assert [s.advantage for s in samples] == pytest.approx(case["expected"]["advantages"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("case", golden.by_kind(CASES, "action"), ids=golden.names(golden.by_kind(CASES, "action")))
def test_the_action_is_read_as_the_authors_read_it(case: dict[str, Any], paper: Any) -> None:
    solver = StandardSolver.from_config(ScriptedLLM([(case["input"], 5, False)]), paper.solver)
    assert golden.action_played(solver) == case["expected"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "turn_end"), ids=golden.names(golden.by_kind(CASES, "turn_end")))
def test_an_episode_ends_where_the_authors_end_it(case: dict[str, Any], paper: Any) -> None:
    solver = StandardSolver.from_config(ScriptedLLM(case["input"]), paper.solver)
    trajectory, room = play_script(solver, len(case["input"]))
    expected = case["expected"]
    assert (trajectory.status.value, len(room.played), len(trajectory.steps)) == (
        expected["status"], expected["played"], expected["steps"])
