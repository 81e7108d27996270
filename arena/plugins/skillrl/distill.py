"""The teacher: distils trajectories into skills and mistakes, and proposes skills from failures.

The authors' teacher is o3 (``methods.md`` section 2a): trajectories -> per-trajectory memories ->
one distillation into the SkillBank; during RL, failed validation trajectories -> 1 to 3 new
``dyn_`` skills. Here the teacher is any configured backend (default: the run's own model), and
its prompts are ours, following that structure:

* a **success** is asked for its key decisions and why they worked, as one task-type skill;
* a **failure** is asked where it went wrong, what should have been done and a rule that prevents
  it, as one common mistake;
* the per-trajectory skills and mistakes are then **consolidated** into general skills;
* **evolution** (``evolution.scheme``): the authors' one call on the first failures of any type
  (5 shown, their last steps) -> 1 to 3 new general skills; or, per weak task type, up to 5 of
  its failures -> 1 to 3 new skills or revisions of named existing ones.

Every teacher call is counted in :class:`TeacherCost` (calls, tokens in and out), kept apart from
the policy's cost even when the teacher is the policy's own backend.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from arena import Chat, Instructions, LLMBackend, SamplingParams, Trajectory, clip_middle
from arena.plugins.skillrl.settings import TeacherSettings
from arena.plugins.skillrl.skillbank import Skill


def teacher_system(instructions: Instructions) -> str:
    domain = instructions.domain
    return (f"You are an expert teacher of {domain} agents. You study an agent's attempts at {domain} "
            "tasks and write short, reusable skills as JSON. Answer with JSON only.")


SUCCESS_REQUEST = (
    "The agent COMPLETED the task above. Identify the key decisions that made it succeed and why "
    "they worked, and write them as ONE reusable skill for every task of type '{task_type}'. "
    'Answer with one JSON object: {{"title": "...", "principle": "...", "when_to_apply": "..."}}'
)
FAILURE_REQUEST = (
    "The agent FAILED the task above. Find where it went wrong, what it should have done instead, "
    "and a rule that prevents the mistake. Answer with one JSON object: "
    '{{"description": "...", "why_it_happens": "...", "how_to_avoid": "..."}}'
)
CONSOLIDATE_REQUEST = (
    "Above are skills and mistakes learned from single tasks. Write at most {n} GENERAL skills "
    "that hold for every {domain} task (not one task type). Answer with a JSON list: "
    '[{{"title": "...", "principle": "...", "when_to_apply": "..."}}, ...]'
)
EVOLVE_REQUEST = (
    "The agent keeps failing tasks of type '{task_type}' ({accuracy:.0%} success). Above are up to "
    "{n_failures} failed attempts (their last steps) and the current skills. Propose 1 to {n} NEW "
    "skills that would have prevented these failures, or REVISE an existing skill by giving its "
    "id in \"revises\". Answer with a JSON list: "
    '[{{"title": "...", "principle": "...", "when_to_apply": "...", "revises": null}}, ...]'
)

EVOLVE_GENERAL_REQUEST = (
    "The agent's validation success is {accuracy:.0%}. Above are {n_failures} of its failed attempts "
    "(their last steps) and the titles of the skills it already has. Propose 1 to {n} NEW general "
    "skills, different from those, that would have prevented these failures. Answer with a JSON "
    'list: [{{"title": "...", "principle": "...", "when_to_apply": "..."}}, ...]'
)

#: The opening of each JSON answer, given as the start of the reply when ``reply_prefix`` is on
#: (a small model then writes JSON-shaped text; a large one needs no help).
PREFIXES = {"success": '{"title": "', "failure": '{"description": "', "consolidate": '[{"title": "',
            "evolve": '[{"title": "'}


@dataclass
class TeacherCost:
    """What the teacher spent, for ``results.json`` (method state sizes)."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0

    def add(self, calls: int, tokens_in: int, tokens_out: int) -> None:
        self.calls += calls
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out


class Teacher:
    """A backend used as teacher; counts its own calls whether or not it is the policy's."""

    def __init__(self, backend: LLMBackend, *, shares_policy_backend: bool, max_new_tokens: int,
                 temperature: float, reply_prefix: bool, transcript_chars: int,
                 cost: dict[str, int] | None = None) -> None:
        self.backend = backend
        self.shares_policy_backend = shares_policy_backend
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.reply_prefix = reply_prefix
        self.transcript_chars = transcript_chars
        self.cost = TeacherCost(**(cost or {}))
        self._lock = threading.Lock()

    def ask(self, prompts: list[tuple[str, Chat]], seed: int, max_new_tokens: int | None = None) -> list[str]:
        """Answer each ``(kind, chat)``; the reply prefix (if on) is prepended to the answer."""
        if not prompts:
            return []
        chats = []
        for kind, chat in prompts:
            if self.reply_prefix:
                chat = [*chat, {"role": "assistant", "content": PREFIXES[kind]}]
            chats.append(chat)
        params = SamplingParams(temperature=self.temperature, max_new_tokens=max_new_tokens or self.max_new_tokens,
                                seed=seed)
        generations = self.backend.generate(chats, params)
        self.charge(len(generations), sum(g.tokens_in for g in generations),
                    sum(g.tokens_out for g in generations))
        prefixes = [PREFIXES[kind] if self.reply_prefix else "" for kind, _ in prompts]
        return [prefix + g.text for prefix, g in zip(prefixes, generations)]

    def charge(self, calls: int, tokens_in: int, tokens_out: int) -> None:
        """Count teacher work done outside :meth:`ask` (demonstration episodes it played)."""
        with self._lock:
            self.cost.add(calls, tokens_in, tokens_out)

    def cost_dict(self) -> dict[str, int]:
        return asdict(self.cost)


def build_teacher(run: Any, section: TeacherSettings, cost: dict[str, int] | None = None) -> Teacher:
    """The run's own backend (``method.teacher.llm: null``) or another one the run builds
    (``run.auxiliary_llm``: ``method.teacher.llm`` over that backend's YAML defaults, its tokens
    counted in the run's costs and budget, closed when the run ends)."""
    if section.llm is None:
        backend, shared = run.llm, True
    else:
        backend, shared = run.auxiliary_llm(section.llm), False
    return Teacher(backend, shares_policy_backend=shared, max_new_tokens=section.max_new_tokens,
                   temperature=section.temperature, reply_prefix=section.reply_prefix,
                   transcript_chars=section.transcript_chars, cost=cost)


# -- prompts ---------------------------------------------------------------------------------

#: A clipped transcript keeps a third of its room for the start (the task), the rest for the end.
HEAD_SHARE = Fraction(1, 3)


def _chat(user: str, instructions: Instructions) -> Chat:
    return [{"role": "system", "content": teacher_system(instructions)}, {"role": "user", "content": user}]


def trajectory_prompt(trajectory: Trajectory, max_chars: int, instructions: Instructions) -> tuple[str, Chat]:
    """Success and failure are asked different questions (key decisions vs. what went wrong)."""
    transcript = clip_middle(instructions.render(trajectory), max_chars, head_share=HEAD_SHARE)
    task = trajectory.task
    if trajectory.success:
        request = SUCCESS_REQUEST.format(task_type=task.task_type)
        return "success", _chat(f"Task type: {task.task_type}\n{transcript}\nRESULT: completed.\n\n{request}",
                                instructions)
    request = FAILURE_REQUEST
    outcome = f"RESULT: failed ({trajectory.status.value})."
    return "failure", _chat(f"Task type: {task.task_type}\n{transcript}\n{outcome}\n\n{request}", instructions)


def consolidate_prompt(lines: list[str], n_general: int, max_chars: int,
                       instructions: Instructions) -> tuple[str, Chat]:
    body = clip_middle("\n".join(f"- {line}" for line in lines), max_chars, head_share=HEAD_SHARE)
    request = CONSOLIDATE_REQUEST.format(n=n_general, domain=instructions.domain)
    return "consolidate", _chat(f"{body}\n\n{request}", instructions)


def _failed_attempts(failures: list[Trajectory], last_steps: int, max_chars: int, with_type: bool,
                     instructions: Instructions) -> str:
    """The authors send the last 5 steps of each failed validation trajectory."""
    attempts = []
    for number, trajectory in enumerate(failures, start=1):
        label = f" ({trajectory.task.task_type})" if with_type else ""
        shown = clip_middle(instructions.render(trajectory, max_steps=last_steps),
                            max_chars // max(1, len(failures)), head_share=HEAD_SHARE)
        attempts.append(f"Attempt {number}{label}: {trajectory.task.goal}\n"
                        f"{shown}\n"
                        f"RESULT: failed ({trajectory.status.value}).")
    return "\n\n".join(attempts)


def evolve_prompt(task_type: str, accuracy: float, failures: list[Trajectory], skills: list[Skill],
                  *, max_new: int, last_steps: int, max_chars: int, instructions: Instructions) -> tuple[str, Chat]:
    """One weak task type's failures and the current skills: new skills or revisions."""
    current = "\n".join(f"[{s.skill_id}] {s.render()}" for s in skills) or "(none)"
    request = EVOLVE_REQUEST.format(task_type=task_type, accuracy=accuracy, n_failures=len(failures), n=max_new)
    attempts = _failed_attempts(failures, last_steps, max_chars, with_type=False, instructions=instructions)
    return "evolve", _chat(f"{attempts}\n\nCurrent skills:\n{current}\n\n{request}", instructions)


def evolve_general_prompt(accuracy: float, failures: list[Trajectory], titles: list[str], *, max_new: int,
                          last_steps: int, max_chars: int, instructions: Instructions) -> tuple[str, Chat]:
    """The authors' one evolution call: failed attempts of any type, the existing skills' titles
    only (nothing to revise), 1 to ``max_new`` new general skills."""
    current = "\n".join(f"- {title}" for title in titles) or "(none)"
    request = EVOLVE_GENERAL_REQUEST.format(accuracy=accuracy, n_failures=len(failures), n=max_new)
    attempts = _failed_attempts(failures, last_steps, max_chars, with_type=True, instructions=instructions)
    return "evolve", _chat(f"{attempts}\n\nExisting skills:\n{current}\n\n{request}", instructions)


# -- parsing ---------------------------------------------------------------------------------


def parse_json_values(text: str) -> list[Any]:
    """Every JSON object or list that can be decoded from ``text``, in order (a model's answer
    often wraps its JSON in prose or code fences)."""
    decoder = json.JSONDecoder()
    values, position = [], 0
    while position < len(text):
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            position = start + 1
            continue
        values.append(value)
        position = end
    return values


def _records(text: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for value in parse_json_values(text):
        items = value if isinstance(value, list) else [value]
        records.extend(item for item in items if isinstance(item, dict))
    return records


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    return value.strip() if isinstance(value, str) else ""


def parse_skills(text: str, limit: int | None = None) -> list[dict[str, str]]:
    """Skills ``{title, principle, when_to_apply, revises}`` from an answer; records without a
    title or principle are dropped."""
    skills = []
    for record in _records(text):
        title, principle = _text(record, "title"), _text(record, "principle")
        if title and principle:
            skills.append({"title": title, "principle": principle,
                           "when_to_apply": _text(record, "when_to_apply"),
                           "revises": _text(record, "revises")})
    return skills if limit is None else skills[:limit]


def parse_mistakes(text: str, limit: int | None = None) -> list[dict[str, str]]:
    """Mistakes ``{description, why_it_happens, how_to_avoid}``; incomplete ones dropped."""
    mistakes = []
    for record in _records(text):
        description, avoid = _text(record, "description"), _text(record, "how_to_avoid")
        if description and avoid:
            mistakes.append({"description": description, "why_it_happens": _text(record, "why_it_happens"),
                             "how_to_avoid": avoid})
    return mistakes if limit is None else mistakes[:limit]
