"""Skill retrieval and the skill-augmented prompt.

Two modes, as in the authors' ``skills_only_memory.py`` (``methods.md`` section 2a.5):

* ``template`` (their default): every skill of the task's type, the first ``top_general``
  general skills (evolved ``dyn_`` ones first) and the first ``max_mistakes`` mistakes;
* ``embedding``: the ``top_k`` skills and mistakes most similar to the goal, with an optional
  similarity threshold (the authors' code has none; the paper's delta = 0.4 is exposed here as
  ``threshold`` but off by default, since in their code 0.4 is the evolution's accuracy bar).

Which task-type skills a task gets (``routing``): those of its true task type (``task_type``),
or of the category its goal's keywords name (``keywords``: the authors' ``_detect_task_type``,
whose categories also file the skills at distillation). Every list keeps the bank's order: the
order the skills were added in, as the authors' JSON lists do (ids are numbered in that order).

Both read the experience store, so what evaluation retrieves is exactly what the frozen digest
covers. The prompt lists General Principles, then the task-type skills, then Don't/Instead
mistakes, in front of the harness's standard prompt, from step ``inject_from_step`` on.
"""

from __future__ import annotations

from typing import Any

from arena import Chat, Experience, Observation, Task, Trajectory, build_prompt, with_task_message
from arena.plugins.skillrl.settings import ROUTING, ROUTING_KEYWORDS, ROUTING_TASK_TYPE
from arena.plugins.skillrl.skillbank import GENERAL, MISTAKE, SKILL

HEADER = "Retrieved Relevant Experience:"
#: The authors' ALFWorld categories (their skill bank's task-type keys).
KEYWORD_CATEGORIES = ("pick_and_place", "look_at_obj_in_light", "clean", "heat", "cool", "examine")


def keyword_category(goal: str, *, distilling: bool = False) -> str | None:
    """The authors' category of a goal, by its words, tested in their order: "look at" with
    "under", then "clean", "heat", "cool", then "examine" or "find", else pick and place. So
    "put a hot apple in fridge" is pick and place and "find two pillow and put them in sofa" is
    examine, as in their code. At retrieval everything else is pick and place; when
    ``distilling``, a goal without "put" has no category (their skill generation skips it)."""
    text = goal.lower()
    if "look at" in text and "under" in text:
        return "look_at_obj_in_light"
    for word in ("clean", "heat", "cool"):
        if word in text:
            return word
    if "examine" in text or "find" in text:
        return "examine"
    if distilling and "put" not in text:
        return None
    return "pick_and_place"


def skill_category(task: Task, routing: str, *, distilling: bool = False) -> str | None:
    """The task-type scope ``task``'s skills are filed under and retrieved from."""
    if routing == ROUTING_KEYWORDS:
        return keyword_category(task.goal, distilling=distilling)
    if routing != ROUTING_TASK_TYPE:
        raise ValueError(f"method.retrieval.routing must be one of {ROUTING}, not {routing!r}")
    return task.task_type


def bank_order(experience: Experience) -> tuple[str, int, str]:
    """The bank's order: by id prefix, then the number the bank gave it in order of addition
    (numerically, so ``gen_1000`` follows ``gen_999``)."""
    stem, _, number = experience.experience_id.rpartition("_")
    return (stem, int(number), "") if number.isdigit() else (experience.experience_id, 0, "")


def template_retrieve(store: Any, task: Task, *, top_general: int, max_mistakes: int,
                      evolved: bool = True, category: str | None = None) -> list[Experience]:
    """Every dynamic (evolved) general skill, then distilled general skills up to
    ``top_general`` in all (the authors' skills_only_memory keeps every evolved one), the skills
    of ``category`` (default: the task's type; :func:`skill_category`), then mistakes, each in
    the bank's order. ``evolved=False``: as if no skill had evolved (the prompt of an
    environment that never receives them)."""
    skills = sorted(store.all(kind=SKILL), key=bank_order)
    scope = task.task_type if category is None else category
    general = [e for e in skills if e.metadata.get("scope") == GENERAL]
    dynamic = [e for e in general if e.metadata.get("dynamic", False)] if evolved else []
    static = [e for e in general if not e.metadata.get("dynamic", False)]
    typed = [e for e in skills if e.metadata.get("scope") == scope]
    mistakes = sorted(store.all(kind=MISTAKE), key=bank_order)
    return (dynamic + static[:max(0, top_general - len(dynamic))] + typed
            + mistakes[:max(0, max_mistakes)])


def embedding_retrieve(store: Any, task: Task, *, top_k: int, threshold: float | None) -> list[Experience]:
    """The ``top_k`` skills and mistakes nearest to the goal (cosine), optionally above a bar."""
    hits = store.query(task.goal, top_k, where={"kind": {"$in": [SKILL, MISTAKE]}},
                       min_similarity=threshold)
    return [experience for experience, _similarity in hits]


#: ``retrieval.style``: Arena's compact section, or the authors' Markdown one.
STYLE_ARENA, STYLE_AUTHORS = "arena", "authors"
#: The authors' heading of the skill section in their ALFWorld prompt.
AUTHORS_HEADER = "## Retrieved Relevant Experience"


def _authors_body(general: list[Experience], typed: list[Experience],
                  mistakes: list[Experience]) -> str:
    """The authors' ``format_for_prompt``: General Principles (title and principle), the
    category's skills (with when to apply) under the category's title-cased name, then each
    mistake's Don't and Instead lines; sections apart by a blank line."""
    sections = []
    if general:
        sections.append("\n".join(["### General Principles"] + [
            f"- **{e.metadata.get('title', '')}**: {e.metadata.get('principle', e.text)}" for e in general]))
    if typed:
        types = sorted({str(e.metadata.get("scope")) for e in typed})
        name = types[0].replace("_", " ").title() if len(types) == 1 else "Task-Relevant"
        lines = [f"### {name} Skills"]
        for e in typed:
            lines.append(f"- **{e.metadata.get('title', '')}**: {e.metadata.get('principle', e.text)}")
            if e.metadata.get("when_to_apply"):
                lines.append(f"  _Apply when: {e.metadata['when_to_apply']}_")
        sections.append("\n".join(lines))
    if mistakes:
        lines = ["### Mistakes to Avoid"]
        for e in mistakes:
            lines.append(f"- **Don't**: {e.metadata.get('description', e.text)}")
            if e.metadata.get("how_to_avoid"):
                lines.append(f"  **Instead**: {e.metadata['how_to_avoid']}")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) if sections else "No relevant skills found for this task."


def render_skills(experiences: list[Experience], task_type: str, max_chars: int,
                  style: str = STYLE_ARENA) -> str:
    """The authors' section order: General Principles, type skills, then Don't/Instead;
    ``style`` ``authors`` in their Markdown wording under their heading, ``arena`` compact."""
    general = [e for e in experiences if e.kind == SKILL and e.metadata.get("scope") == GENERAL]
    typed = [e for e in experiences if e.kind == SKILL and e.metadata.get("scope") != GENERAL]
    mistakes = [e for e in experiences if e.kind == MISTAKE]
    if style == STYLE_AUTHORS:
        text = f"{AUTHORS_HEADER}\n\n{_authors_body(general, typed, mistakes)}"
    elif style == STYLE_ARENA:
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
    else:
        raise ValueError(f"method.retrieval.style must be {STYLE_ARENA} or {STYLE_AUTHORS}, not {style!r}")
    if max_chars > 0 and len(text) > max_chars:
        text = text[: max_chars - 3].rstrip() + "..."
    return text


def skills_visible(step_number: int, inject_from_step: int) -> bool:
    """Whether the skills are in the prompt of step ``step_number`` (1-based). The authors'
    env manager shows them from step 2 on (``inject_from_step: 2``)."""
    return step_number >= inject_from_step


def make_prompt_builder(inject_from_step: int, max_chars: int, style: str = STYLE_ARENA) -> Any:
    """A :func:`arena.core.execution.solver.build_prompt`-compatible builder that puts the skill section
    after the task description, only once the episode has reached ``inject_from_step``."""

    def builder(task: Task, observation: Observation, trajectory: Trajectory, experiences: list[Experience],
                **settings: Any) -> Chat:
        chat = build_prompt(task, observation, trajectory, [], **settings)
        if not experiences or not skills_visible(len(trajectory.steps) + 1, inject_from_step):
            return chat
        first = trajectory.initial_observation.strip()
        section = render_skills(experiences, task.task_type, max_chars, style)

        def insert(user: str) -> str:
            if user.startswith(first):
                return f"{first}\n\n{section}{user[len(first):]}"
            return f"{section}\n\n{user}"  # pragma: no cover - the task message starts with it

        return with_task_message(chat, insert)

    return builder
