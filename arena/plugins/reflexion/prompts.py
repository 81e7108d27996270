"""Reflexion's reflection prompt, in our own words after the authors' (``config.yaml``): a failed
trial in (with the plans already written after the task's earlier failures), a new plan out."""

from __future__ import annotations

from arena import Chat, Experience, Instructions, Trajectory, clip_middle


def reflection_system(instructions: Instructions) -> str:
    return f"You learn from your own failed attempts at {instructions.domain} tasks."


REQUEST = (
    "The attempt above failed. Do not describe the surroundings. Look at the strategy and the "
    "actions you took, name the mistake, and write a short plan for the next attempt at this same "
    "task that says which specific actions to take."
)


def reflection_prompt(trajectory: Trajectory, earlier: list[Experience], max_chars: int,
                      instructions: Instructions) -> Chat:
    """The failed trial (its start, steps and status), the plans written after earlier failed
    trials of the task, the request, and the reply's opening ``New plan:`` (the authors' query
    ends there)."""
    parts = [f"Task: {trajectory.task.goal}", clip_middle(instructions.render(trajectory), max_chars),
             f"STATUS: FAIL ({trajectory.status.value})"]
    if earlier:
        parts.append("Plans from past attempts:\n" + "\n".join(
            f"Trial #{number}: {e.text}" for number, e in enumerate(earlier)))
    parts.append(REQUEST)
    return [{"role": "system", "content": reflection_system(instructions)},
            {"role": "user", "content": "\n\n".join(parts)},
            {"role": "assistant", "content": "New plan:"}]


def parse_reflection(text: str, max_chars: int = 1200) -> str:
    """The reply as written, stripped (the authors keep the raw completion), at most
    ``max_chars`` characters."""
    return text.strip()[:max_chars]
