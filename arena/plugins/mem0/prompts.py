"""The two prompts of the Mem0-style memory, in our own words after mem0's roles: fact extraction
(an episode in, a JSON list of facts out) and reconciliation (stored memories with small integer
ids and new facts in, one ADD / UPDATE / DELETE / NONE event per memory out), and their lenient
parsers (a small model often stops before closing its JSON)."""

from __future__ import annotations

import json
import re
from typing import Any

from arena import Chat, Instructions, Trajectory

FACTS_PREFIX = '{"facts": ["'
EVENTS_PREFIX = '{"memory": [{"id": "'
EVENTS = ("ADD", "UPDATE", "DELETE", "NONE")


def _prefilled(chat: Chat, reply_prefix: str) -> Chat:
    """The chat with the reply begun (a trailing assistant message the model continues)."""
    return [*chat, {"role": "assistant", "content": reply_prefix}] if reply_prefix else chat


def facts_prompt(trajectory: Trajectory, max_steps: int, instructions: Instructions,
                 reply_prefix: str = "") -> Chat:
    """An episode as the conversation facts are extracted from."""
    system = (
        f"You keep the memory of an agent that does {instructions.domain} tasks. From the episode "
        "below, write down the facts worth remembering for later tasks in the same world: where "
        "things were found, which actions worked or did nothing, what the task needed and how it "
        'ended. Each fact is one short sentence. Reply with JSON only: {"facts": ["...", "..."]}; '
        'an episode with nothing to remember gives {"facts": []}.'
    )
    outcome = "succeeded" if trajectory.success else f"failed ({trajectory.status.value})"
    user = (f"Task: {trajectory.task.goal}\n{instructions.render(trajectory, max_steps=max_steps)}\n"
            f"The episode {outcome}.")
    return _prefilled([{"role": "system", "content": system}, {"role": "user", "content": user}], reply_prefix)


def update_prompt(old: list[tuple[str, str]], facts: list[str], reply_prefix: str = "") -> Chat:
    """Stored memories (id, text) and new facts; one event per memory, ADD for new ones."""
    system = (
        "You manage a memory. Compare each new fact with the stored memories and decide, for each, "
        "one event: ADD (a new fact not in memory, with a new id), UPDATE (a stored memory the fact "
        "corrects or makes more complete: keep its id, give the new text), DELETE (a stored memory "
        "the fact contradicts: keep its id), NONE (already known: keep its id and text). Reply with "
        'JSON only: {"memory": [{"id": "0", "text": "...", "event": "NONE"}, ...]}.'
    )
    stored = json.dumps([{"id": key, "text": text} for key, text in old])
    user = f"Stored memories: {stored}\nNew facts: {json.dumps(facts)}"
    return _prefilled([{"role": "system", "content": system}, {"role": "user", "content": user}], reply_prefix)


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_OBJECT = re.compile(r"\{[^{}]*\}")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_facts(text: str, max_facts: int) -> list[str]:
    """The reply's facts: its JSON when it parses, else every complete string of its facts list
    up to where the reply stopped (a reply with no facts list gives none, as mem0's does)."""
    data = _loads(text.strip())
    if isinstance(data, dict) and isinstance(data.get("facts"), list):
        items = [str(item) for item in data["facts"]]
    else:
        start = text.find('"facts"')
        if start < 0:
            return []
        body = text[start + len('"facts"'):]
        body = body[body.find("[") + 1:] if "[" in body else ""
        items = [json.loads(f'"{match}"') for match in _STRING.findall(body.split("]", 1)[0])]
    facts = [" ".join(item.split()) for item in items if item.strip()]
    return list(dict.fromkeys(facts))[:max_facts]


def parse_events(text: str) -> list[dict[str, str]]:
    """The reply's events: its JSON when it parses, else every complete ``{...}`` object in it.
    Events without a known ``event`` or an ``id`` are left out."""
    data = _loads(text.strip())
    if isinstance(data, dict) and isinstance(data.get("memory"), list):
        items = data["memory"]
    else:
        items = [_loads(match) for match in _OBJECT.findall(text)]
    events = []
    for item in items:
        if not isinstance(item, dict):
            continue
        event = str(item.get("event", "")).upper()
        if event in EVENTS and "id" in item:
            events.append({"id": str(item["id"]), "text": " ".join(str(item.get("text", "")).split()),
                           "event": event})
    return events
