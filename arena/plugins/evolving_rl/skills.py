"""Evolving-RL's unit of experience: a JSON skill card, its parser, its audit and its rendering.

The extractor writes free text that ends in one JSON object (analysis may come first). A card
that does not parse, lacks the required fields, or fails the language audit earns the extractor
a reward of 0, as in the authors' code; a card that passes is rendered to Markdown for the solver.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Fields a card must have, with the JSON type each must be.
REQUIRED_FIELDS: dict[str, type] = {
    "name": str,
    "when_to_use": list,
    "workflow": list,
    "decision_rules": list,
    "error_handling": list,
}
#: Optional fields of the authors' schema, rendered when present.
OPTIONAL_LIST_FIELDS = ("skill_overview", "inputs_to_identify", "output_requirements")


class SkillParseError(ValueError):
    """The extractor's text holds no valid skill card."""


@dataclass
class SkillCard:
    """A parsed, validated skill card."""

    name: str
    data: dict[str, Any]
    audit_flags: list[str] = field(default_factory=list)

    @property
    def passed_audit(self) -> bool:
        return not self.audit_flags

    def render(self) -> str:
        """Markdown card shown to the solver."""
        data = self.data
        lines = [f"## Skill: {self.name}"]
        if isinstance(data.get("description"), str):
            lines.append(data["description"])
        for key in ("skill_overview", "when_to_use", "inputs_to_identify"):
            items = _strings(data.get(key))
            if items:
                lines.append(f"**{key.replace('_', ' ').capitalize()}:**")
                lines.extend(f"- {item}" for item in items)
        steps = data.get("workflow") or []
        if steps:
            lines.append("**Workflow:**")
            for number, step in enumerate(steps, start=1):
                lines.append(f"{number}. {_describe(step, ('goal', 'action', 'tools_or_strategy', 'completion_condition'))}")
        rules = _strings(data.get("decision_rules"))
        if rules:
            lines.append("**Decision rules:**")
            lines.extend(f"- {rule}" for rule in rules)
        errors = data.get("error_handling") or []
        if errors:
            lines.append("**Error handling:**")
            lines.extend(f"- {_describe(item, ('error', 'cause', 'response'))}" for item in errors)
        return "\n".join(lines)


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(item).strip() for item in value if str(item).strip()]


def _describe(item: Any, keys: tuple[str, ...]) -> str:
    if isinstance(item, dict):
        parts = [f"{key.replace('_', ' ')}: {item[key]}" for key in keys if item.get(key)]
        return "; ".join(parts) if parts else json.dumps(item)
    return str(item)


def last_json_object(text: str) -> dict[str, Any]:
    """The last complete JSON object in ``text`` (fenced or bare), or SkillParseError."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict):
            found = value
        position = text.find("{", end)
    if found is None:
        raise SkillParseError("no JSON object found in the extractor's output")
    return found


def parse_skill(text: str) -> SkillCard:
    """Parse and validate a card; the audit result is attached, not raised."""
    data = last_json_object(text)
    for key, kind in REQUIRED_FIELDS.items():
        if not isinstance(data.get(key), kind):
            raise SkillParseError(f"field '{key}' missing or not a {kind.__name__}")
    name = data["name"].strip()
    if not name:
        raise SkillParseError("field 'name' is empty")
    if not data["workflow"]:
        raise SkillParseError("field 'workflow' is empty")
    return SkillCard(name=name, data=data, audit_flags=audit(json.dumps(data, ensure_ascii=False)))


_ODD = re.compile(r"[^\x09\x0a\x0d\x20-\x7e\u2018\u2019\u201c\u201d\u2013\u2014\u2026]")
_WORD = re.compile(r"[A-Za-z]+|[^\sA-Za-z]")


def audit(text: str, *, max_odd_ratio: float = 0.01, min_latin_ratio: float = 0.6,
          max_repeat_ratio: float = 0.5) -> list[str]:
    """Rule-based language audit; returns the reasons a card is rejected (empty: it passes).

    * odd characters: control characters, symbols or non-Latin script beyond ``max_odd_ratio``;
    * non-English: fewer than ``min_latin_ratio`` of the letters are ASCII letters;
    * repetition: the most repeated 4-word phrase covers more than ``max_repeat_ratio`` of it.
    """
    flags = []
    if not text.strip():
        return ["empty"]
    odd = len(_ODD.findall(text))
    if odd / len(text) > max_odd_ratio:
        flags.append(f"odd characters ({odd})")
    letters = [c for c in text if c.isalpha()]
    if letters and sum(c.isascii() for c in letters) / len(letters) < min_latin_ratio:
        flags.append("not English")
    words = [w.lower() for w in _WORD.findall(text) if w.isalpha()]
    if len(words) >= 16:
        grams = Counter(tuple(words[i : i + 4]) for i in range(len(words) - 3))
        top = grams.most_common(1)[0][1]
        if top * 4 / len(words) > max_repeat_ratio:
            flags.append("repetition")
    return flags
