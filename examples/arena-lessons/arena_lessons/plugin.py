"""The ``lessons`` method: learn one sentence per episode, recall the nearest of the same type.

Learning uses Arena's default loop (``retrieve -> solve -> extract -> update``), so this plugin
implements only what differs: how an episode becomes a lesson (``extract``), how lessons are
kept (``update``), how they are found (``retrieve``), and its size for results.json.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import arena
from arena import LEARN, Experience, Provenance, Run, SamplingParams, Task, Termination, Trajectory

LESSON = "lesson"


@dataclass
class LessonsSettings:
    """The ``method`` section (config.yaml holds the defaults and says why each)."""

    k: int
    min_similarity: float
    transcript_steps: int
    max_new_tokens: int


def lesson_prompt(trajectory: Trajectory, steps: int) -> list[dict[str, str]]:
    """A chat asking for one lesson from the end of an episode and how it ended."""
    outcome = "succeeded" if trajectory.success else f"failed ({trajectory.status.value})"
    return [
        {"role": "system", "content": "You write one-sentence lessons for a household agent."},
        {"role": "user", "content": (
            f"Task: {trajectory.task.goal}\nThe agent {outcome}. Its last steps:\n"
            f"{trajectory.render(max_steps=steps)}\n\n"
            "In one sentence, what should the agent do (or avoid) next time on such a task?"
        )},
    ]


class Lessons:
    """Lessons in Arena's experience store, indexed by the goal they were learned on."""

    def __init__(self, run: Run) -> None:
        self.cfg = arena.typed_config(run.cfg.method, LessonsSettings)
        if self.cfg.k < 1:
            raise ValueError(f"method.k must be >= 1, got {self.cfg.k}")

    @arena.hookimpl
    def extract(self, run: Run, trajectories: list[Trajectory]) -> list[Experience]:
        """One lesson per finished episode; an episode that crashed teaches nothing."""
        usable = [t for t in trajectories if t.status is not Termination.ERROR and t.steps]
        if not usable:
            return []
        params = SamplingParams(max_new_tokens=self.cfg.max_new_tokens)
        steps = self.cfg.transcript_steps
        generations = run.llm.generate([lesson_prompt(t, steps) for t in usable], params)
        return [
            Experience(
                kind=LESSON,
                text=f"Lesson from '{t.task.goal}': {g.text.strip()}",
                provenance=Provenance((t.task.task_id,), t.task.split),
                metadata={"goal": t.task.goal, "task_type": t.task.task_type,
                          "success": t.success},
            )
            for t, g in zip(usable, generations)
        ]

    @arena.hookimpl
    def update(self, run: Run, experiences: list[Experience]) -> None:
        lessons = [e for e in experiences if e.kind == LESSON]
        if lessons:  # found by the goal they came from, not by their wording
            run.store.add(lessons, index_texts=[str(e.metadata["goal"]) for e in lessons])

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        """The k lessons of this task type with the most similar goals. Read-only."""
        if not run.has_store():
            return []
        found = run.store.query(
            task.goal, k=self.cfg.k, kind=LESSON, task_type=task.task_type,
            min_similarity=self.cfg.min_similarity,
            exclude_source_tasks=[task.task_id] if run.phase == LEARN else None,
        )
        return [lesson for lesson, _ in found]

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        return {"lessons": run.store.count(kind=LESSON) if run.has_store() else 0}


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("lessons", Lessons, **arena.plugin_files(__file__),
             description="One LLM-written lesson per learning episode, recalled by goal similarity.")
