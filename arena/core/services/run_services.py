"""What a run lends its method: the LLM (and any auxiliary one), the embedder, the experience
store as the phase allows it, and progress display. Built lazily, closed by the harness."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arena.core.contract.errors import NotTrainable
from arena.core.contract.llm import LLMBackend, TrainableBackend, WrappingBackend
from arena.core.services.fine_tune import FineTunes, checked
from arena.core.services.progress import ProgressTask, Reporter, complete
from arena.core.storage.method_state import FOLDER, confined

if TYPE_CHECKING:
    from arena.core.rl.checkpointed import CheckpointedTrainer
    from arena.core.services.embedder import Embedder
    from arena.core.services.store import ExperienceStore
    from arena.core.storage.method_state import Checkpoints

USAGE_KEYS = ("llm_calls", "tokens_in", "tokens_out")


class GuardedStore:
    """The run's experience store as methods see it: writable while learning, frozen otherwise.

    It is one object for the whole run, so a method that kept a reference from the learning phase
    is still refused (and the run marked invalid) when it writes during frozen evaluation. The
    files it writes or reads for the method (``snapshot``, ``restore``) are in the method's
    ``folder`` only: the harness writes there with its own rights (a snapshot to
    ``../eval_salt`` would replace the run's secret salt).
    """

    def __init__(self, store: ExperienceStore, frozen: Callable[[], bool], folder: Path) -> None:
        self._store = store
        self._view = store.read_only()
        self._frozen = frozen
        self._folder = Path(folder)

    @property
    def violations(self) -> list[str]:
        return [f"{v.operation} {', '.join(v.ids)}" for v in self._view.violations]

    def __getattr__(self, name: str) -> Any:
        target = self._view if self._frozen() else self._store
        return getattr(target, name)

    def snapshot(self, path: str | Path) -> Path:
        """Write the store to ``path`` in the method's folder (relative: in that folder);
        :class:`~arena.core.storage.method_state.OutsideFolder` for a path outside it."""
        self._folder.mkdir(parents=True, exist_ok=True)
        target = confined(self._folder, path, "Store snapshot")
        return self._store.snapshot(target, within=self._folder.resolve())

    def restore(self, path: str | Path) -> None:
        """Replace the store with a snapshot in the method's folder (refused when frozen)."""
        target = confined(self._folder, path, "Store snapshot")
        (self._view if self._frozen() else self._store).restore(target)


class Services:
    """The run's LLM, auxiliary LLMs, embedder, store and progress display."""

    def __init__(
        self,
        llm: LLMBackend,
        *,
        store_path: Path,
        make_embedder: Callable[[], Embedder],
        make_store: Callable[[Embedder, Callable[[ExperienceStore, list[str]], None]], ExperienceStore],
        before_store_write: Callable[[ExperienceStore, list[str]], None],
        frozen: Callable[[], bool],
        make_backend: Callable[[Mapping[str, Any]], LLMBackend] | None = None,
        reporter: Reporter | None = None,
        method_folder: Path | None = None,
    ) -> None:
        self.llm = llm
        self._store_path = store_path
        #: Where the store writes for the method (its snapshots): the run's ``method/`` folder.
        self._method_folder = method_folder if method_folder is not None else store_path.parent / FOLDER
        self._make_embedder = make_embedder
        self._make_store = make_store
        self._before_store_write = before_store_write
        self._frozen = frozen
        self._make_backend = make_backend
        self._reporter: Reporter = complete(reporter)
        served: Any = llm
        while isinstance(served, WrappingBackend):
            served = served.inner
        served.on_generated = self._reporter.generation  # long generations show on the phase's line
        self._auxiliary: list[LLMBackend] = []
        self._embedder: Embedder | None = None
        self._store: GuardedStore | None = None
        self._raw_store: ExperienceStore | None = None
        self._trainer: CheckpointedTrainer | None = None
        self._fine_tunes = FineTunes(self._method_folder)
        self._lock = threading.Lock()

    # -- lazily built ------------------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        with self._lock:  # episodes in threads may ask at once; build one
            if self._embedder is None:
                self._embedder = self._make_embedder()
            return self._embedder

    @property
    def store(self) -> GuardedStore:
        embedder = self.embedder
        with self._lock:
            if self._store is None:
                self._raw_store = self._make_store(embedder, self._before_store_write)
                self._store = GuardedStore(self._raw_store, self._frozen, self._method_folder)
            return self._store

    def raw_store(self) -> ExperienceStore:
        """The harness's own handle on the store, writable whatever the phase (undo, digests)."""
        self.store  # noqa: B018 - builds it
        assert self._raw_store is not None
        return self._raw_store

    def has_store(self) -> bool:
        """Whether the store was opened in this session."""
        return self._store is not None

    def store_exists(self) -> bool:
        """Whether the run has a store: opened in this session, or left on disk by an earlier one."""
        return self.has_store() or self._store_path.exists()

    def progress(self, label: str, total: int | None = None) -> ProgressTask:
        return ProgressTask(self._reporter, label, total)

    @property
    def reporter(self) -> Reporter:
        """The harness's progress display (it reports every episode played, step by step)."""
        return self._reporter

    # -- models ------------------------------------------------------------------------------

    def auxiliary_llm(self, settings: Mapping[str, Any]) -> LLMBackend:
        """Another backend for the method (a teacher, say), from ``settings`` (``backend:`` and
        that backend's keys over its defaults). Its calls count in the run's costs and budget;
        the harness closes it when the run ends."""
        if self._make_backend is None:
            raise RuntimeError("This run was built without a backend factory; no auxiliary LLM.")
        backend = self._make_backend(settings)
        with self._lock:
            self._auxiliary.append(backend)
        return backend

    def trainable(self, hint: str = "") -> TrainableBackend:
        """The served model's backend, for in-process training; :class:`NotTrainable` (naming
        the fix) where the backend serves no such model (an API, a fake)."""
        backend: Any = self.llm
        while isinstance(backend, WrappingBackend) and not isinstance(backend, TrainableBackend):
            backend = backend.inner
        if not isinstance(backend, TrainableBackend):
            raise NotTrainable(
                f"Backend '{type(backend).__name__}' serves no model to train in-process. Use "
                f"llm.backend=transformers or llm.backend=vllm{hint}.")
        return backend

    def policy_trainer(self, settings: Mapping[str, Any], checkpoints: Checkpoints, *, seed: int,
                       hint: str = "") -> CheckpointedTrainer:
        """The run's checkpointed policy trainer on the served model, built once (LoRA adapters go
        into the model as it is built); asked again, the same one, and with other settings an
        error: a run trains its served model with one trainer."""
        from arena.core.rl.checkpointed import CheckpointedTrainer
        from arena.core.rl.trainer import TrainerConfig

        config = TrainerConfig.from_mapping(settings)
        with self._lock:
            if self._trainer is None:
                self._trainer = CheckpointedTrainer(self.trainable(hint), config, checkpoints, seed=seed)
            elif self._trainer.config != config:
                raise ValueError("run.trainer was asked for a second trainer with other settings; a run "
                                 "trains its served model with one trainer.")
            return self._trainer

    def fine_tune(self, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any], *, seed: int, label: str,
                  hint: str = "") -> dict[str, float]:
        """A supervised fine-tune of the served model on ``rows`` (prompt/completion dicts),
        with ``settings`` (``arena.rl.sft.train_sft``'s keys), shown as ``label``; kept in the
        method's folder and restored by every later session (:mod:`.fine_tune`). Before
        ``policy_trainer`` only: the trainer takes the model as it is built as its reference."""
        with self._lock:
            if self._trainer is not None:
                raise RuntimeError("run.fine_tune was asked for after run.trainer: fine-tune first, then "
                                   "build the trainer, whose reference policy is the model as it is built.")
        plain_rows, plain_settings = checked(rows, settings)
        backend = self.trainable(hint)
        with self.progress(label, total=int(plain_settings["steps"])) as shown:
            return self._fine_tunes.train(backend, plain_rows, plain_settings, seed=seed, on_step=shown.update)

    def restore_fine_tunes(self) -> int:
        """Serve the fine-tunes kept in the method's folder (a resumed or continued run), before
        the method is built; how many. A run with none never loads the model for it."""
        return self._fine_tunes.restore(lambda: self.trainable(" (the run's method folder keeps fine-tuned "
                                                               "weights: resume it with the backend it ran on)"))

    def usage(self) -> dict[str, int]:
        """Calls and tokens of the run's LLM and of every auxiliary one, in this process."""
        with self._lock:
            backends = [self.llm, *self._auxiliary]
        totals = dict.fromkeys(USAGE_KEYS, 0)
        for backend in backends:
            for key, value in backend.usage.snapshot().items():
                totals[key] += int(value)
        return totals

    def tokens(self) -> int:
        usage = self.usage()
        return usage["tokens_in"] + usage["tokens_out"]

    def close(self) -> None:
        """Close the auxiliary backends, the run's LLM and the experience store."""
        with self._lock:
            backends, self._auxiliary = [*self._auxiliary, self.llm], []
            store, self._store, self._raw_store = self._raw_store, None, None
        for backend in backends:
            backend.close()
        if store is not None:
            store.close()
