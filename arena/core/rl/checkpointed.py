"""The trainer an RL method holds: a :class:`~arena.core.rl.trainer.PolicyTrainer` on the run's
served model, one update per iteration (its mini-batches), saved as a numbered checkpoint series
in the method's folder, resumed from the newest, and merged for serving when learning ends.

Evolving-RL, its GRPO baseline and SkillRL share it, so none of them repeats the checkpoint
lookup, the trainer's construction, or the pruning of older checkpoints.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from arena.core.contract.llm import TrainableBackend
from arena.core.rl.data import Sample, mini_batches
from arena.core.rl.ranks import LeadTrainer
from arena.core.rl.trainer import PolicyTrainer, TrainerConfig, drop_optimizer_state
from arena.core.storage.files import RunDirError, folder_bytes
from arena.core.storage.method_state import FOLDER, Checkpoints
from arena.core.storage.rundir import RunDir

#: ``progress(label)``: a context showing one update while it runs (``run.progress``).
Progress = Callable[[str], AbstractContextManager[Any]]


class CheckpointedTrainer:
    """A policy trainer whose state lives in ``checkpoints`` (see the module docstring)."""

    def __init__(self, backend: TrainableBackend, config: TrainerConfig | Mapping[str, Any],
                 checkpoints: Checkpoints, *, seed: int) -> None:
        self.backend = backend
        self.config = config if isinstance(config, TrainerConfig) else TrainerConfig.from_mapping(config)
        self.checkpoints = checkpoints
        # LoRA adapters are injected into the served model here, in place: a method whose
        # reference policy is made first (SkillRL's SFT) builds its trainer after that. Their
        # initial weights are drawn from a torch RNG seeded with ``seed`` (the learn seed), not
        # from the process's global one, whose state differs from run to run: otherwise two runs
        # of one config played identical episodes and ended with different weights.
        # Under torchrun the trainer is sharded over every rank (arena.core.rl.ranks), on a
        # copy of the served model that it streams its weights back into.
        self.trainer: PolicyTrainer | LeadTrainer
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self.trainer = LeadTrainer(backend, self.config, seed=seed)
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # A backend that caches states of the old weights drops them as a step starts (an
            # optional method, so the runtime protocol of a trainable backend is unchanged).
            self.trainer = PolicyTrainer(backend.model, backend.tokenizer, self.config,
                                         on_weights_changed=backend.mark_weights_changed,
                                         on_weights_changing=getattr(backend, "drop_cached_states", None))

    def resume(self, recorded: int, what: str = "updates") -> int:
        """Load the newest checkpoint; its number. ``recorded`` is how many the method's state
        counts: a newer checkpoint than that is fine (a kill between saving it and the state),
        an older one means the run directory lost files."""
        latest = self.checkpoints.latest()
        if latest < recorded:
            raise FileNotFoundError(
                f"No checkpoint in {self.checkpoints.folder} for the {recorded} {what} the "
                "method's state records; the run directory is incomplete. Start a new run.")
        if latest:
            self.trainer.load(self.checkpoints.path(latest))
        return latest

    def update(self, samples: Sequence[Sample], *, mini_batch_size: int | None,
               rng: random.Random | None = None, progress: Progress, label: str) -> dict[str, Any]:
        """One update: ``samples`` in mini-batches (shuffled by ``rng`` if given; whole episodes
        under ``episode-mean``), one optimizer step each; the last step's metrics with
        ``updates`` and ``time/update_s``."""
        clock = time.perf_counter()
        batches = mini_batches(samples, mini_batch_size, rng,
                               whole_episodes=self.config.aggregation == "episode-mean")
        metrics: dict[str, Any] = {}
        for number, batch in enumerate(batches, start=1):
            with progress(f"{label}: update {number}/{len(batches)}") as shown:
                metrics.update(self.trainer.step(batch, on_micro_batch=shown.update))
        metrics["updates"] = len(batches)
        metrics["time/update_s"] = time.perf_counter() - clock
        return metrics

    def save(self, number: int) -> None:
        """Checkpoint ``number`` (atomic), then drop the older ones."""
        self.trainer.save(self.checkpoints.path(number))
        self.checkpoints.prune(number)

    def serve(self) -> None:
        """Learning is over: fold LoRA adapters into the served weights (unmerged adapters make
        every evaluation forward ~1.3x slower on CPU; ``PolicyTrainer.merge_adapters``)."""
        self.trainer.merge_adapters()

    def trainable_parameters(self) -> int:
        return int(sum(p.numel() for p in self.trainer.model.parameters() if p.requires_grad))


def slim_run(run_dir: Path | str) -> list[tuple[Path, int, int]]:
    """Drop the optimizer state of every trainer checkpoint in a run whose learning has finished
    (``arena slim``): what its evaluation, resume and verification read stays. Each checkpoint
    slimmed, with its size in bytes before and after. Refused while the run is running or still
    learning, where the optimizer state is what learning resumes from."""
    run = RunDir(run_dir)
    if not run.ledger.read().learn_done:
        raise RunDirError(f"{run.path} has not finished learning: its checkpoints' optimizer state is what "
                          "learning resumes from. Run `arena slim` once its learning phase has ended.")
    slimmed = []
    with run.lock():
        for checkpoint, _ in _trainer_states(run.path):
            before = folder_bytes(checkpoint)
            if drop_optimizer_state(checkpoint):
                slimmed.append((checkpoint, before, folder_bytes(checkpoint)))
    return slimmed


def slimmed_checkpoints(run_dir: Path | str) -> list[Path]:
    """The trainer checkpoints of a run that ``arena slim`` kept without their optimizer state."""
    return [checkpoint for checkpoint, state in _trainer_states(Path(run_dir)) if state.get("optimizer", True) is False]


def _trainer_states(run_path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each trainer checkpoint in a run's method folder, with its ``trainer_state.json``."""
    states = sorted((run_path / FOLDER).rglob("trainer_state.json"))
    return [(path.parent, json.loads(path.read_text())) for path in states]
