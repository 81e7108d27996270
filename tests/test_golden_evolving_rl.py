"""Evolving-RL against its authors' own outputs: each case of tests/golden/evolving_rl.yaml holds
an input and what the authors' code (Fanzy27/Evolving-RL@3049822) produces for it; Arena's code
runs on the same input with the paper preset's settings (the authors' option wherever Arena's
default differs) and must produce the same."""

from __future__ import annotations

import json
from typing import Any

import pytest

from arena.api import typed_config
from arena.core.contract.types import RolloutTokens, Step, Task, Termination, Trajectory
from arena.core.execution.solver import StandardSolver
from arena.core.rl import group_advantages
from arena.plugins.evolving_rl.method import Candidate, build_samples
from arena.plugins.evolving_rl.settings import EvolvingRLSettings
from arena.plugins.evolving_rl.skills import SkillParseError, audit, parse_skill, richest_json_object
from tests.helpers import golden
from tests.helpers.scripted import ScriptedLLM, play_script

CASES = golden.load("evolving_rl")
CARD = json.dumps({"name": "find-then-place", "description": "Find the object, then place it.",
                   "workflow": [{"step": 1, "goal": "find it", "action": "go to countertop 1"}]})


@pytest.fixture(scope="module")
def paper() -> Any:
    return golden.paper_config("evolving_rl")


def test_every_case_names_its_source_and_kind() -> None:
    kinds = {"card_choice", "card_well_formed", "card_render", "audit", "grpo_normalize", "coevolution", "action",
             "turn_end", "stop"}
    assert {case["kind"] for case in CASES} == kinds and len(CASES) >= 60
    for case in CASES:
        assert case["source"].startswith("Fanzy27/Evolving-RL@3049822 "), case["name"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "card_choice"), ids=golden.names(golden.by_kind(CASES, "card_choice")))
def test_the_card_is_the_object_the_authors_choose(case: dict[str, Any]) -> None:
    try:
        chosen = richest_json_object(case["input"])
    except SkillParseError:
        chosen = None
    assert chosen == case["expected"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "card_well_formed"), ids=golden.names(golden.by_kind(CASES, "card_well_formed")))
def test_a_card_is_well_formed_as_the_authors_check_it(case: dict[str, Any]) -> None:
    try:
        parse_skill(json.dumps(case["input"]))
        formed = True
    except SkillParseError:
        formed = False
    assert formed is case["expected"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "card_render"), ids=golden.names(golden.by_kind(CASES, "card_render")))
def test_a_card_is_rendered_in_the_authors_layout(case: dict[str, Any]) -> None:
    """What the solver is shown and what the audit reads."""
    assert parse_skill(json.dumps(case["input"])).render() == case["expected"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "audit"), ids=golden.names(golden.by_kind(CASES, "audit")))
def test_the_language_audit_judges_as_the_authors(case: dict[str, Any]) -> None:
    flags = audit(case["input"])
    assert {"passed": not flags, "suspicious": "suspicious characters" in flags,
            "non_english": "not English" in flags,
            "repetition": any(flag.startswith("repetition") for flag in flags)} == case["expected"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "grpo_normalize"), ids=golden.names(golden.by_kind(CASES, "grpo_normalize")))
def test_grpo_normalises_a_group_as_the_authors(case: dict[str, Any], paper: Any) -> None:
    cfg = typed_config(paper.method, EvolvingRLSettings)
    rewards = case["input"]
    advantages = group_advantages(rewards, ["g"] * len(rewards), std=cfg.advantage_std, single=cfg.group_of_one)
    assert advantages == pytest.approx(case["expected"], rel=1e-9, abs=1e-12)


def _episode(won: bool) -> Trajectory:
    task = Task("t", "household", "train", "pick_and_place_simple", "put a mug in cabinet.")
    return Trajectory(task=task, initial_observation="start",
                      steps=[Step("look", "ok", True, rollout=RolloutTokens([1, 2, 3], [4, 5], [-0.5, -0.1]))],
                      status=Termination.SUCCESS if won else Termination.FAILURE)


def _card(spec: dict[str, bool]) -> Any:
    if not spec["parsed"]:
        return None
    card = parse_skill(CARD)
    assert card.passed_audit
    if not spec["audit_passed"]:
        card.audit_flags = ["repetition (repeated line)"]
    return card


@pytest.mark.parametrize("case", golden.by_kind(CASES, "coevolution"), ids=golden.names(golden.by_kind(CASES, "coevolution")))
def test_an_iterations_rewards_and_advantages_are_the_authors(case: dict[str, Any], paper: Any) -> None:
    """Extractor reward = the card's downstream win rate, 0 when it does not parse or fails the
    audit; solver reward 10 x won; both normalised in their groups and scaled (0.2, 1.0)."""
    cfg = typed_config(paper.method, EvolvingRLSettings)
    given, expected = case["input"], case["expected"]
    assert (cfg.lambda_extractor, cfg.lambda_solver) == (given["lambda_extractor"], given["lambda_solver"])
    candidates = [Candidate(0, n, [1, 2], [7, 8, 9], [-1.0] * 3, _card(spec)) for n, spec in enumerate(given["cards"])]
    owners = [(candidate, k) for candidate, wins in zip(candidates, given["wins"]) for k in range(len(wins))]
    episodes = [_episode(bool(won)) for wins in given["wins"] for won in wins]
    samples = build_samples(candidates, owners, episodes, cfg)
    extractor = [s for s in samples if s.role == "extractor"]
    solver = [s for s in samples if s.role == "solver"]
    assert [c.reward for c in candidates] == pytest.approx(expected["extractor_rewards"])
    assert [s.advantage for s in extractor] == pytest.approx(expected["extractor_advantages"], rel=1e-9, abs=1e-12)
    flat = [a for per_card in expected["solver_advantages"] for a in per_card]
    assert [s.advantage for s in solver] == pytest.approx(flat, rel=1e-9, abs=1e-12)


def _paper_solver(paper: Any, script: list[Any]) -> StandardSolver:
    return StandardSolver.from_config(ScriptedLLM(script), paper.solver)


@pytest.mark.parametrize("case", golden.by_kind(CASES, "action"), ids=golden.names(golden.by_kind(CASES, "action")))
def test_the_action_is_read_from_a_reply_as_the_authors_read_it(case: dict[str, Any], paper: Any) -> None:
    solver = _paper_solver(paper, [(case["input"], 5, False)])
    assert golden.action_played(solver) == case["expected"]


@pytest.mark.parametrize("case", golden.by_kind(CASES, "turn_end"), ids=golden.names(golden.by_kind(CASES, "turn_end")))
def test_an_episode_ends_where_the_authors_end_it(case: dict[str, Any], paper: Any) -> None:
    trajectory, room = play_script(_paper_solver(paper, case["input"]), len(case["input"]))
    expected = case["expected"]
    assert (trajectory.status.value, len(room.played), len(trajectory.steps)) == (
        expected["status"], expected["played"], expected["steps"])


@pytest.fixture(scope="module")
def tiny() -> Any:
    from arena.backends.transformers_backend import TransformersBackend

    return TransformersBackend({"model": "tiny", "dtype": "float32"})


@pytest.mark.parametrize("case", golden.by_kind(CASES, "stop"), ids=golden.names(golden.by_kind(CASES, "stop")))
def test_a_reply_stops_where_the_authors_stop_it(case: dict[str, Any], paper: Any, tiny: Any) -> None:
    """The paper solver asks for the authors' stop string; the backend keeps what SGLang keeps
    under it (up to and with the first </action>)."""
    backend = ScriptedLLM(["fits"])
    play_script(StandardSolver.from_config(backend, paper.solver), 1)
    (stop,) = backend.asked[0].stop
    tokens = tiny.tokenizer(case["input"], add_special_tokens=False).input_ids
    kept = tokens[: tiny._stop_string_end(tokens, (stop,))]
    assert tiny.tokenizer.decode(kept) == case["expected"]
