"""ExpeL's prompts, in our own words, following the authors' structure (``methods.md`` section 4).

* the Reflexion prompt: one failed trial in, a one-line plan for the next attempt out;
* the two critique prompts that edit the insight list: a success/failure pair of the same task,
  or a block of successes; each shows the EXISTING RULES and the operation grammar;
* the solver's extra prompt sections: few-shot successes, the insights, and (while gathering)
  the reflections on earlier trials. They are put in front of the harness's standard prompt, so
  history, observation and admissible actions read exactly as for every other method.
"""

from __future__ import annotations

from typing import Any

from arena import (
    Chat,
    Experience,
    Instructions,
    Observation,
    Task,
    Trajectory,
    build_prompt,
    clip_middle,
    with_task_message,
)


def reflection_system(instructions: Instructions) -> str:
    return ("You are an agent that improves by reflecting on its own failed attempts at "
            f"{instructions.domain} tasks.")

REFLECTION_REQUEST = (
    "You did not complete the task above. Do not describe the room. Think about the strategy and "
    "the path you took, find the mistake, and write a short new plan for the next attempt that "
    "names the specific actions you should take. Answer in one line."
)

CRITIC_SYSTEM = (
    "You are an advanced reasoning agent that can add, edit or remove rules from your existing "
    "rule set, based on forming new critiques of past task trajectories."
)

OPERATION_GRAMMAR = """<OPERATION> <RULE NUMBER>: <RULE>

The operations are: AGREE (an existing rule is strongly relevant for the task), REMOVE (an existing rule contradicts or duplicates other rules), EDIT (an existing rule is not general enough or can be improved: rewrite it), ADD (a new rule, very different from the existing ones and useful for other tasks). Write each operation on its own line, exactly in one of these forms:

AGREE <EXISTING RULE NUMBER>: <EXISTING RULE>
REMOVE <EXISTING RULE NUMBER>: <EXISTING RULE>
EDIT <EXISTING RULE NUMBER>: <NEW MODIFIED RULE>
ADD <NEW RULE NUMBER>: <NEW RULE>

Rules must be general: do not mention the trials. Keep each rule to one concise sentence ending with a period. Do at most {max_operations} operations, and at most one operation per existing rule. """

SUFFIX_FULL = (
    "The list is full: focus on REMOVE first, and ADD only a rule that is VERY insightful and "
    "different from the EXISTING RULES. Your operations on the EXISTING RULES:\n"
)
SUFFIX_NOT_FULL = "Your operations on the EXISTING RULES:\n"

def insights_header(instructions: Instructions) -> str:
    return (f"The following are insights gathered on similar {instructions.domain} tasks. Use them as "
            "references to help you perform this task:")

FEWSHOTS_HEADER = "Here are examples of similar tasks completed successfully:"
REFLECTIONS_HEADER = "Your reflections on your earlier failed attempts at this task:"


def outcome_line(trajectory: Trajectory) -> str:
    return "RESULT: task completed." if trajectory.success else f"RESULT: failed ({trajectory.status.value})."


def reflection_prompt(trajectory: Trajectory, max_chars: int, instructions: Instructions) -> Chat:
    """Asks for a one-line Reflexion plan after a failed trial."""
    transcript = clip_middle(instructions.render(trajectory), max_chars)
    user = f"Previous trial:\n{transcript}\n{outcome_line(trajectory)}\n\n{REFLECTION_REQUEST}\nNew plan:"
    return [{"role": "system", "content": reflection_system(instructions)}, {"role": "user", "content": user}]


def parse_reflection(text: str, max_chars: int = 400) -> str:
    """The first non-empty line (the authors stop the reflection at a newline)."""
    for line in text.splitlines():
        line = line.strip().removeprefix("New plan:").strip()
        if line:
            return line[:max_chars]
    return ""


def numbered(rules: list[str]) -> str:
    return "\n".join(f"{number}. {rule}" for number, rule in enumerate(rules, start=1)) if rules else "(none yet)"


def _critique(body: str, rules: list[str], full: bool, max_operations: int) -> Chat:
    user = (
        f"{body}\n\nHere are the EXISTING RULES:\n{numbered(rules)}\n\n"
        "By examining the trials and the existing rules, add, edit, remove or agree so that the new "
        "list of rules holds GENERAL and HIGH-LEVEL insights that help an agent choose better actions "
        "on different tasks in the future. Follow this format:\n\n"
        + OPERATION_GRAMMAR.format(max_operations=max_operations)
        + (SUFFIX_FULL if full else SUFFIX_NOT_FULL)
    )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}]


def compare_prompt(goal: str, success: str, failure: str, rules: list[str], *, full: bool,
                   max_operations: int, max_chars: int) -> Chat:
    """A successful and a failed trial of the same task, to critique the failure."""
    half = max_chars // 2
    body = (
        "Here are two trials of the same task to compare and critique.\n"
        f"TRIAL TASK: {goal}\n\nSUCCESSFUL TRIAL:\n{clip_middle(success, half)}\n\n"
        f"FAILED TRIAL:\n{clip_middle(failure, half)}"
    )
    return _critique(body, rules, full, max_operations)


def success_prompt(successes: list[tuple[str, str]], rules: list[str], *, full: bool,
                   max_operations: int, max_chars: int) -> Chat:
    """A block of successful trials (goal, transcript), to distil what made them work."""
    share = max_chars // max(1, len(successes))
    trials = "\n\n".join(f"TASK: {goal}\n{clip_middle(transcript, share)}" for goal, transcript in successes)
    body = f"Here are successful trials:\n{trials}"
    return _critique(body, rules, full, max_operations)


def experience_sections(experiences: list[Experience], instructions: Instructions) -> list[str]:
    """The prompt sections ExpeL adds: few-shot successes, insights, reflections (in that order)."""
    fewshots = [e for e in experiences if e.kind == "trajectory"]
    insights = [e for e in experiences if e.kind == "insight"]
    reflections = [e for e in experiences if e.kind == "reflection" and e.text.strip()]
    sections = []
    if fewshots:
        shown = "\n\n".join(str(e.metadata.get("transcript", e.text)).strip() for e in fewshots)
        sections.append(f"{FEWSHOTS_HEADER}\n\n{shown}\n\n(END OF EXAMPLES)")
    if insights:
        sections.append(f"{insights_header(instructions)}\n{numbered([e.text.strip() for e in insights])}")
    if reflections:
        sections.append(REFLECTIONS_HEADER + "\n" + "\n".join(
            f"Trial {number}: {e.text.strip()}" for number, e in enumerate(reflections, start=1)))
    return sections


def solver_prompt(task: Task, observation: Observation, trajectory: Trajectory,
                  experiences: list[Experience], **standard: Any) -> Chat:
    """The harness's standard prompt with ExpeL's sections in front of the task."""
    chat = build_prompt(task, observation, trajectory, [], **standard)
    sections = experience_sections(experiences, standard.get("instructions") or Instructions())
    if not sections:
        return chat
    return with_task_message(chat, lambda task: "\n\n".join([*sections, task]))
