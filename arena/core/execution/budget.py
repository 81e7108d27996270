"""The learning phase's budgets: what each limit is, what has been used, kept by the harness.

Episodes and environment steps are charged by the harness as it records learning episodes,
tokens are metered from every LLM call of the phase (auxiliary models' included), and gradient
steps are charged by the method (``run.charge(gradient_steps=n)``) and persisted here at once, so
no method keeps a harness counter itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

BUDGET_KEYS = ("episodes", "env_steps", "tokens", "gradient_steps")
#: The counters the budget persists as they change (the others are rebuilt from the record).
PERSISTED = ("gradient_steps",)


class Usage(dict[str, int]):
    """A copy of the budget's use; changing it is refused (it would change nothing)."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("run.budget.used is a read-only copy since Arena 0.2: charge use with "
                        "run.charge(episodes=1, gradient_steps=n, ...).")

    __setitem__ = __delitem__ = update = pop = clear = setdefault = _refuse  # type: ignore[assignment]


class Budget:
    """Learning-phase limits (None = unlimited) and their use so far."""

    def __init__(self, limits: Mapping[str, int | None], *, tokens_now: Callable[[], int],
                 persist: Callable[[dict[str, int]], object]) -> None:
        unknown = sorted(set(limits) - set(BUDGET_KEYS))
        if unknown:
            raise ValueError(f"Unknown budget {unknown[0]!r}. Budgets: {', '.join(BUDGET_KEYS)}")
        self.limits: dict[str, int | None] = {k: limits.get(k) for k in BUDGET_KEYS}
        self._used: dict[str, int] = dict.fromkeys(BUDGET_KEYS, 0)
        self._tokens_now = tokens_now
        self._persist = persist
        self._tokens_before = 0
        self._tokens_at_start = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> Usage:
        """A copy of what has been used (tokens as of the last :meth:`refresh`)."""
        with self._lock:
            return Usage(self._used)

    def restore(self, used: Mapping[str, int]) -> None:
        """What earlier sessions of this run used (the harness's call on resume)."""
        with self._lock:
            for key, amount in used.items():
                if key in BUDGET_KEYS:
                    self._used[key] = int(amount)

    def start_metering(self, tokens_before: int = 0) -> None:
        """Tokens count from here, on top of ``tokens_before`` of earlier sessions."""
        self._tokens_before = int(tokens_before)
        self._tokens_at_start = self._tokens_now()

    def refresh(self) -> None:
        """Every LLM token of the learning phase counts, extraction included."""
        with self._lock:
            self._used["tokens"] = self._tokens_before + self._tokens_now() - self._tokens_at_start

    def exhausted(self) -> list[str]:
        """Names of the budgets used up (tokens refreshed first)."""
        self.refresh()
        with self._lock:
            return [key for key, limit in self.limits.items()
                    if limit is not None and self._used[key] >= limit]

    def left(self, key: str) -> int | None:
        limit = self.limits.get(key)
        with self._lock:
            return None if limit is None else max(0, limit - self._used.get(key, 0))

    def charge(self, **amounts: int) -> None:
        """Add to the use, e.g. ``charge(gradient_steps=1)``; gradient steps are persisted."""
        with self._lock:
            for key, amount in amounts.items():
                if key not in BUDGET_KEYS:
                    raise ValueError(f"Unknown budget '{key}'. Budgets: {', '.join(BUDGET_KEYS)}")
                self._used[key] += int(amount)
            persisted = {key: self._used[key] for key in PERSISTED if key in amounts}
        if persisted:
            self._persist(persisted)
