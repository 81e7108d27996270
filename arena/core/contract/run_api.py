"""What a method may call on its run: the :class:`Run` protocol, and the episode request types.

The harness hands every method hook a :class:`~arena.core.execution.context.RunContext`; a method is
typed against :class:`Run`, which names only what methods use (the built-in plugins, the
example plugin and the ``arena new-method`` template), so the context's parts and harness-only
calls stay free to change. The public names are re-exported by :mod:`arena.api` (and ``arena``).

This module is the bottom of the run's layers: at run time it imports the plain types only
(``Task``, ``Experience``, ``Policy``), no implementation, so ``episodes``, ``steps``,
``context`` and ``hookspecs`` can all type against it without an import cycle
(``tests/test_architecture.py`` checks both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, overload

from arena.core.contract.types import Experience, Policy, Task

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from arena.core.contract.llm import LLMBackend, TrainableBackend
    from arena.core.contract.settings import Sampling, Settings
    from arena.core.contract.types import EpisodeResult, Trajectory
    from arena.core.execution.views import EnvironmentView
    from arena.core.rl.checkpointed import CheckpointedTrainer
    from arena.core.services.embedder import Embedder
    from arena.core.services.progress import ProgressTask
    from arena.core.storage.method_state import MethodState

__all__ = ["DEPRECATED_NAMES", "STANDARD", "BudgetView", "EpisodeRequest", "PolicyChoice", "Run", "Store",
           "protocol_names"]

#: ``EpisodeRequest(..., policy=STANDARD)``: the harness's standard solver, not the method's ``solve``.
STANDARD: Final = "standard"
PolicyChoice = Policy | Literal["standard"] | None


@dataclass
class EpisodeRequest:
    """One episode for :meth:`Run.play`: which task, with what, played by whom.

    Inside a method's ``solve``, a request for the task being solved (same variant, no seed, or
    the seed ``solve`` was given) is that episode itself: played under the harness's rules and
    returned, not recorded (the harness records what ``solve`` returns). Any other request is an
    episode of its own, recorded (``record=False`` while learning records it later with
    :meth:`Run.record`)."""

    task: Task
    experiences: list[Experience] = field(default_factory=list)
    #: The run seed of a new episode; None only for the episode a ``solve`` is playing.
    seed: int | None = None
    variant: str = "default"
    #: Sampling of a standard-solver episode (``temperature``, ``top_p``); None: the phase's
    #: (e.g. a learning method's held-out check decoded as evaluation decodes).
    sampling: Mapping[str, float] | None = None
    #: Who plays it: None, the method's ``solve``; ``"standard"``; or a policy of the method's.
    policy: PolicyChoice = None
    #: A step limit of the episode's own (with a policy); None: the phase's.
    max_steps: int | None = None
    #: Whether ``run.play`` records the episode (a new episode; at evaluation always).
    record: bool = True

    def __post_init__(self) -> None:
        # Plain data, whatever mapping was given (``run.cfg.eval.sampling`` is a config section),
        # so a request crosses to the harness from an isolated worker as it is.
        if self.sampling is not None:
            self.sampling = {str(key): float(value) for key, value in self.sampling.items()}
        self.experiences = list(self.experiences)


class Store(Protocol):
    """``run.store``: the experience store as a method sees it (writes refused when frozen)."""

    def add(self, experiences: list[Experience], *, index_texts: Sequence[str] | None = None,
            embeddings: Any = None) -> None: ...
    def all(self, kind: str | None = None, where: dict[str, Any] | None = None) -> list[Experience]: ...
    def get(self, ids: Iterable[str]) -> list[Experience]: ...
    def count(self, kind: str | None = None) -> int: ...
    def query(self, text: str, k: int, *, kind: str | None = None, task_type: str | None = None,
              source_split: str | None = None, where: dict[str, Any] | None = None,
              min_similarity: float | None = None,
              exclude_source_tasks: Iterable[str] | None = None) -> list[tuple[Experience, float]]: ...
    def query_vector(self, vector: Any, k: int, **filters: Any) -> list[tuple[Experience, float]]: ...
    def update_metadata(self, experience_id: str, changes: dict[str, Any]) -> None: ...
    def update_metadata_many(self, changes: Mapping[str, dict[str, Any]]) -> None: ...
    def delete(self, ids: Iterable[str]) -> None: ...
    def snapshot(self, path: str | Path) -> Path: ...


class BudgetView(Protocol):
    """``run.budget``: the learning limits and their use, read-only (``run.charge`` adds)."""

    @property
    def limits(self) -> Mapping[str, int | None]: ...
    @property
    def used(self) -> Mapping[str, int]: ...
    def left(self, key: str) -> int | None: ...
    def exhausted(self) -> list[str]: ...


#: Ways to play of Arena 0.2 that an in-process method may still call (run.play(request) since 0.3).
DEPRECATED_NAMES: Final = frozenset({"play_many", "play_policy", "standard_solve"})


def protocol_names(*protocols: type) -> frozenset[str]:
    """The public names a protocol (or ABC) declares in its own body and its bases'."""
    names: set[str] = set()
    for protocol in protocols:
        for klass in protocol.__mro__:
            if klass.__module__ in ("typing", "builtins", "abc"):
                continue
            names.update(name for name in vars(klass) if not name.startswith("_"))
    return frozenset(names)


class Run(Protocol):
    """What a method hook's ``run`` offers a method: exactly these members, documented one by one
    in ``docs/plugin_hooks.md`` (``tests/test_docs.py`` keeps the two equal). One way to play an
    episode: ``play`` with an :class:`EpisodeRequest` (or several); the ways before it
    (``play(task, ...)``, ``play_many``, ``play_policy``, ``standard_solve``) still work for a
    method in the harness's process, with a ``DeprecationWarning`` (:data:`DEPRECATED_NAMES`),
    and are not offered to an isolated one."""

    # -- configuration and phase ---------------------------------------------------------------
    @property
    def cfg(self) -> DictConfig: ...
    @property
    def phase(self) -> str: ...
    @property
    def track(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def learn_seed(self) -> int: ...
    @property
    def learn_split(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def env_name(self) -> str: ...
    def learning_finished(self) -> bool: ...

    # -- services ------------------------------------------------------------------------------
    @property
    def llm(self) -> LLMBackend: ...
    @property
    def embedder(self) -> Embedder: ...
    @property
    def store(self) -> Store: ...
    @property
    def env(self) -> EnvironmentView: ...
    @property
    def budget(self) -> BudgetView: ...
    @property
    def method_state(self) -> MethodState: ...
    def has_store(self) -> bool: ...
    def store_exists(self) -> bool: ...
    def progress(self, label: str, total: int | None = None) -> ProgressTask: ...
    def auxiliary_llm(self, settings: Mapping[str, Any]) -> LLMBackend: ...
    def trainable_backend(self, hint: str = "") -> TrainableBackend: ...
    def fine_tune(self, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any],
                  hint: str = "") -> dict[str, float]: ...
    def trainer(self, settings: Mapping[str, Any], hint: str = "") -> CheckpointedTrainer: ...

    # -- tasks and episodes --------------------------------------------------------------------
    def tasks(self, split: str) -> list[Task]: ...
    def source_pool(self) -> list[Task]: ...
    def experience_task(self, task: Task) -> Task | None: ...
    def sampling(self) -> Sampling: ...
    @overload
    def play(self, request: EpisodeRequest, *, on_done: Callable[[], object] | None = None) -> Trajectory: ...
    @overload
    def play(self, request: Sequence[EpisodeRequest], *,
             on_done: Callable[[], object] | None = None) -> list[Trajectory]: ...
    def play(self, request: EpisodeRequest | Sequence[EpisodeRequest], *,
             on_done: Callable[[], object] | None = None) -> Trajectory | list[Trajectory]: ...
    def record(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult: ...
    def finished(self, task: Task, seed: int, variant: str = "default") -> EpisodeResult | None: ...
    def recorded_trajectory(self, task: Task, seed: int,
                            variant: str = "default") -> Trajectory | None: ...
    def current_seed(self) -> int: ...
    def keep_rollouts(self) -> None: ...
    def discard_rollouts(self) -> None: ...

    # -- learning ------------------------------------------------------------------------------
    def experience_loop(self) -> None: ...
    def charge(self, **amounts: int) -> None: ...
    def budget_exhausted(self) -> list[str]: ...
    def refresh_token_usage(self) -> None: ...
    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None: ...
