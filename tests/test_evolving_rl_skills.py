"""Evolving-RL skill cards: parsing, validation, audit, rendering."""

from __future__ import annotations

import json

import pytest

from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.evolving_rl.skills import SkillParseError, audit, parse_skill, richest_json_object

CARD = {
    "name": "Heat then place",
    "description": "Heat an object in the microwave and put it somewhere.",
    "when_to_use": ["The task says heat or hot."],
    "workflow": [
        {"step": 1, "goal": "find the object", "action": "go to likely receptacles", "completion_condition": "holding it"},
        {"step": 2, "goal": "heat it", "action": "heat X with microwave 1"},
    ],
    "decision_rules": ["Check countertops first."],
    "error_handling": [{"error": "Nothing happens.", "cause": "not at the microwave", "response": "go to microwave 1"}],
}


def test_parses_last_json_after_analysis():
    text = "Analysis: the agent wandered. {not json} Draft: {\"name\": \"x\"}\nFinal:\n```json\n" + json.dumps(CARD) + "\n```"
    card = parse_skill(text)
    assert card.name == "Heat then place" and card.passed_audit
    rendered = card.render()
    assert rendered.startswith("# Skill: Heat then place\n\nHeat an object")  # the authors' layout
    assert "\n## Workflow\n1. **find the object**: go to likely receptacles\n   - Done when: holding it\n" in rendered
    assert "- **Nothing happens.**: not at the microwave \u2192 go to microwave 1" in rendered


@pytest.mark.parametrize("broken", [
    "no json here",
    json.dumps({k: v for k, v in CARD.items() if k != "description"}),
    json.dumps({**CARD, "name": ""}),
    json.dumps({**CARD, "workflow": ["go to the microwave"]}),  # the authors' rendering raises on it
    json.dumps(CARD)[:-5],
])
def test_invalid_cards_are_rejected(broken):
    with pytest.raises(SkillParseError):
        parse_skill(broken)


def test_only_name_and_description_are_required_as_by_the_authors():
    """The authors' format check asks for a name and a description; a card without workflow,
    rules or error handling is well formed (it used to be rejected)."""
    card = parse_skill(json.dumps({"name": "Look first", "description": "Look before acting."}))
    assert card.passed_audit and card.render() == "# Skill: Look first\n\nLook before acting."
    # Any value that is not empty will do, as their check is `not skill.get(field)`.
    assert parse_skill(json.dumps({"name": "  ", "description": ["a", "list"]})).name == ""


def test_the_card_is_the_richest_json_object_as_the_authors_pick_it():
    """Most fields of the card schema, then the longest, then the last (their
    ``_extract_json_object``): a fragment after the card, or an example before it, is not it."""
    card = {"name": "heat-then-place", "description": "Heat a thing, then place it.", "workflow": [], "when_to_use": []}
    fragment = {"name": "x", "description": "y"}
    text = f"Analysis. Example: {json.dumps(fragment)}\n```json\n{json.dumps(card)}\n```\nAlso {json.dumps(fragment)} {{broken"
    assert richest_json_object(text) == card
    assert parse_skill(text).name == "heat-then-place"
    assert richest_json_object('{"a": 1} text {"b": {"c": 2}} tail {broken') == {"b": {"c": 2}}  # tie: the longer
    assert richest_json_object('{"a": 1} then {"b": 2}') == {"b": 2}  # a full tie: the last


def test_audit_has_the_authors_zero_tolerance():
    assert audit(parse_skill(json.dumps(CARD)).render()) == []
    clean = "Go to the fridge, open it \u2014 then take the apple \u201cquickly\u201d."
    assert audit(clean) == []  # non-ASCII punctuation is fine
    assert audit("Go to the fridge \x01 now") == ["suspicious characters"]
    assert audit("Go to the fridge\u200b now") == ["suspicious characters", "not English"]
    assert audit("Go to the \uff46ridge now") == ["suspicious characters", "not English"]
    assert audit("Go to the fridge and open it, then take the apple \u51b0.") == ["not English"]
    assert audit("Go to the caf\u00e9 counter.") == ["not English"]  # one accented letter
    assert audit("Wait!!!!!!!! then go.") == ["repetition (repeated character)"]
    assert audit("go to to to to to to to to the cabinet") == ["repetition (repeated token)"]
    assert audit("open the cabinet " * 4) == ["repetition (repeated phrase)"]
    assert audit("open the cabinet " * 3) == []
    assert audit("- go to cabinet 1\n- go to cabinet 1\n- go to cabinet 1\n- take mug") == [
        "repetition (repeated line)"]
    assert audit("   ") == ["empty"]


def test_card_with_one_cjk_character_fails_the_audit():
    card = parse_skill(json.dumps({**CARD, "decision_rules": ["Check countertops first \u51b0."]}))
    assert not card.passed_audit and card.audit_flags == ["not English"]


def test_card_that_fails_audit_parses_but_is_flagged():
    card = parse_skill(json.dumps({**CARD, "decision_rules": ["go to the cabinet " * 40]}))
    assert not card.passed_audit and card.audit_flags == ["repetition (repeated phrase)"]


def test_extractor_prompt_asks_for_the_authors_schema_without_the_type_label():
    from arena.core.contract.types import Step, Task, Trajectory
    from arena.plugins.evolving_rl.prompts import extractor_prompt

    task = Task(task_id="t", env="household", split="train", task_type="pick_heat_then_place_in_recep",
                goal="put a hot apple in fridge.")
    trajectory = Trajectory(task=task, initial_observation="You are in the middle of a room.",
                            steps=[Step("go to microwave 1", "You arrive at microwave 1.", True)])
    user = extractor_prompt(trajectory, HOUSEHOLD_INSTRUCTIONS)[-1]["content"]
    schema = json.loads(user[user.index("{"):])
    assert set(schema) == {"name", "description", "metadata", "skill_overview", "when_to_use",
                           "inputs_to_identify", "workflow", "decision_rules", "error_handling",
                           "output_requirements"}
    assert "pick_heat_then_place_in_recep" not in user and "put a hot apple in fridge." in user
    assert "You arrive at microwave 1." in user  # observations as well as actions
