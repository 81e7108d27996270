"""The harness's default implementations of the method hooks.

Registered ``trylast`` in every run's plugin manager, so a method overrides any of them simply by
implementing the same hook; what it leaves out behaves as here.
"""

from __future__ import annotations

import random

from arena.core.context import BudgetExhausted, RunContext
from arena.core.hookspecs import hookimpl
from arena.core.types import Experience, Task, Trajectory


class HarnessDefaults:
    """Standard solver, no retrieval, no extraction, and a generic experience loop for learning."""

    @hookimpl(trylast=True)
    def solve(self, run: RunContext, task: Task, experiences: list[Experience], seed: int) -> Trajectory:
        return run.standard_solve(task, experiences, seed)

    @hookimpl(trylast=True)
    def retrieve(self, run: RunContext, task: Task) -> list[Experience]:
        return []

    @hookimpl(trylast=True)
    def extract(self, run: RunContext, trajectories: list[Trajectory]) -> list[Experience]:
        return []

    @hookimpl(trylast=True)
    def learn(self, run: RunContext) -> bool:
        """Experience loop: passes over the learn split in a seeded order until a budget ends.

        Each episode: ``retrieve -> solve -> extract -> update``, recorded only after ``update``
        so that a resumed run neither repeats nor loses an update. With no episode budget it makes
        one pass over the split.
        """
        split = str(run.cfg.learn.split)
        seed = int(run.cfg.learn.seed)
        tasks = run.tasks(split)
        if not tasks:
            return True
        episodes = run.budget.limits.get("episodes")
        passes = 1 if episodes is None else -(-int(episodes) // len(tasks))
        for number in range(passes):
            order = list(tasks)
            random.Random(seed * 7919 + number).shuffle(order)
            variant = f"pass{number}"
            for task in order:
                if run.budget_exhausted():
                    return True
                if run.finished(task, seed, variant):
                    continue
                experiences = run.hook.retrieve(run=run, task=task) or []
                try:
                    trajectory = run.play(task, experiences, seed=seed, variant=variant, record=False)
                except BudgetExhausted:
                    return True
                new = run.hook.extract(run=run, trajectories=[trajectory]) or []
                run.hook.update(run=run, trajectories=[trajectory], experiences=new)
                run.record(trajectory, seed=seed, variant=variant)
        return True
