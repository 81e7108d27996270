"""What one forward of the embedded model costs here, in float32 and in bfloat16.

    python scripts/forward_speed.py [--tokens 1 110 256] [--repeats 3]

``llm.dtype=auto`` takes bfloat16 only where the CPU computes it natively; this shows why, on
the machine at hand: a bare ``model.get_decoder()(...)`` (no cache, no output layer) over N
random tokens, the median of ``--repeats`` after one warm-up, in each dtype, and what ``auto``
resolves to. docs/numerics.md gives the figures measured with it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from arena.backends.embedded import embedded_model_dir
from arena.backends.transformers_backend import auto_dtype


def forward_ms(model: torch.nn.Module, tokens: int, repeats: int) -> float:
    ids = torch.randint(100, 1000, (1, tokens))
    decoder = model.get_decoder()
    with torch.inference_mode():
        decoder(input_ids=ids)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            decoder(input_ids=ids)
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 110, 256])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"llm.dtype=auto resolves to {auto_dtype(torch.device('cpu'))}")
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=dtype).eval()
        for tokens in args.tokens:
            print(f"{str(dtype).removeprefix('torch.'):9} {tokens:5} tokens: "
                  f"{forward_ms(model, tokens, args.repeats):7.0f} ms")


if __name__ == "__main__":
    main()
