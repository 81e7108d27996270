"""The learned state's digest: what the harness hashes to prove evaluation left it unchanged."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pluggy

from arena.core.contract.llm import LLMBackend
from arena.core.execution.context import RunContext


class StateDigests:
    """Hashes everything a method could have learned (store, method state, weights) and checks
    it again at random moments of a frozen evaluation.

    The harness hashes the store and the weights *before* any method hook runs, so a method
    cannot put back a copy of its learned state inside its own ``state_digest``."""

    def __init__(self, ctx: RunContext, llm: LLMBackend, hook: pluggy.HookRelay, method: str) -> None:
        self._ctx, self._llm, self._hook, self._method = ctx, llm, hook, method
        self._last_harness: dict[str, str] | None = None  # of the last state digest
        #: What the random checks of a frozen evaluation compare with (set by :meth:`freeze`).
        self.frozen: dict[str, str] | None = None

    def harness(self) -> dict[str, str]:
        """What the harness hashes itself: the store, the served weights and the method's state file."""
        text = self._ctx.method_state.text()
        return {"store": self._store(),
                "weights": self._llm.weights_digest(fresh=True),
                "method_state": hashlib.sha256(text.encode()).hexdigest() if text else "empty"}

    def _store(self) -> str:
        """The store's digest; a store that cannot be read (its folder deleted under the open
        database) is a violation and a digest of its own, never a crash that loses the run."""
        if not self._ctx.store_exists():
            return "empty"
        try:
            return self._ctx.store.digest()
        except Exception as exc:
            self._ctx.violation(f"The experience store could not be read for its digest ({type(exc).__name__}: "
                                f"{exc}): its folder was changed or deleted during the run.")
            return f"unreadable: {type(exc).__name__}"

    def state(self) -> str:
        """Digest of everything the method could have learned: store, method state, weights."""
        return self.states()[0]

    def states(self, *other_weights: str) -> list[str]:
        """The state digest, then the same state with each of ``other_weights`` (another model's
        weights digest) in place of the served one's (the state a declared change of model
        started from): the store, weights and method are hashed once."""
        parts: dict[str, Any] = dict(self.harness())
        self._last_harness = dict(parts)  # evaluation's reference, not hashed again
        try:
            parts["method"] = sorted(str(d) for d in self._hook.state_digest(run=self._ctx.method_run) if d)
        except Exception as exc:  # the finished work is kept; the run is invalid
            self._ctx.violation(f"state_digest of method '{self._method}' raised "
                                f"{type(exc).__name__}: {exc}; its state cannot be verified.")
            parts["method"] = ["<state_digest failed>"]
        return [hashlib.sha256(json.dumps({**parts, **({} if weights is None else {"weights": weights})},
                                          sort_keys=True).encode()).hexdigest()
                for weights in (None, *other_weights)]

    def freeze(self) -> None:
        """Take the reference of the random checks: the last state digest's harness part."""
        self.frozen = self._last_harness or self.harness()

    def spot_check(self) -> None:
        """At a random moment of a frozen evaluation: are the store and weights still those
        learning ended with?"""
        if self.frozen is not None and self.harness() != self.frozen:
            self._ctx.violation("The store or the weights differed from the learned state at a "
                                "random check during frozen evaluation: the method changed them "
                                "while being evaluated.")

    def store_size(self) -> dict[str, int]:
        """The store's size for results.json; a store a plugin damaged (its folder deleted while
        the database was open) is a recorded violation, not a crash that loses the results."""
        if not self._ctx.store_exists():
            return {"items": 0, "bytes": 0}
        try:
            return self._ctx.store.size()
        except Exception as exc:  # chromadb's errors when its files vanish have no common base
            self._ctx.violation(f"the experience store could not be read for its size "
                                f"({type(exc).__name__}: {exc}); was its folder changed?")
            return {"items": 0, "bytes": 0}
