"""Speed and memory of one RL trainer step on the embedded model (not part of the test suite).

Run: ``HF_HUB_OFFLINE=1 pytest benchmarks/bench_rl.py --benchmark-columns=mean,stddev,rounds -s``

One step = 8 samples of 512 tokens, LoRA r=16 on all linear layers, Evolving-RL's loss (KL to
the adapter-free reference, entropy penalty on the extractor), default micro-batches of 4. Each
sample is an episode: a 256-token prompt, then four rounds of a 32-token action (trained) and a
32-token observation (masked), so half of the tokens after the prompt are trained.
The base model is loaded in bfloat16 (``dtype: auto`` on a bf16 CPU) and in float32.
"""

from __future__ import annotations

import os
import resource

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from arena.backends.transformers_backend import TransformersBackend
from arena.core.rl import PolicyTrainer, Sample, Turn, assign_advantages, concat_turns

N_SAMPLES = 8
PROMPT, ACTION, OBSERVATION, ROUNDS = 256, 32, 32, 4  # 256 + 4 * 64 = 512 tokens
CONFIG = {
    "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
    "entropy_coef": {"extractor": -0.03, "solver": 0.0},
    "advantage_scale": {"extractor": 0.2, "solver": 1.0},
}


def episode(index: int, vocab: int) -> Sample:
    gen = torch.Generator().manual_seed(index)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    turns = [Turn(tokens(PROMPT), False)]
    for _ in range(ROUNDS):
        turns.append(Turn(tokens(ACTION), True, [-2.0] * ACTION))
        turns.append(Turn(tokens(OBSERVATION), False))
    role = "extractor" if index % 2 else "solver"
    return concat_turns(turns, role=role, group=role, reward=float(index % 3))


def rss_mb() -> float:
    """Current resident set size (``ru_maxrss`` only gives the peak)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_lora_step_8x512(benchmark, dtype: str) -> None:
    llm = TransformersBackend({"model": "embedded", "dtype": dtype})
    trainer = PolicyTrainer(
        llm.model, llm.tokenizer, CONFIG, on_weights_changed=llm.mark_weights_changed
    )
    samples = [episode(i, len(llm.tokenizer)) for i in range(N_SAMPLES)]
    assign_advantages(samples, CONFIG["advantage_scale"])
    assert {len(s.input_ids) for s in samples} == {PROMPT + ROUNDS * (ACTION + OBSERVATION)}

    rss_before = rss_mb()
    metrics = benchmark.pedantic(trainer.step, args=(samples,), rounds=2, warmup_rounds=1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert metrics["skipped"] == 0 and metrics["extractor/n_tokens"] > 0
    benchmark.extra_info.update(
        {
            "autocast": str(trainer.autocast_dtype),
            "threads": torch.get_num_threads(),
            "trained_tokens": metrics["n_tokens"],
            "rss_before_step_mb": round(rss_before, 1),
            "peak_rss_mb": round(peak, 1),
        }
    )
    print(
        f"\n{dtype}: autocast {trainer.autocast_dtype}, rss before {rss_before:.0f} MB, "
        f"peak rss {peak:.0f} MB, trained tokens {metrics['n_tokens']:.0f}"
    )
