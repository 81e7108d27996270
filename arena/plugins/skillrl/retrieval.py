"""Skill retrieval and the skill-augmented prompt.

Two modes, as in the authors' ``skills_only_memory.py`` (``methods.md`` section 2a.5):

* ``template`` (their default): every skill of the task's type, the first ``top_general``
  general skills (evolved ``dyn_`` ones first) and the first ``max_mistakes`` mistakes;
* ``embedding``: the ``top_k`` skills and mistakes most similar to the goal, with an optional
  similarity threshold (the authors' code has none; the paper's delta = 0.4 is exposed here as
  ``threshold`` but off by default, since in their code 0.4 is the evolution's accuracy bar).

Both read the experience store, so what evaluation retrieves is exactly what the frozen digest
covers. The prompt lists General Principles, then the task-type skills, then Don't/Instead
mistakes, in front of the harness's standard prompt, from step ``inject_from_step`` on.
"""

from __future__ import annotations

from typing import Any

from arena import Chat, Experience, Observation, Task, Trajectory, build_prompt, with_task_message
from arena.plugins.skillrl.skillbank import GENERAL, MISTAKE, SKILL

HEADER = "Retrieved Relevant Experience:"


def template_retrieve(store: Any, task: Task, *, top_general: int, max_mistakes: int,
                      evolved: bool = True) -> list[Experience]:
    """Every dynamic (evolved) general skill, then distilled general skills up to
    ``top_general`` in all (the authors' skills_only_memory keeps every evolved one), the task
    type's skills, then mistakes. ``evolved=False``: as if no skill had evolved (the prompt of
    an environment that never receives them)."""
    skills = store.all(kind=SKILL)
    general = sorted((e for e in skills if e.metadata.get("scope") == GENERAL),
                     key=lambda e: e.experience_id)
    dynamic = [e for e in general if e.metadata.get("dynamic", False)] if evolved else []
    static = [e for e in general if not e.metadata.get("dynamic", False)]
    typed = [e for e in skills if e.metadata.get("scope") == task.task_type]
    mistakes = store.all(kind=MISTAKE)
    return (dynamic + static[:max(0, top_general - len(dynamic))] + typed
            + mistakes[:max(0, max_mistakes)])


def embedding_retrieve(store: Any, task: Task, *, top_k: int, threshold: float | None) -> list[Experience]:
    """The ``top_k`` skills and mistakes nearest to the goal (cosine), optionally above a bar."""
    hits = store.query(task.goal, top_k, where={"kind": {"$in": [SKILL, MISTAKE]}},
                       min_similarity=threshold)
    return [experience for experience, _similarity in hits]


def render_skills(experiences: list[Experience], task_type: str, max_chars: int) -> str:
    """The authors' section order: General Principles, type skills, then Don't/Instead."""
    general = [e for e in experiences if e.kind == SKILL and e.metadata.get("scope") == GENERAL]
    typed = [e for e in experiences if e.kind == SKILL and e.metadata.get("scope") != GENERAL]
    mistakes = [e for e in experiences if e.kind == MISTAKE]
    parts = [HEADER]
    if general:
        parts.append("General Principles:\n" + "\n".join(f"- {e.text}" for e in general))
    if typed:
        types = sorted({str(e.metadata.get("scope")) for e in typed})
        label = types[0] if len(types) == 1 else "task-specific"
        parts.append(f"Skills for {label} tasks:\n" + "\n".join(f"- {e.text}" for e in typed))
    if mistakes:
        parts.append("Mistakes to avoid:\n" + "\n".join(f"- {e.text}" for e in mistakes))
    text = "\n".join(parts)
    if max_chars > 0 and len(text) > max_chars:
        text = text[: max_chars - 3].rstrip() + "..."
    return text


def skills_visible(step_number: int, inject_from_step: int) -> bool:
    """Whether the skills are in the prompt of step ``step_number`` (1-based). The authors'
    env manager shows them from step 2 on (``inject_from_step: 2``)."""
    return step_number >= inject_from_step


def make_prompt_builder(inject_from_step: int, max_chars: int) -> Any:
    """A :func:`arena.core.solver.build_prompt`-compatible builder that puts the skill section
    after the task description, only once the episode has reached ``inject_from_step``."""

    def builder(task: Task, observation: Observation, trajectory: Trajectory, experiences: list[Experience],
                **settings: Any) -> Chat:
        chat = build_prompt(task, observation, trajectory, [], **settings)
        if not experiences or not skills_visible(len(trajectory.steps) + 1, inject_from_step):
            return chat
        first = trajectory.initial_observation.strip()
        section = render_skills(experiences, task.task_type, max_chars)

        def insert(user: str) -> str:
            if user.startswith(first):
                return f"{first}\n\n{section}{user[len(first):]}"
            return f"{section}\n\n{user}"  # pragma: no cover - the task message starts with it

        return with_task_message(chat, insert)

    return builder
