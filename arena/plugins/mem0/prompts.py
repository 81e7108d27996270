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
#: How replies are read (``method.parser``): ``lenient`` keeps what a cut or loosely written reply
#: holds; ``authors`` reads them as mem0's ``Memory.add`` does (nothing from a reply that is no
#: JSON object, events and ids exactly as written).
PARSERS = ("lenient", "authors")
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


def check_parser(parser: str) -> str:
    if parser not in PARSERS:
        raise ValueError(f"Unknown method.parser {parser!r}. Choices: {', '.join(PARSERS)}")
    return parser


_FENCED = re.compile(r"^```[a-zA-Z0-9]*\n([\s\S]*?)\n```$")
_FENCE_INSIDE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)


def _unfenced(text: str) -> str:
    """The reply without a code fence around all of it and without <think> blocks (mem0's
    ``remove_code_blocks``)."""
    match = _FENCED.match(text.strip())
    inner = match.group(1).strip() if match else text.strip()
    return _THINK.sub("", inner).strip()


def _json_part(text: str) -> str:
    """The first fenced block, else the text from the first ``{`` to the last ``}``, else the
    text (mem0's ``extract_json``)."""
    text = text.strip()
    match = _FENCE_INSIDE.search(text)
    if match:
        return match.group(1)
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if start != -1 and end > start else text


def _object_as_authors(reply: str) -> Any:
    """The reply's JSON as mem0 reads it: the unfenced reply, else its JSON part; None if neither
    parses."""
    for candidate in (_unfenced(reply), _json_part(reply)):
        try:
            return json.loads(candidate, strict=False)
        except ValueError:
            continue
    return None


def parse_facts_as_authors(text: str) -> list[str]:
    """Facts as mem0 reads them (``main.py:545-560``, ``normalize_facts``): the ``facts`` of the
    reply's JSON object, strings kept as written, an object's ``fact`` or ``text``, anything else
    as text; nothing when the reply is empty, no JSON or has no ``facts``."""
    if not _unfenced(text):
        return []
    data = _object_as_authors(text)
    try:
        raw = data["facts"]
        items = list(raw) if raw else []
    except (KeyError, TypeError, IndexError):
        return []
    facts = []
    for item in items:
        fact = (item.get("fact") or item.get("text")) if isinstance(item, dict) else (
            item if isinstance(item, str) else str(item))
        if fact:
            facts.append(str(fact))
    return facts


def parse_events_as_authors(text: str) -> list[dict[str, str]]:
    """Events as mem0 reads them (``main.py:614-711``): the ``memory`` list of the reply's JSON
    object; an item without text skipped; the event as written (``add`` is none of the four);
    the id as written, so a number in place of the string id names no memory."""
    if not text.strip():
        return []
    data = _object_as_authors(text)
    items = data.get("memory", []) if isinstance(data, dict) else []
    events = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not item.get("text") or item.get("event") not in EVENTS:
            continue
        raw_id = item.get("id")
        events.append({"id": raw_id if isinstance(raw_id, str) else f"<not an id: {raw_id!r}>",
                       "text": str(item["text"]), "event": str(item["event"])})
    return events


def parse_facts(text: str, max_facts: int, parser: str = "lenient") -> list[str]:
    """The reply's facts: its JSON when it parses, else every complete string of its facts list
    up to where the reply stopped (a reply with no facts list gives none, as mem0's does);
    whitespace collapsed, duplicates once. ``parser="authors"``: :func:`parse_facts_as_authors`.
    At most ``max_facts`` either way."""
    if check_parser(parser) == "authors":
        return parse_facts_as_authors(text)[:max_facts]
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


def parse_events(text: str, parser: str = "lenient") -> list[dict[str, str]]:
    """The reply's events: its JSON when it parses, else every complete ``{...}`` object in it;
    the event in any case. Events without a known ``event``, or other than ADD without an
    ``id``, are left out (mem0 needs no id to ADD). ``parser="authors"``:
    :func:`parse_events_as_authors`."""
    if check_parser(parser) == "authors":
        return parse_events_as_authors(text)
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
        if event in EVENTS and ("id" in item or event == "ADD"):
            events.append({"id": str(item.get("id", "")), "text": " ".join(str(item.get("text", "")).split()),
                           "event": event})
    return events
