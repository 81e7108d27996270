"""Experience-store costs a run pays: bulk add, k=5 retrieval, digest at 1,000 items.

Not part of the test suite. Run with:
    python -m pytest benchmarks/bench_store.py --benchmark-only -q

Adds use the hashing embedder so the figures are the store's own cost; one benchmark times
MiniLM encoding of the same 1,000 texts for comparison.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from arena.core.contract.types import Experience, Provenance
from arena.core.services.embedder import HashingEmbedder, MiniLMEmbedder
from arena.core.services.store import ExperienceStore

N_ITEMS = 1_000
TASK_TYPES = ("pick", "clean", "heat", "cool", "examine", "pick_two")
OBJECTS = ("apple", "mug", "plate", "knife", "book", "lamp", "towel", "egg", "cd", "pen")
PLACES = ("fridge", "sink", "microwave", "desk", "shelf", "drawer", "countertop", "cabinet")


def make_experiences(n: int) -> list[Experience]:
    """Varied insight-sized texts with the metadata methods typically keep."""
    experiences = []
    for i in range(n):
        thing, place = OBJECTS[i % len(OBJECTS)], PLACES[(i // 3) % len(PLACES)]
        text = (
            f"Insight {i}: to handle the {thing}, first look in the {place}; "
            f"take it, then go to the target receptacle before using it."
        )
        experiences.append(
            Experience(
                kind="insight" if i % 4 else "skill",
                text=text,
                provenance=Provenance((f"train-{i % 200}",), "train"),
                metadata={
                    "task_type": TASK_TYPES[i % len(TASK_TYPES)],
                    "q": i / n,
                    "votes": [i % 3],
                },
            )
        )
    return experiences


@pytest.fixture(scope="module")
def items() -> list[Experience]:
    return make_experiences(N_ITEMS)


@pytest.fixture(scope="module")
def filled_store(
    tmp_path_factory: pytest.TempPathFactory, items: list[Experience]
) -> ExperienceStore:
    store = ExperienceStore(tmp_path_factory.mktemp("filled") / "store", HashingEmbedder())
    store.add(items)
    return store


def test_add_1000(benchmark, tmp_path: Path, items: list[Experience]) -> None:
    folders = (tmp_path / f"store-{i}" for i in itertools.count())

    def setup() -> tuple[tuple[ExperienceStore, list[Experience]], dict]:
        return (ExperienceStore(next(folders), HashingEmbedder()), items), {}

    benchmark.pedantic(lambda store, batch: store.add(batch), setup=setup, rounds=5)


def test_query_k5(benchmark, filled_store: ExperienceStore) -> None:
    result = benchmark(filled_store.query, "how do I heat the mug in the microwave", 5)
    assert len(result) == 5


def test_query_k5_filtered(benchmark, filled_store: ExperienceStore) -> None:
    result = benchmark(
        filled_store.query, "how do I heat the mug", 5, kind="insight", task_type="heat"
    )
    assert result and all(e.metadata["task_type"] == "heat" for e, _ in result)


def test_digest_1000(benchmark, filled_store: ExperienceStore) -> None:
    assert filled_store.count() == N_ITEMS
    benchmark(filled_store.digest)


def test_minilm_embed_1000(benchmark, items: list[Experience]) -> None:
    embedder = MiniLMEmbedder(cache_size=0)  # no cache: every round really encodes
    embedder.embed(["load the model outside the measurement"])
    texts = [experience.text for experience in items]
    vectors = benchmark.pedantic(embedder.embed, args=(texts,), rounds=3)
    assert vectors.shape == (N_ITEMS, embedder.dim)
