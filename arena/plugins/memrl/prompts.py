"""MemRL's two writing prompts: a short script from a success, a reflection on a failure.

Our wording, after the roles the authors' prompts play (``methods.md`` section 3): a success
becomes "Task + SCRIPT (3-5 steps) + TRAJECTORY", a failure "reflection + failed trajectory".
"""

from __future__ import annotations

from arena import Chat, Instructions, Trajectory


def script_system(instructions: Instructions) -> str:
    return (f"You turn a solved {instructions.domain} task into a short reusable script for similar "
            "tasks later.")


def reflection_system(instructions: Instructions) -> str:
    return (f"You review a failed attempt at a {instructions.domain} task and say what to do "
            "differently next time.")


def action_line(trajectory: Trajectory, max_chars: int) -> str:
    """The episode's actions on one line, cut from the start so the last actions survive
    (the decisive ones: take, heat, put)."""
    line = "; ".join(step.action for step in trajectory.steps)
    if len(line) <= max_chars:
        return line
    return "... " + line[-(max_chars - 4):].split("; ", 1)[-1]


def script_prompt(trajectory: Trajectory, max_steps: int, instructions: Instructions) -> Chat:
    transcript = instructions.render(trajectory, max_steps=max_steps)
    user = (
        f"Task: {trajectory.task.goal}\n\nThe task was solved like this:\n{transcript}\n\n"
        "Write a script of 3 to 5 short numbered steps that solves tasks like this one. "
        "Reply with the steps only."
    )
    return [{"role": "system", "content": script_system(instructions)}, {"role": "user", "content": user}]


def reflection_prompt(trajectory: Trajectory, max_steps: int, instructions: Instructions) -> Chat:
    transcript = instructions.render(trajectory, max_steps=max_steps)
    user = (
        f"Task: {trajectory.task.goal}\n\nThis attempt failed ({trajectory.status.value}). "
        f"The last steps were:\n{transcript}\n\n"
        "In two or three sentences, say what went wrong and what to do instead next time."
    )
    return [{"role": "system", "content": reflection_system(instructions)}, {"role": "user", "content": user}]


def success_memory(goal: str, script: str, actions: str) -> str:
    return f"SUCCESSFUL experience. Task: {goal}\nScript:\n{script}\nActions: {actions}"


def failure_memory(goal: str, reflection: str, actions: str) -> str:
    return (f"FAILED experience (pattern to avoid). Task: {goal}\nReflection: {reflection}\n"
            f"Failed actions: {actions}")
