"""Evolving-RL's extractor prompt (our own wording of the authors' structure).

The extractor sees one source task, its trajectory between delimiters and whether it succeeded,
and is asked for a reusable skill card as JSON, analysis allowed before it.
"""

from __future__ import annotations

import json

from arena.core.llm import Chat
from arena.core.types import Trajectory

EXTRACTOR_SYSTEM = (
    "You turn an agent's experience into a reusable skill for similar household tasks. "
    "You may think first; end your answer with one JSON object."
)

SKILL_TEMPLATE = {
    "name": "short skill name",
    "description": "one sentence: what the skill achieves",
    "when_to_use": ["the task wording or situation that calls for it"],
    "workflow": [
        {"step": 1, "goal": "sub-goal", "action": "command pattern, e.g. go to X",
         "completion_condition": "how to know the step is done"}
    ],
    "decision_rules": ["if ... then ..."],
    "error_handling": [{"error": "what went wrong", "cause": "why", "response": "what to do"}],
}


def extractor_prompt(trajectory: Trajectory, max_steps_shown: int = 30,
                     reply_prefix: str | None = None) -> Chat:
    """The chat that asks for one skill card from one source trajectory. With ``reply_prefix``
    the extractor's reply starts with that text (e.g. ``{"name": "``), which a small model
    needs to write JSON at all; the card is then ``reply_prefix`` + what it generated."""
    outcome = "SUCCEEDED" if trajectory.success else "FAILED"
    transcript = trajectory.render(max_steps=max_steps_shown)
    user = (
        f"Task type: {trajectory.task.task_type}\n"
        f"The agent {outcome} at this task.\n"
        "=== TRAJECTORY START ===\n"
        f"{transcript}\n"
        "=== TRAJECTORY END ===\n\n"
        "Write a skill another agent can follow on similar tasks: when it applies, a step-by-step "
        "workflow in the game's commands, decision rules, and the mistakes to avoid"
        + (" (learn from this failure)." if not trajectory.success else ".")
        + "\nAnswer with JSON in this shape:\n"
        + json.dumps(SKILL_TEMPLATE, indent=1)
    )
    chat = [{"role": "system", "content": EXTRACTOR_SYSTEM}, {"role": "user", "content": user}]
    if reply_prefix:
        chat.append({"role": "assistant", "content": reply_prefix})
    return chat
