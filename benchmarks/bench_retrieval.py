"""Retrieval at scale: k=5 latency at 10k and 100k stored items, and MiniLM throughput.

Not part of the test suite. The goal is p95 <= 5 ms for a k=5 query at 100k items; each
benchmark records ``p50_ms``, ``p95_ms`` and ``goal_met`` in its ``extra_info`` (shown with
``--benchmark-json``) and prints them. Run:

    # 10k and the embedder (about 1.5 minutes on 2 cores)
    python -m pytest benchmarks/bench_retrieval.py --benchmark-only -q -s -k "10k or minilm"
    # 100k (filling the store takes 1.5 to 3 minutes of CPU)
    python -m pytest benchmarks/bench_retrieval.py --benchmark-only -q -s -k 100k

Stores are filled with precomputed random unit vectors (``ExperienceStore.add(embeddings=...)``)
so filling costs no model time; random 384-d vectors have no cluster structure, the hard case
for the HNSW index. Queries are embedded by the hashing embedder (tens of microseconds), so the
figures are the store's own cost. The layout is MemRL's: one intent per five items, four
memories filed under it, so the two-phase retrieval is measured on the same store.
"""

from __future__ import annotations

import os
import time
import types
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from omegaconf import OmegaConf

from arena.core.contract.types import Experience, Provenance
from arena.core.services.embedder import HashingEmbedder, MiniLMEmbedder
from arena.core.services.store import ExperienceStore
from arena.plugins.memrl.method import INTENT, MEMORY, MemRL

DIM = 384  # MiniLM's dimension: the vectors a default run stores
SIZES = {"10k": 10_000, "100k": 100_000}
GOAL_P95_MS = 5.0
ROUNDS = 300
OBJECTS = ("apple", "mug", "plate", "knife", "book", "lamp", "towel", "egg", "cd", "pen", "potato")
PLACES = ("fridge", "sinkbasin", "microwave", "desk", "shelf", "drawer", "countertop", "cabinet")
VERBS = ("put a hot", "put a cool", "clean some", "put some", "find two", "examine the")


def goal(i: int) -> str:
    return f"{VERBS[i % 6]} {OBJECTS[(i // 6) % 11]} in {PLACES[(i // 66) % 8]} {i // 528}."


def memrl_layout(n: int) -> list[Experience]:
    """Every fifth item an intent, the four after it its memories."""
    rng = np.random.default_rng(1)
    items: list[Experience] = []
    intent_id = ""
    for i in range(n):
        provenance = Provenance((f"train-{i // 5}",), "train")
        if i % 5 == 0:
            members = [f"memory-{j:07d}" for j in range(i + 1, min(i + 5, n))]
            intent = Experience(INTENT, goal(i // 5), provenance,
                                {"task_type": VERBS[i % 6], "memory_ids": members},
                                experience_id=f"intent-{i:07d}")
            intent_id = intent.experience_id
            items.append(intent)
        else:
            items.append(Experience(
                MEMORY, f"SUCCESSFUL experience {i}. Script: 1. go to {PLACES[i % 8]} 2. take it",
                provenance, {"intent_id": intent_id, "q_value": float(rng.uniform(-1, 1)),
                             "visits": int(i % 4), "success": bool(i % 2)},
                experience_id=f"memory-{i:07d}"))
    return items


@pytest.fixture(scope="module", params=list(SIZES))
def big_store(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> ExperienceStore:
    n = SIZES[request.param]
    store = ExperienceStore(tmp_path_factory.mktemp(f"store-{request.param}") / "store",
                            HashingEmbedder(dim=DIM))
    vectors = np.random.default_rng(0).normal(size=(n, DIM)).astype(np.float32)
    items = memrl_layout(n)
    started = time.perf_counter()
    chunk = 20_000
    for start in range(0, n, chunk):
        store.add(items[start:start + chunk], embeddings=vectors[start:start + chunk])
    print(f"\nfilled {n} items in {time.perf_counter() - started:.1f} s")
    assert store.count() == n
    return store


def latency(benchmark, call, label: str, goal_ms: float | None = GOAL_P95_MS) -> None:
    """Time ``call(round)`` once per round; record wall and CPU p50/p95 in milliseconds.

    CPU time (this process, all threads) is kept beside wall time because the 2 cores are often
    shared: under load wall time measures the neighbours as much as the store.
    """
    rounds = iter(range(10**9))
    cpu_ms: list[float] = []

    def timed() -> None:
        started = time.process_time()
        call(next(rounds))
        cpu_ms.append((time.process_time() - started) * 1000.0)

    benchmark.pedantic(timed, rounds=ROUNDS, iterations=1, warmup_rounds=5)
    times_ms = np.array(benchmark.stats.stats.data) * 1000.0
    p50, p95 = float(np.percentile(times_ms, 50)), float(np.percentile(times_ms, 95))
    cpu50, cpu95 = (float(np.percentile(cpu_ms[-ROUNDS:], q)) for q in (50, 95))
    benchmark.extra_info.update(p50_ms=round(p50, 3), p95_ms=round(p95, 3),
                                cpu_p50_ms=round(cpu50, 3), cpu_p95_ms=round(cpu95, 3),
                                load_average_1min=round(os.getloadavg()[0], 2))
    goal_text = ""
    if goal_ms is not None:
        benchmark.extra_info.update(goal_p95_ms=goal_ms, goal_met=p95 <= goal_ms)
        goal_text = f" (goal p95 <= {goal_ms} ms: {'met' if p95 <= goal_ms else 'NOT met'})"
    print(f"\n{label}: p50 {p50:.2f} ms, p95 {p95:.2f} ms{goal_text}; "
          f"CPU p50 {cpu50:.2f} ms, p95 {cpu95:.2f} ms; load {os.getloadavg()[0]:.1f}")


def test_query_k5(benchmark, big_store: ExperienceStore) -> None:
    def query(i: int) -> None:
        assert len(big_store.query(goal(i * 7919), 5)) == 5

    latency(benchmark, query, f"query k=5 at {big_store.count()}")


def test_query_k5_kind_filter(benchmark, big_store: ExperienceStore) -> None:
    def query(i: int) -> None:
        found = big_store.query(goal(i * 7919), 5, kind=INTENT)
        assert len(found) == 5 and all(e.kind == INTENT for e, _ in found)

    latency(benchmark, query, f"query k=5 kind=intent at {big_store.count()}")


def test_memrl_two_phase_retrieve(benchmark, big_store: ExperienceStore) -> None:
    """Phase A (k1 = 5 intents) + phase B (their 20 memories ranked, top 3), defaults otherwise."""
    method_cfg = OmegaConf.load(Path(__file__).parents[1] / "arena/plugins/memrl/config.yaml").method
    method_cfg.sim_threshold = -1.0  # random vectors: recall the k1 nearest whatever they score
    cfg = OmegaConf.create({"method": method_cfg, "learn": {"seed": 0}})
    run = types.SimpleNamespace(cfg=cfg, store=big_store, phase="evaluate", track="frozen")
    method = MemRL(run)  # type: ignore[arg-type]
    task = types.SimpleNamespace(task_id="t", goal="")

    def retrieve(i: int) -> None:
        task.goal = goal(i * 7919)
        assert len(method.retrieve(run, task)) == 3  # type: ignore[arg-type]

    latency(benchmark, retrieve, f"MemRL retrieve at {big_store.count()}")


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder(cache_size=0)  # no cache: every call really encodes
    embedder.embed(["load the model outside the measurement"])
    return embedder


def test_minilm_throughput_task_texts(benchmark, minilm: MiniLMEmbedder) -> None:
    texts = [goal(i) for i in range(512)]
    vectors = benchmark.pedantic(minilm.embed, args=(texts,), rounds=3, iterations=1)
    assert vectors.shape == (len(texts), DIM)
    per_second = len(texts) / benchmark.stats.stats.median
    benchmark.extra_info["texts_per_s"] = round(per_second, 1)
    print(f"\nMiniLM: {per_second:.0f} task texts/s (batch {minilm.batch_size})")


def test_minilm_single_query(benchmark, minilm: MiniLMEmbedder) -> None:
    """What a retrieval pays to embed a new task text (the cache misses once per task)."""
    latency(benchmark, lambda i: minilm.embed([goal(i)]), "MiniLM one text", goal_ms=None)
