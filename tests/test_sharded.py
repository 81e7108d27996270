"""Sharded training on FSDP2 across 2 gloo CPU ranks, against one unsharded process.

The ranks are spawned processes on the tiny Llama in float32. One step on 2 ranks must give the
loss, gradient norm and weights of the same step in one process (up to float32 summation order:
a relative 1e-4 on the figures, 1e-5 absolute on the weights after an lr-1e-3 step), with a
micro-batch count that does not divide evenly (one rank plays an idle copy, and nothing hangs),
for full fine-tuning (the KL reference sharded too) and for LoRA. A checkpoint written by 2
ranks resumes in one process and one written by one process resumes on 2 ranks, both landing on
the uninterrupted run's weights; one without its optimizer state (`arena slim`) loads on 2 ranks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from arena.core.rl import PolicyTrainer
from arena.core.rl.trainer import drop_optimizer_state
from tests.helpers.models import EVOLVING, fresh_model, make_samples

pytestmark = pytest.mark.slow

#: 7 samples in micro-batches of 3: 3 micro-batches, 2 on rank 0 and 1 (plus an idle one) on rank 1.
CONFIG = {"precision": "fp32", "entropy_coef": EVOLVING, "micro_batch_size": 3, "lr": 1e-3,
          "kl_coef": 0.01}
LORA = {**CONFIG, "lora": {"r": 4, "alpha": 8, "dropout": 0.0}}
#: Mixed precision: bf16 compute (FSDP's cast of the float32 shards; autocast in one process).
LORA_BF16 = {**LORA, "precision": "bf16"}
WORLD = 2


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from arena.backends.embedded import tiny_model_dir

    return AutoTokenizer.from_pretrained(tiny_model_dir(), local_files_only=True)


def _trainer(config: dict[str, Any], sharded: bool) -> PolicyTrainer:
    torch.manual_seed(0)  # LoRA's initial adapters, the same in every process
    return PolicyTrainer(fresh_model(), _tokenizer(), config, sharded=sharded)


def _weights(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in trainer.full_weights()}


def _scenario(sharded: bool, folder: Path, save_as: str) -> dict[str, Any]:
    """The steps both sides take: full fine-tuning (checkpointed as ``save_as`` after its first
    step), LoRA in float32 and in bf16; sharded, the figures rank 0 sees."""
    first, second = make_samples(seed=1), make_samples(seed=2)
    out: dict[str, Any] = {}
    full = _trainer(CONFIG, sharded)
    out["full_metrics"] = full.step(first)
    full.save(folder / save_as)
    out["full_after_one"] = _weights(full)
    full.step(second)
    out["full_after_two"] = _weights(full)
    lora = _trainer(LORA, sharded)
    out["lora_metrics"] = lora.step(first)
    out["lora_weights"] = _weights(lora)
    out["lora_bf16_metrics"] = _trainer(LORA_BF16, sharded).step(first)
    return out


def _ranks(rank: int, store: str, folder: str) -> None:
    """What each of the 2 ranks runs; rank 0 saves what the test compares."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        out = _scenario(True, Path(folder), "by-2-ranks")
        resumed = _trainer(CONFIG, sharded=True)
        resumed.load(Path(folder) / "by-1-process")
        assert resumed.step_count == 1
        resumed.step(make_samples(seed=2))
        out["resumed_on_2"] = _weights(resumed)
        slim = _trainer(CONFIG, sharded=True)  # `arena slim`'s checkpoint: the weights only
        slim.load(Path(folder) / "by-1-process-slim")
        out["slim_on_2"], out["slim_can_train"] = _weights(slim), slim.can_train
        if rank == 0:
            torch.save(out, Path(folder) / "ranks.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[str, Any]:
    """One process's run (and its checkpoint after step 1), then the 2-rank run."""
    folder = tmp_path_factory.mktemp("sharded")
    single = _scenario(False, folder, "by-1-process")
    shutil.copytree(folder / "by-1-process", folder / "by-1-process-slim")
    assert drop_optimizer_state(folder / "by-1-process-slim")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_ranks, args=(str(folder / "store"), str(folder)), nprocs=WORLD, join=True)
    return {"single": single, "ranks": torch.load(folder / "ranks.pt", weights_only=False),
            "folder": folder}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-5), (
            name, float((a[name] - b[name]).abs().max()))


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_step_on_two_ranks_is_the_step_in_one_process(two_ranks, mode) -> None:
    one, two = two_ranks["single"][f"{mode}_metrics"], two_ranks["ranks"][f"{mode}_metrics"]
    for key in ("loss", "grad_norm", "solver/loss", "extractor/loss", "solver/kl", "solver/entropy"):
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-9), key
    for key in ("n_tokens", "solver/n_tokens", "extractor/n_tokens", "n_samples", "step"):
        assert two[key] == one[key], key  # counted once, though 2 ranks played the shares
    assert two["skipped"] == 0 and one["grad_norm"] > 0
    if mode == "full":
        assert one["solver/kl"] == 0  # the first step starts at the reference
        _close(two_ranks["ranks"]["full_after_two"], two_ranks["single"]["full_after_two"])
    else:
        _close(two_ranks["ranks"]["lora_weights"], two_ranks["single"]["lora_weights"])
        assert all("lora_" in name for name in two_ranks["single"]["lora_weights"])


def test_mixed_precision_on_two_ranks_steps_like_one_process(two_ranks) -> None:
    """bf16 compute both ways, cast differently (FSDP casts the weights, autocast the ops): the
    same step up to bf16 rounding, not bit for bit."""
    one, two = two_ranks["single"]["lora_bf16_metrics"], two_ranks["ranks"]["lora_bf16_metrics"]
    assert two["skipped"] == 0 and two["solver/kl"] >= 0
    for key in ("loss", "grad_norm"):
        assert two[key] == pytest.approx(one[key], rel=0.05), key


def test_a_checkpoint_of_one_process_resumes_on_two_ranks(two_ranks) -> None:
    _close(two_ranks["ranks"]["resumed_on_2"], two_ranks["single"]["full_after_two"])


def test_a_checkpoint_of_two_ranks_resumes_in_one_process(two_ranks) -> None:
    resumed = _trainer(CONFIG, sharded=False)
    resumed.load(two_ranks["folder"] / "by-2-ranks")
    assert resumed.step_count == 1
    resumed.step(make_samples(seed=2))
    _close(_weights(resumed), two_ranks["single"]["full_after_two"])


def test_a_checkpoint_without_its_optimizer_state_loads_on_two_ranks(two_ranks) -> None:
    _close(two_ranks["ranks"]["slim_on_2"], two_ranks["single"]["full_after_one"])
    assert two_ranks["ranks"]["slim_can_train"] is False


def test_sharded_training_without_a_process_group_says_how_to_launch() -> None:
    with pytest.raises(ValueError, match="torchrun"):
        _trainer(CONFIG, sharded=True)
