"""Evolving-RL's unit of experience: a JSON skill card, its parser, its audit and its rendering.

The extractor writes free text that ends in one JSON object (analysis may come first). As in the
authors' code, the card is the object their parser picks, it is well formed when it has a
non-empty ``name`` and ``description`` (every other field of their schema is optional and
rendered when present, in their Markdown layout), and it passes the language audit when its
rendered Markdown has not one suspicious or non-English character and no repetition by their
rules. A card that is not well formed or fails the audit earns the extractor a reward of 0.
tests/golden/evolving_rl.yaml holds their outputs for all four steps.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

#: Fields a card must have (present and not empty), as the authors' format check requires.
REQUIRED_FIELDS = ("name", "description")
#: Every top-level field of the authors' card schema: an object holding more of them is the card.
SCHEMA_FIELDS = frozenset({"name", "description", "metadata", "skill_overview", "when_to_use",
                           "inputs_to_identify", "workflow", "decision_rules", "error_handling",
                           "output_requirements"})


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
        """The Markdown card shown to the solver (and audited), in the authors' layout
        (``skill_json_to_markdown``): a title, the description, the metadata line, then one
        section per field present, every item as written (a truthy field is iterated as it is)."""
        data = self.data
        lines = [f"# Skill: {data['name']}", f"\n{data['description']}"]
        meta = data.get("metadata", {})
        if isinstance(meta, dict):
            labels = (("skill_category", "Category"), ("source_task_type", "Source"),
                      ("abstraction_level", "Level"), ("success_signal", "Signal"))
            parts = [f"**{label}**: {meta[key]}" for key, label in labels if meta.get(key)]
            if parts:
                lines.append("\n" + " | ".join(parts))
        for key, title in LIST_SECTIONS[:4]:
            lines.extend(_section(data.get(key), title))
        workflow = data.get("workflow", [])
        if workflow:
            lines.append("\n## Workflow")
            for step in workflow:
                lines.append(f"{step.get('step', '?')}. **{step.get('goal', '')}**: {step.get('action', '')}")
                if step.get("tools_or_strategy", ""):
                    lines.append(f"   - Strategy: {step['tools_or_strategy']}")
                if step.get("completion_condition", ""):
                    lines.append(f"   - Done when: {step['completion_condition']}")
        lines.extend(_section(data.get("decision_rules", []), "Decision Rules"))
        errors = data.get("error_handling", [])
        if errors:
            lines.append("\n## Error Handling")
            lines.extend(f"- **{item.get('error', '')}**: {item.get('cause', '')} \u2192 {item.get('response', '')}"
                         for item in errors)
        lines.extend(_section(data.get(LIST_SECTIONS[4][0], []), LIST_SECTIONS[4][1]))
        return "\n".join(lines)


#: The list fields rendered as a titled section of items, in the authors' order (workflow and
#: decision rules come between the fourth and the last).
LIST_SECTIONS = (("skill_overview", "Overview"), ("when_to_use", "When to Use"),
                 ("when_not_to_use", "When NOT to Use"), ("inputs_to_identify", "Inputs to Identify"),
                 ("output_requirements", "Output Requirements"))


def _section(value: Any, title: str) -> list[str]:
    """A titled section of ``value``'s items, or nothing when ``value`` is empty."""
    return [f"\n## {title}", *(f"- {item}" for item in value)] if value else []


def _top_level_objects(text: str) -> list[tuple[str, int]]:
    """Each top-level ``{...}`` span of ``text`` and the index of its closing brace, found the
    authors' way: one scan that counts braces outside double-quoted strings, whose quotes are
    tracked through the prose around the JSON as well (so an odd quote in an analysis hides the
    braces after it, as it does for them)."""
    spans, depth, start, quoted, escaped = [], 0, 0, False, False
    for index, char in enumerate(text):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == "{":
            if depth == 0:
                start = index
            depth += 1
        elif char == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append((text[start : index + 1], index))
    return spans


def _fenced_blocks(text: str) -> list[tuple[str, int]]:
    """The stripped content of each fenced block (opened by ```json, ```JSON or ```) and the
    index of its closing fence, every opening tried as the authors try it."""
    blocks = []
    for fence in ("```json", "```JSON", "```"):
        start = text.find(fence)
        while start != -1:
            end = text.find("```", start + len(fence))
            if end != -1:
                blocks.append((text[start + len(fence) : end].strip(), end))
            start = text.find(fence, start + len(fence))
    return blocks


def richest_json_object(text: str) -> dict[str, Any]:
    """The card in the extractor's reply, chosen as the authors choose it
    (``_extract_json_object``): the whole reply when it is one JSON object; otherwise, among the
    objects of its fenced blocks and its top-level ``{...}`` spans, the one with the most fields
    of the card schema, then the longest text, then the latest end (the first found on a full
    tie). So an example object in the analysis before the card, or a fragment after it, is not
    taken, and an object that does not parse is skipped whole (nothing inside it is tried).
    SkillParseError where there is none."""
    text = text.strip()
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return whole
    best: tuple[tuple[int, int, int], dict[str, Any]] | None = None
    for candidate, end in _fenced_blocks(text) + _top_level_objects(text):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            rank = (len(SCHEMA_FIELDS & set(value)), len(candidate), end)
            if best is None or rank > best[0]:
                best = (rank, value)
    if best is None:
        raise SkillParseError("no JSON object found in the extractor's output")
    return best[1]


def parse_skill(text: str) -> SkillCard:
    """Parse and validate a card; the audit result is attached, not raised."""
    data = richest_json_object(text)
    for key in REQUIRED_FIELDS:
        if not data.get(key):  # the authors' check: present and not empty (any truthy value)
            raise SkillParseError(f"field '{key}' missing or empty")
    # Values the authors' rendering raises on (it iterates each field and calls .get on each
    # workflow step and error item): no card comes of them.
    for key in ("workflow", "error_handling"):
        items = data.get(key)
        if items and not (isinstance(items, list) and all(isinstance(item, dict) for item in items)):
            raise SkillParseError(f"'{key}' must be a list of objects")
    for key in (*(name for name, _ in LIST_SECTIONS), "decision_rules"):
        if data.get(key) and not isinstance(data[key], (list, str, dict)):
            raise SkillParseError(f"'{key}' must be a list")
    card = SkillCard(name=str(data["name"]).strip(), data=data)
    card.audit_flags = audit(card.render())
    return card


#: Unicode name parts the authors' audit treats as suspicious (look-alike or invisible forms).
_SUSPICIOUS_NAMES = ("ZERO WIDTH", "FULLWIDTH", "HALFWIDTH", "MATHEMATICAL", "MODIFIER LETTER",
                     "COMBINING", "PRIVATE USE", "SMALL FORM VARIANT")
#: The authors' repetition limits: a character or a token repeated this many times in a row,
#: a 2- to 4-token chunk (8 characters or more) repeated this many times in a row, a line of 12
#: characters or more making up at least this share (and count) of the lines.
_CHAR_RUN = 8
_TOKEN_RUN = 8
_CHUNK_RUN = 4
_LINE_SHARE, _LINE_COUNT, _LINE_CHARS = 0.5, 3, 12


def _suspicious(char: str) -> bool:
    if char in "\n\r\t":
        return False
    if char == "\ufffd" or ord(char) < 32 or ord(char) == 127:
        return True
    if unicodedata.category(char) in {"Cf", "Cs", "Co", "Cn"}:
        return True
    name = unicodedata.name(char, "")
    return any(part in name for part in _SUSPICIOUS_NAMES)


def _non_english(char: str) -> bool:
    """A non-ASCII letter, mark or digit (non-ASCII punctuation, symbols and spaces are fine)."""
    return ord(char) > 127 and unicodedata.category(char)[0] not in "SPZ"


def _repetition(text: str) -> str:
    collapsed = re.sub(r"[ \t]+", " ", text.strip())
    if re.search(rf"(.)\1{{{_CHAR_RUN - 1},}}", collapsed):
        return "repeated character"
    tokens = collapsed.lower().split()
    run = 1
    for previous, token in pairwise(tokens):
        run = run + 1 if token == previous else 1
        if run >= _TOKEN_RUN:
            return "repeated token"
    for size in (2, 3, 4):
        for start in range(len(tokens) - size * _CHUNK_RUN + 1):
            chunk = tokens[start : start + size]
            if len(" ".join(chunk)) < 8:
                continue
            if all(tokens[start + k * size : start + (k + 1) * size] == chunk
                   for k in range(1, _CHUNK_RUN)):
                return "repeated phrase"
    lines = [line.strip().lower() for line in text.splitlines() if line.strip()]
    counts = Counter(line for line in lines if len(line) >= _LINE_CHARS)
    if counts:
        count = counts.most_common(1)[0][1]
        if count >= _LINE_COUNT and count / len(lines) >= _LINE_SHARE:
            return "repeated line"
    return ""


def audit(text: str) -> list[str]:
    """The authors' rule-based language audit of a rendered card, with zero tolerance; returns
    the reasons it fails (empty: it passes).

    * suspicious characters: control, replacement, format, surrogate, private-use or unassigned
      characters, and look-alike forms (fullwidth, mathematical, combining, zero-width, ...);
    * non-English: any non-ASCII letter, mark or digit (one CJK character fails a card);
    * repetition: a character or token 8 times in a row, a 2- to 4-token phrase 4 times in a
      row, or one line making up half of the lines (3 times at least).
    """
    if not text.strip():
        return ["empty"]
    flags = []
    if any(_suspicious(char) for char in text):
        flags.append("suspicious characters")
    if any(_non_english(char) for char in text):
        flags.append("not English")
    repeated = _repetition(text)
    if repeated:
        flags.append(f"repetition ({repeated})")
    return flags
