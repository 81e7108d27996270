"""The GPU checks of the Evolving-RL issue, as one prepared script (run it where a GPU is lent).

1. One bf16 co-evolution iteration with the tiny test model on CUDA (transformers backend, LoRA),
   then the paired evaluation, through the real protocol.
2. The same with the vLLM rollout engine, where `vllm` imports (weights synced after the update).

    python scripts/gpu_check.py [--out DIR]

Prints one JSON report (what ran, how long, results) and exits non-zero if a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = [
    "llm.model=tiny", "llm.device=cuda", "llm.dtype=bfloat16", "embedder.name=hashing",
    "env.n_train=30", "env.n_valid=4", "env.n_test=4", "eval.limit=2", "eval.max_steps=5",
    "learn.max_steps=5", "method.iterations=1", "method.n_sources=2", "method.n_skills=2",
    "method.k_downstream=2", "method.extractor_max_tokens=32", "method.trainer.precision=bf16",
]


def check(name: str, overrides: list[str], out: Path) -> dict:
    from arena.core import protocol

    started = time.perf_counter()
    try:
        path, results = protocol.run("evolving_rl", overrides=overrides, out=out / name)
        state = json.loads((path / "state.json").read_text())["evolving_rl"]
        return {
            "check": name, "ok": bool(results["valid"]),
            "wall_s": round(time.perf_counter() - started, 1),
            "gradient_steps": results["learn"]["used"]["gradient_steps"],
            "iteration_metrics": state["metrics"],
            "success": {s: results["splits"][s]["success_rate"] for s in results["splits"]},
            "model": results["provenance"]["model"],
        }
    except Exception:  # report every check, whatever happens to one
        return {"check": name, "ok": False, "wall_s": round(time.perf_counter() - started, 1),
                "error": traceback.format_exc(limit=8)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="arena-gpu-"))
    import torch

    report: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "checks": []}
    if not torch.cuda.is_available():
        report["error"] = "no CUDA device visible to torch"
        print(json.dumps(report, indent=2))
        return 1
    report["device"] = torch.cuda.get_device_name(0)
    report["bf16"] = torch.cuda.is_bf16_supported()
    report["checks"].append(check("transformers_bf16", TINY, out))
    if importlib.util.find_spec("vllm") is not None:
        report["checks"].append(check("vllm_bf16", TINY + ["llm.backend=vllm"], out))
    else:
        report["checks"].append({"check": "vllm_bf16", "ok": None, "skipped": "vllm not installed"})
    print(json.dumps(report, indent=2, default=str))
    return 0 if all(c["ok"] is not False for c in report["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
