"""Optimizer steps charged to the learning budget exactly once per checkpoint, whatever kills a run.

An RL method's update and the checkpoint that keeps it are two writes; the budget's charge is a
third. Charged before the checkpoint, a kill between the two charges the rerun update twice;
charged after, a kill between them loses the charge. The ledger keeps, in the method's own state
(``run.method_state``), the steps of the saved checkpoints (``gradient_steps``) and the update
waiting for its checkpoint (``pending``), and charges the budget from that count: repeatable, so
a resumed run neither loses nor doubles a step. Evolving-RL, GiGPO and SkillRL share it.
"""

from __future__ import annotations

from typing import Any, Protocol


class _Run(Protocol):
    """What the ledger needs of ``arena.Run``: the budget's use and its charge."""

    @property
    def cfg(self) -> Any: ...

    @property
    def budget(self) -> Any: ...

    def charge(self, **amounts: int) -> None: ...


COUNTED, PENDING, CONTINUED = "gradient_steps", "pending", "ledger_continued_from"


class StepLedger:
    """The optimizer steps of ``state``'s saved checkpoints, charged once (module docstring).

    The caller saves ``state`` (its method state) after :meth:`pending` and :meth:`saved`."""

    def __init__(self, run: _Run, state: dict[str, Any]) -> None:
        self.run = run
        self.state = state
        # A continued run (run.continue_from) copied the state of the run it continues from,
        # whose steps that run's budget was charged: this run's count starts at none.
        source = run.cfg.run.get("continue_from")
        if source and state.get(CONTINUED) != str(source):
            state.pop(PENDING, None)
            state.update({COUNTED: 0, CONTINUED: str(source)})
        # A state from before the ledger (a run resumed by a newer Arena): what was charged.
        state.setdefault(COUNTED, int(run.budget.used.get("gradient_steps", 0)))

    @property
    def counted(self) -> int:
        return int(self.state[COUNTED])

    def recover(self, latest_checkpoint: int) -> dict[str, Any] | None:
        """On resume, with the newest checkpoint's number: an update whose checkpoint was saved
        before the kill is counted now; its metrics are returned (else None). One whose
        checkpoint was not saved stays pending: its iteration runs again and replaces it."""
        pending = self.state.get(PENDING)
        if pending is not None and "checkpoint" not in pending:  # GiGPO's before the ledger
            pending["checkpoint"] = int(pending["iteration"]) + 1
        if pending is None or latest_checkpoint < int(pending["checkpoint"]):
            return None
        self.saved()
        return dict(pending.get("metrics") or {})

    def pending(self, checkpoint: int, updates: int, metrics: dict[str, Any] | None = None) -> None:
        """The update of ``updates`` optimizer steps that checkpoint ``checkpoint`` will keep."""
        self.state[PENDING] = {"checkpoint": int(checkpoint), "updates": int(updates),
                               "metrics": dict(metrics or {})}

    def saved(self) -> None:
        """Its checkpoint is saved: count its steps."""
        self.count(int(self.state.pop(PENDING)["updates"]))

    def count(self, steps: int) -> None:
        """Count ``steps`` whose result the method's state keeps itself (charged once the state
        is saved and :meth:`charge_owed` runs)."""
        self.state[COUNTED] = self.counted + int(steps)

    def charge_owed(self) -> None:
        """Charge the counted steps the budget has not been charged yet (repeatable)."""
        owed = self.counted - int(self.run.budget.used.get("gradient_steps", 0))
        if owed > 0:
            self.run.charge(gradient_steps=owed)
