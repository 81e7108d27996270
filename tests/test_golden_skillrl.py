"""SkillRL against its authors' code (aiming-lab/SkillRL, on verl-agent): tests/golden/skillrl.yaml
holds fixed inputs and what the authors' functions returned for them (or, where a case says so,
what follows from their code by hand); Arena's code must return the same."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from arena.core.config.compose import compose
from arena.core.contract.method_config import typed_config
from arena.core.contract.types import Task
from arena.core.execution.solver import parse_action, well_formed
from arena.core.services.embedder import make_embedder
from arena.core.services.store import ExperienceStore
from arena.plugins.skillrl.method import grpo_samples, sft_completion
from arena.plugins.skillrl.retrieval import (
    STYLE_AUTHORS,
    keyword_category,
    render_skills,
    skill_category,
    template_retrieve,
)
from arena.plugins.skillrl.settings import SkillRLSettings
from arena.plugins.skillrl.skillbank import GENERAL, MISTAKE, SkillBank, sync_store
from tests.helpers.golden_verl import cases, group_episodes

CASES = cases("skillrl")


def as_arena(text: str) -> str:
    """The authors' prompt asks for think tags, Arena's react prompt for reasoning tags."""
    return text.replace("<think>", "<reasoning>").replace("</think>", "</reasoning>")


def bank_store(bank_input: dict) -> ExperienceStore:
    """The case's bank, added in its listed order (the order of the authors' JSON lists)."""
    bank = SkillBank()
    bank.begin()
    for skill in bank_input["general"]:
        bank.add_skill(title=skill["title"], principle=skill["principle"], when_to_apply=skill["when_to_apply"],
                       scope=GENERAL, source_split="train", dynamic=skill["dynamic"])
    for category, skills in bank_input["task_specific"].items():
        for skill in skills:
            bank.add_skill(title=skill["title"], principle=skill["principle"],
                           when_to_apply=skill["when_to_apply"], scope=category, source_split="train")
    for mistake in bank_input["mistakes"]:
        bank.add_mistake(description=mistake["description"], why_it_happens=mistake["why_it_happens"],
                         how_to_avoid=mistake["how_to_avoid"], source_split="train")
    bank.commit()
    store = ExperienceStore(None, make_embedder(OmegaConf.create({"name": "hashing"})))
    sync_store(store, bank)
    return store


def retrieved(store: ExperienceStore, goal: str, given: dict) -> list:
    task = Task("golden/test_seen/1", "household", "test_seen", "pick_and_place_simple", goal)
    return template_retrieve(store, task, top_general=given["top_general"], max_mistakes=given["max_mistakes"],
                             category=skill_category(task, "keywords"))


def test_keyword_routing_and_template_retrieval_are_the_authors() -> None:
    case = CASES["keyword_routing_and_template_retrieval"]
    given = case["input"]
    store = bank_store(given["bank"])
    for goal, expected in zip(given["goals"], case["expected"], strict=True):
        assert keyword_category(goal) == expected["category"], goal
        found = retrieved(store, goal, given)
        general = [e.metadata["title"] for e in found if e.metadata.get("scope") == GENERAL]
        typed = [e.metadata["title"] for e in found if e.kind != MISTAKE and e.metadata.get("scope") != GENERAL]
        mistakes = [e.metadata["description"] for e in found if e.kind == MISTAKE]
        assert (general, typed, mistakes) == (expected["general"], expected["task_specific"], expected["mistakes"]), goal


def test_the_skill_section_reads_as_the_authors() -> None:
    case = CASES["skill_section_in_the_authors_wording"]
    listing = CASES["keyword_routing_and_template_retrieval"]["input"]
    store = bank_store(listing["bank"])
    for goal, section in zip(case["input"]["goals"], case["expected"]["sections"], strict=True):
        text = render_skills(retrieved(store, goal, listing), "pick_and_place_simple", 0, style=STYLE_AUTHORS)
        assert text == f"{case['expected']['heading']}\n\n{section}"


def test_grpo_over_step_rows_with_the_penalty_is_the_authors() -> None:
    case = CASES["grpo_over_step_rows_with_the_invalid_action_penalty"]
    given = case["input"]
    episodes, groups = group_episodes(given["groups"])
    samples = grpo_samples(episodes, groups, [], advantage_over="steps", win_reward=given["win_reward"],
                           invalid_penalty=given["invalid_action_penalty"])
    assert [s.reward for s in samples] == pytest.approx(case["expected"]["row_scores"], abs=1e-6)
    assert [s.advantage for s in samples] == pytest.approx(case["expected"]["advantages"], abs=1e-4)


def test_malformed_replies_are_the_authors_invalid_ones() -> None:
    case = CASES["alfworld_projection_validity"]
    assert [int(well_formed(as_arena(r))) for r in case["input"]["replies"]] == case["expected"]["valid"]


def test_sft_examples_have_the_form_the_prompt_asks_for() -> None:
    case = CASES["sft_example_in_the_form_the_prompt_asks_for"]
    given = case["input"]
    teacher = sft_completion(given["action"], target="tagged", goal=given["goal"], reply=given["teacher_reply"])
    assert teacher == as_arena(case["expected"]["teacher"])
    expert = sft_completion(given["action"], target="tagged", goal=given["goal"])  # no reasoning of its own
    for completion in (teacher, expert):
        assert int(well_formed(completion)) == case["expected"]["valid"]
        assert parse_action(completion, [given["action"]]) == given["action"]
    assert sft_completion(given["action"], target="action", goal=given["goal"]) == given["action"]


def test_the_paper_preset_runs_the_authors_cold_start_and_routing(plugins) -> None:
    """The paper's SFT schedule (lr 1e-4, 3 epochs over its ~7,500 examples) in tagged form,
    keyword routing and the authors' section wording."""
    cfg = typed_config(compose(plugins, "skillrl", preset="paper").method, SkillRLSettings)
    assert cfg.sft.lr == pytest.approx(1e-4) and cfg.sft.epochs == 3 and cfg.sft.target == "tagged"
    assert cfg.sft.steps_for(7_500) == math.ceil(3 * 7_500 / cfg.sft.batch_size)
    assert (cfg.retrieval.routing, cfg.retrieval.style) == ("keywords", "authors")
