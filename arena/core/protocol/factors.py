"""What an experiment changes about a frozen evaluation, each factor a small object.

``arena experiment`` arms differ from their control in one factor, which the harness applies
(the method never sees it): the learned state evaluated with another model (:class:`NewModel`),
the store with a share of poison items (:class:`PoisonedStore`), and whose experience a test
episode is given (``eval.experience.source``: the run's
:class:`~arena.core.execution.experience_controls.ExperienceControl`, consulted per retrieval).
A changed world is a config of the arm's environment (``--change env.KEY=VALUE``) and needs no
object here. The evaluation applies the factors that apply, in order, before its first episode.
"""

from __future__ import annotations

from typing import Protocol

from arena.core.contract.env import TRAIN_SPLIT, Environment
from arena.core.contract.types import Experience
from arena.core.execution.context import RunContext
from arena.core.execution.experience_controls import poison_items
from arena.core.protocol.digests import StateDigests
from arena.core.storage import integrity
from arena.core.storage.ledger import Ledger, RunState


class Factor(Protocol):
    """One change to the state a frozen evaluation keeps, applied once and kept in the ledger:
    a session killed part-way takes back what it half did (:meth:`recover`) and applies it again."""

    #: It checks the learned state itself (the resume check would compare the wrong digest).
    verifies_learned_state: bool

    def applies(self, state: RunState) -> bool: ...

    def recover(self, state: RunState) -> None: ...

    def apply(self, state: RunState) -> RunState: ...


class NewModel:
    """A learned state evaluated with another model (``arena experiment transfer``): with the
    source model's weights digest in place of the served one's, the state must be the one the
    source's learning ended with; then the new model's digest is the reference evaluation keeps."""

    verifies_learned_state = True

    def __init__(self, ctx: RunContext, digests: StateDigests, ledger: Ledger, resumed: bool) -> None:
        self._ctx, self._digests, self._ledger, self._resumed = ctx, digests, ledger, resumed

    def applies(self, state: RunState) -> bool:
        return self._resumed and state.model_changed is not None and not state.model_changed.rebased

    def recover(self, state: RunState) -> None:
        """Nothing to take back: the ledger's one write is the whole change."""

    def apply(self, state: RunState) -> RunState:
        change = state.model_changed
        assert change is not None and state.digest_before_eval is not None  # applies() checked
        served, learned = self._digests.states(change.from_weights_sha256)
        method_files = integrity.tree_sha256(self._ctx.method_state.folder)
        if learned != state.digest_before_eval or method_files != change.method_files_sha256:
            self._ctx.violation(
                "The learned state evaluated with another model differs from the one its source's "
                f"learning ended with ({state.digest_before_eval[:12]} -> {learned[:12]}): the "
                "method must restore its learned state when constructed.")
        rebased = change.model_copy(update={"rebased": True, "digest_learned": state.digest_before_eval})
        return self._ledger.rebased(rebased, served)


class PoisonedStore:
    """``eval.experience.poison``'s share of poison items added to the learned store; the state
    evaluation must keep is the poisoned one (the clean digest is kept beside it). Deterministic:
    a session killed half-way takes out what it added, and adds the same items again."""

    verifies_learned_state = False

    def __init__(self, ctx: RunContext, digests: StateDigests, ledger: Ledger, env: Environment,
                 seed: int, method: str) -> None:
        self._ctx, self._digests, self._ledger, self._env = ctx, digests, ledger, env
        self._seed, self._method = seed, method
        self.fraction = ctx.experience_control.settings.poison

    def applies(self, state: RunState) -> bool:
        return self.fraction > 0 and state.poisoned is None

    def recover(self, state: RunState) -> None:
        if state.poisoning:  # killed while poisoning
            self._ctx.services.raw_store().delete(state.poisoning)

    def apply(self, state: RunState) -> RunState:
        fraction = self.fraction
        if not self._ctx.store_exists():
            raise ValueError(f"eval.experience.poison={fraction}: method '{self._method}' has no "
                             "experience store to poison (its learning is elsewhere, e.g. in weights). "
                             "Poison a run of a method that stores experience.")
        store = self._ctx.services.raw_store()
        items = store.all()
        rows = store.rows_of(e.experience_id for e in items)
        types = {t.task_id: t.task_type for split in (TRAIN_SPLIT, "valid")
                 if split in self._env.split_names() for t in self._env.tasks(split)}

        def task_type_of(item: Experience) -> str | None:
            found = {types.get(i) for i in item.provenance.source_task_ids} - {None}
            return found.pop() if len(found) == 1 else None

        try:
            poison = poison_items(items, {i: row["embedding"] for i, row in rows.items() if row},
                                  task_type_of, fraction, seed=self._seed)
        except ValueError as exc:
            raise ValueError(f"eval.experience.poison={fraction}: {exc}") from exc
        if poison:  # a share of a small store may round to no item: recorded as 0 poison items
            # Named before they are added: a session killed between the two takes them out again
            # (recover) rather than poisoning a poisoned store.
            self._ledger.poisoning([p.experience.experience_id for p in poison])
            store.add([p.experience for p in poison], embeddings=[p.embedding for p in poison])
        summary = {"fraction": fraction, "clean_items": len(items), "poison_items": len(poison),
                   "from_another_type": sum(p.other_type for p in poison),
                   "digest_clean": state.digest_before_eval}
        return self._ledger.poisoned(summary, self._digests.state())
