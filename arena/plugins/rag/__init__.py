"""rag: store successful train trajectories, show the k most similar by task text as examples.

The honest "raw experience" baseline: everything a memory method adds (Q-values, insights,
reflections, scripts) is measured against simply retrieving what worked before. Learning is the
harness's loop (retrieve -> solve -> extract -> update) on train; evaluation only reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import arena
from arena import LEARN, TEST_SPLITS, Experience, Provenance, Run, Task, Trajectory, typed_config
from arena.plugins.rag.settings import RAGSettings

TRAJECTORY = "trajectory"


def render_example(trajectory: Trajectory, max_chars: int) -> str:
    """A solved task as an example: the goal, then its actions (the last ones if too long)."""
    actions = [f"> {step.action}" for step in trajectory.steps]
    while actions and len("\n".join(actions)) > max_chars - 4:
        actions.pop(0)
    cut = "> ...\n" if len(actions) < len(trajectory.steps) else ""
    return f"Solved example. Task: {trajectory.task.goal}\n{cut}" + "\n".join(actions)


def example_experience(trajectory: Trajectory, max_chars: int) -> Experience:
    task = trajectory.task
    return Experience(
        kind=TRAJECTORY,
        text=render_example(trajectory, max_chars),
        provenance=Provenance((task.task_id,), task.split),
        metadata={"goal": task.goal, "task_type": task.task_type, "steps": len(trajectory.steps)},
    )


class Rag:
    """Trajectory retrieval by task-text similarity; learns nothing but what it stores."""

    def __init__(self, run: Run) -> None:
        self.cfg: RAGSettings = typed_config(run.cfg.method, RAGSettings)

    @arena.hookimpl
    def extract(self, run: Run, trajectories: list[Trajectory]) -> list[Experience]:
        return [example_experience(t, self.cfg.max_action_chars)
                for t in trajectories if t.success]

    @arena.hookimpl
    def update(self, run: Run, trajectories: list[Trajectory],
               experiences: list[Experience]) -> None:
        examples = [e for e in experiences if e.kind == TRAJECTORY]
        if examples:
            run.store.add(examples, index_texts=[str(e.metadata["goal"]) for e in examples])
        if run.phase == LEARN and trajectories:  # step: the episode just played (charged)
            run.log_metrics(run.budget.used["episodes"], {
                "success": sum(t.success for t in trajectories) / len(trajectories),
                "examples": run.store.count(kind=TRAJECTORY)})

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        """The k stored successes whose task text is most similar to this task's.

        While learning, the task's own earlier trajectories are left out (they would be its
        answer). On the frozen track the store holds train data only; the filter on test
        splits makes sure of it rather than trusting it.
        """
        learning = run.phase == LEARN
        if learning and not self.cfg.retrieve_while_learning:
            return []
        where = None if run.track == "online" else {"source_split": {"$nin": list(TEST_SPLITS)}}
        found = run.store.query(
            task.goal, k=self.cfg.k, kind=TRAJECTORY, where=where,
            exclude_source_tasks=[task.task_id] if learning else None,
        )
        return [experience for experience, _ in found]

    #: Exported: the stored trajectories: retrieved by goal, read by any model.
    export = arena.export_stored(TRAJECTORY)

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        return {"trajectories": run.store.count(kind=TRAJECTORY) if run.store_exists() else 0}


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("rag", Rag, **arena.plugin_files(__file__),
             description="Retrieval of successful train trajectories by task similarity (baseline).")
