"""The errors a run raises at a method, each saying what the method did and what to do instead."""

from __future__ import annotations


class ProtocolViolation(RuntimeError):
    """A method did something the evaluation protocol forbids (e.g. read a test split to learn)."""


class HookReturnError(ValueError):
    """A method's hook returned something of the wrong type; the message names the hook, the
    method and the type expected."""


class BudgetExhausted(RuntimeError):
    """The learning phase used up one of its budgets; the method must stop learning."""


class NotTrainable(ValueError):
    """The run's backend serves no model a method can train in-process."""


class RanksLost(RuntimeError):
    """A rank of a torchrun training group stopped (killed, out of memory, its node lost)."""
