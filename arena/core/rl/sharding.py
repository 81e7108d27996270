"""Data-parallel sharded training on PyTorch FSDP2 (``fully_shard``): the pieces
:class:`~arena.core.rl.trainer.PolicyTrainer` uses when it trains across the ranks of a
``torch.distributed`` process group (``torchrun``; gloo on CPU, NCCL on GPUs).

Every rank holds a shard of each weight, its gradient and its Adam state (float32: the sharded
weights are the master copy; FSDP casts them to bf16 for the forward where mixed precision is
on). Every rank is handed the same samples; the micro-batches are cut and weighed over the whole
step, then dealt out in turn, and a rank with fewer gets zero-weight copies so that all run the
same number of forwards and backwards (FSDP's collectives would otherwise hang). Gradients are
summed across ranks, so the loss, its gradient and the step do not depend on the world size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place in the process group (rank 0 of 1 without one)."""

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def distributed(self) -> bool:
        return self.size > 1


def shard(module: torch.nn.Module, layers: Iterable[torch.nn.Module],
          compute_dtype: torch.dtype | None) -> None:
    """``fully_shard`` each decoder layer, then ``module`` (the root: embeddings, final norm and
    a tied output layer gathered together). With ``compute_dtype`` bf16 the float32 shards are
    cast for the forward and gradients reduced in float32 (FSDP's MixedPrecisionPolicy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(module, mp_policy=policy)
    # FSDP fixes each group's gradient dtypes at its first forward. Left to the first step's
    # first forward, the reference's (LoRA adapters disabled), the adapters' bf16 gradients
    # later met the float32 ones expected and the step failed (seen here; pytorch#186998 is
    # the same failure): initialise now, with the weights as they are trained.
    cast(Any, module)._get_fsdp_state()._lazy_init()


def deal(items: Sequence[T], world: World, filler: T) -> tuple[list[T], int]:
    """This rank's share of ``items`` (item i goes to rank i mod size), padded with ``filler``
    to the same count on every rank; the number of real items in the share."""
    mine = list(items[world.rank :: world.size])
    per_rank = -(-len(items) // world.size)
    return mine + [filler] * (per_rank - len(mine)), len(mine)


def all_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sums over the ranks (the values themselves without a process group)."""
    if not World.current().distributed:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object)."""
    if not World.current().distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if World.current().distributed:
        dist.barrier()


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded weight (a collective: every rank must call it), or the
    tensor itself when it is not sharded."""
    to_full = getattr(tensor, "full_tensor", None)
    return to_full() if to_full is not None else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded weight, or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor
