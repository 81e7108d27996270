"""``arena run`` under ``torchrun``: rank 0 runs the harness (plugins, environments, rollouts,
results); every other rank only trains, following rank 0's trainer call by call.

Rank 0's :class:`LeadTrainer` broadcasts each call it makes (build, step, save, load, stream
the weights) and then makes it on its own shard; :func:`follow`, the other ranks' whole life,
receives the calls and makes them on theirs. The trainer is sharded on FSDP2
(``PolicyTrainer(sharded=True)``) over a copy of the served model, whose weights rank 0
broadcasts at build (a method may have changed them before its trainer is built); after every
step and load the updated weights stream back into the served model tensor by tensor, LoRA as
adapters injected into it. A rank that dies fails the next collective: rank 0 raises
:class:`RanksLost`, naming the resume command.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from arena.core.contract.errors import RanksLost
from arena.core.rl import sharding
from arena.core.rl.data import Sample
from arena.core.rl.sharding import World
from arena.core.rl.trainer import PolicyTrainer, TrainerConfig, with_lora

#: How long a rank waits for the next call: the other ranks sit through rank 0's whole
#: evaluation (hours) between two of them. ``ARENA_RANKS_TIMEOUT_S`` overrides it.
DEFAULT_TIMEOUT_S = 7 * 24 * 3600
_STOP = "stop"


def join() -> World:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPUs); this rank's place."""
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        timeout = float(os.environ.get("ARENA_RANKS_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return World.current()


RESUME_HINT = ("The run's directory keeps everything done so far: start the same torchrun "
               "command with `-m arena.cli run --resume RUN_DIR` to continue.")


def stop_cleanly_on_sigterm() -> None:
    """Rank 0: torchrun sends SIGTERM to every rank once one has failed; end with a clear
    message (and the run directory as it is: resumable) instead of a bare kill."""
    import signal

    def stopped(signum: int, frame: Any) -> None:
        raise RanksLost(f"This rank was stopped (SIGTERM): torchrun stops every rank once one "
                        f"fails (see its report below for which). {RESUME_HINT}")

    signal.signal(signal.SIGTERM, stopped)


def release() -> None:
    """Rank 0 is done (finished or failed): let the other ranks leave, then leave the group."""
    if not dist.is_initialized():
        return
    try:
        if World.current().rank == 0:
            sharding.broadcast((_STOP, (), {}))
    except RuntimeError:
        pass  # a rank already gone: nothing to release
    finally:
        dist.destroy_process_group()


def follow() -> None:
    """The life of a rank other than 0: make each call rank 0 broadcasts until it stops."""
    trainer: PolicyTrainer | None = None
    try:
        while True:
            name, args, kwargs = sharding.broadcast(None)
            if name == _STOP:
                return
            if name == "build":
                trainer = _build(None, *args, **kwargs)
                continue
            assert trainer is not None, f"rank 0 called {name} before building a trainer"
            result = getattr(trainer, name)(*args, **kwargs)
            if name == "full_weights":
                for _ in result:  # each weight is a collective; only rank 0 keeps them
                    pass
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _build(served: Any, architecture: dict[str, Any], pad_ids: tuple[int | None, int],
           config: dict[str, Any], seed: int) -> PolicyTrainer:
    """Every rank's shard of the trainer: the model's architecture, rank 0's weights broadcast
    into it, the same seed for the LoRA adapters' initial values, then ``fully_shard``.

    ``architecture`` is the served config as saved (``to_dict``), without how rank 0 serves it:
    a backend may serve through an attention it registered in its own process only (the CPU
    backend's grouped-query attention), which another rank's transformers does not know. The
    other ranks take transformers' default; the served choice is the same numbers (its tests)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if served is not None:
        model = copy.deepcopy(served).float()
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**architecture), dtype=torch.float32)
    model = model.to(_device())
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    tokenizer = SimpleNamespace(pad_token_id=pad_ids[0], eos_token_id=pad_ids[1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PolicyTrainer(model, tokenizer, TrainerConfig.from_mapping(config), sharded=True)


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


class LeadTrainer:
    """Rank 0's trainer: the sharded trainer every rank holds, each call made in lockstep,
    the served model kept equal to the trained weights (see the module docstring)."""

    def __init__(self, backend: Any, config: TrainerConfig, *, seed: int) -> None:
        self.backend = backend
        served = backend.model
        tokenizer = backend.tokenizer
        pad_ids = (tokenizer.pad_token_id, tokenizer.eos_token_id)
        args = (served.config.to_dict(), pad_ids, config.to_dict(), seed)
        self._broadcast("build", args, {})
        self.trainer = self._guarded(lambda: _build(served, *args))
        self.config = config
        #: The served model's own weights by the trainer's names (LoRA: adapters injected into
        #: it with the trainer's settings, so the names are the same).
        self.served: Any = served
        if config.lora is not None:
            self.served = with_lora(served, config.lora)
        self._sync_served()

    # The calls the harness makes, each on every rank.

    def step(self, samples: Sequence[Sample],
             on_micro_batch: Callable[[int, int], object] | None = None) -> dict[str, float]:
        self._broadcast("step", (list(samples),), {})
        metrics = self._guarded(lambda: self.trainer.step(samples, on_micro_batch=on_micro_batch))
        if not metrics["skipped"]:
            self._sync_served()
        return metrics

    def save(self, path: Any) -> Any:
        self._broadcast("save", (str(path),), {})
        return self._guarded(lambda: self.trainer.save(path))

    def load(self, path: Any) -> None:
        self._broadcast("load", (str(path),), {})
        self._guarded(lambda: self.trainer.load(path))
        self._sync_served()

    def merge_adapters(self) -> None:
        """Learning is over: fold the served copy's adapters into its weights."""
        if self.config.lora is not None and hasattr(self.served, "merge_adapter"):
            self.served.merge_adapter()
            self.backend.mark_weights_changed()

    @property
    def model(self) -> Any:
        return self.trainer.model

    @property
    def step_count(self) -> int:
        return self.trainer.step_count

    # Internals

    def _sync_served(self) -> None:
        """Stream the trained weights into the served model, one tensor at a time."""
        self._broadcast("full_weights", (), {})
        params: Mapping[str, torch.nn.Parameter] = dict(self.served.named_parameters())

        def stream() -> None:
            with torch.no_grad():
                for name, tensor in self.trainer.full_weights():
                    params[name].copy_(tensor)

        self._guarded(stream)
        self.backend.mark_weights_changed()

    def _broadcast(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._guarded(lambda: sharding.broadcast((name, args, kwargs)))

    @staticmethod
    def _guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (RuntimeError, dist.DistBackendError) as exc:
            if "Connection closed" in str(exc) or "peer" in str(exc).lower() or isinstance(
                    exc, dist.DistBackendError):
                raise RanksLost(f"A training rank stopped ({exc}). {RESUME_HINT}") from exc
            raise
