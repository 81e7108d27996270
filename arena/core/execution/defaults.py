"""The harness's default implementations of the method hooks.

Registered ``trylast`` in every run's plugin manager, so a method overrides any of them simply by
implementing the same hook; what it leaves out behaves as here.
"""

from __future__ import annotations

from arena.core.contract.hookspecs import hookimpl
from arena.core.contract.run_api import STANDARD, EpisodeRequest, Run
from arena.core.contract.types import Experience, Task, Trajectory


class HarnessDefaults:
    """Standard solver, no retrieval, no extraction, and a generic experience loop for learning."""

    @hookimpl(trylast=True)
    def solve(self, run: Run, task: Task, experiences: list[Experience], seed: int) -> Trajectory:
        return run.play(EpisodeRequest(task, experiences, seed, policy=STANDARD))

    @hookimpl(trylast=True)
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        return []

    @hookimpl(trylast=True)
    def evaluation_variants(self, run: Run) -> list[str]:
        return []

    @hookimpl(trylast=True)
    def extract(self, run: Run, trajectories: list[Trajectory]) -> list[Experience]:
        return []

    @hookimpl(trylast=True)
    def learn(self, run: Run) -> bool:
        """The experience loop (:meth:`Run.experience_loop`)."""
        run.experience_loop()
        return True
