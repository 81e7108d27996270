"""Evolving-RL skill cards: parsing, validation, audit, rendering."""

from __future__ import annotations

import json

import pytest

from arena.plugins.evolving_rl.skills import SkillParseError, audit, last_json_object, parse_skill

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
    assert "## Skill: Heat then place" in rendered
    assert "2. goal: heat it; action: heat X with microwave 1" in rendered
    assert "- error: Nothing happens.; cause: not at the microwave; response: go to microwave 1" in rendered


@pytest.mark.parametrize("broken", [
    "no json here",
    json.dumps({k: v for k, v in CARD.items() if k != "workflow"}),
    json.dumps({**CARD, "when_to_use": "a string, not a list"}),
    json.dumps({**CARD, "workflow": []}),
    json.dumps({**CARD, "name": "  "}),
    json.dumps(CARD)[:-5],
])
def test_invalid_cards_are_rejected(broken):
    with pytest.raises(SkillParseError):
        parse_skill(broken)


def test_last_json_object_takes_the_last_complete_object():
    assert last_json_object('{"a": 1} text {"b": {"c": 2}} tail {broken') == {"b": {"c": 2}}


def test_audit_flags_odd_characters_foreign_script_and_repetition():
    assert audit(json.dumps(CARD)) == []
    assert any("odd" in f for f in audit("Go to the fridge \x00\x01\x02\x03 now"))
    assert "not English" in audit("Перейдите к холодильнику и откройте его, затем возьмите яблоко")
    assert "repetition" in audit("go to the cabinet " * 20)
    assert audit("   ") == ["empty"]


def test_card_that_fails_audit_parses_but_is_flagged():
    card = parse_skill(json.dumps({**CARD, "decision_rules": ["go to the cabinet " * 40]}))
    assert not card.passed_audit and "repetition" in card.audit_flags
