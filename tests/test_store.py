"""Experience store and embedders: filters, freezing, digests, persistence, size accounting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from arena.core.contract.types import Experience, Provenance
from arena.core.services.embedder import (
    HashingEmbedder,
    MeanPoolingEncoder,
    MiniLMEmbedder,
    make_embedder,
)
from arena.core.services.store import ExperienceStore, FrozenStoreError, WriteViolation


def experience(
    text: str,
    kind: str = "insight",
    split: str = "train",
    task_ids: tuple[str, ...] = ("t1",),
    **metadata: object,
) -> Experience:
    return Experience(
        kind=kind, text=text, provenance=Provenance(task_ids, split), metadata=metadata
    )


@pytest.fixture
def store() -> ExperienceStore:
    return ExperienceStore(None, HashingEmbedder())


@pytest.fixture
def filled(store: ExperienceStore) -> ExperienceStore:
    store.add(
        [
            experience("put the apple in the fridge", task_type="pick", q=0.5),
            experience("heat the mug in the microwave", task_type="heat"),
            experience("open the fridge then take the apple", kind="skill", task_type="pick"),
            experience("apple goes in the fridge", split="valid", task_type="pick"),
        ]
    )
    return store


def test_add_then_get_round_trips_provenance_and_metadata(store: ExperienceStore) -> None:
    original = experience(
        "clean the plate in the sink",
        task_ids=("t7", "t9"),
        task_type="clean",
        q=0.25,
        votes=3,
        useful=True,
        tags=["sink", "plate"],
        stats={"seen": 2, "won": [1, 0]},
        note=None,
    )
    store.add([original])
    [loaded] = store.get([original.experience_id])
    assert loaded == original
    assert loaded.provenance.source_task_ids == ("t7", "t9")
    assert loaded.provenance.source_split == "train"


def test_get_keeps_requested_order_and_skips_unknown_ids(filled: ExperienceStore) -> None:
    ids = [item.experience_id for item in filled.all()]
    loaded = filled.get([ids[2], "missing", ids[0]])
    assert [item.experience_id for item in loaded] == [ids[2], ids[0]]


def test_add_upserts_by_experience_id(store: ExperienceStore) -> None:
    first = experience("put the apple in the fridge", q=0.1)
    store.add([first])
    reworded = Experience(
        first.kind, "reworded text", first.provenance, {"q": 0.9}, first.experience_id
    )
    store.add([reworded])
    assert store.count() == 1
    [loaded] = store.get([first.experience_id])
    assert loaded.text == "reworded text"
    assert loaded.metadata == {"q": 0.9}


def test_reserved_metadata_keys_are_rejected(store: ExperienceStore) -> None:
    with pytest.raises(ValueError, match="reserved"):
        store.add([experience("x", kind="insight", source_split="test")])


def test_all_is_sorted_by_id_and_filters_by_kind_and_where(filled: ExperienceStore) -> None:
    ids = [item.experience_id for item in filled.all()]
    assert ids == sorted(ids) and len(ids) == 4
    assert [item.kind for item in filled.all(kind="skill")] == ["skill"]
    assert {item.text for item in filled.all(where={"task_type": "heat"})} == {
        "heat the mug in the microwave"
    }
    assert len(filled.all(kind="insight", where={"task_type": "pick"})) == 2


def test_query_ranks_by_similarity_and_applies_filters(filled: ExperienceStore) -> None:
    results = filled.query("apple fridge", k=10)
    assert len(results) == 4
    scores = [score for _, score in results]
    assert scores == sorted(scores, reverse=True)
    assert results[-1][0].text == "heat the mug in the microwave"
    assert all(-1.0 <= score <= 1.0 + 1e-6 for score in scores)

    assert {e.kind for e, _ in filled.query("apple", k=10, kind="skill")} == {"skill"}
    assert {e.metadata["task_type"] for e, _ in filled.query("apple", k=10, task_type="pick")} == {
        "pick"
    }
    valid = filled.query("apple", k=10, source_split="valid")
    assert [e.provenance.source_split for e, _ in valid] == ["valid"]
    combined = filled.query("apple", k=10, kind="insight", task_type="pick", source_split="train")
    assert [e.text for e, _ in combined] == ["put the apple in the fridge"]
    assert filled.query("apple", k=10, where={"q": {"$gt": 0.4}})[0][0].metadata["q"] == 0.5
    assert len(filled.query("apple", k=2)) == 2
    assert filled.query("apple", k=0) == []


def test_query_on_empty_store_returns_nothing(store: ExperienceStore) -> None:
    assert store.query("anything", k=5) == []


def test_identical_text_scores_one(filled: ExperienceStore) -> None:
    [(best, score)] = filled.query("heat the mug in the microwave", k=1)
    assert best.text == "heat the mug in the microwave"
    assert score == pytest.approx(1.0, abs=1e-5)


def test_update_metadata_merges_and_keeps_text(filled: ExperienceStore) -> None:
    [target] = filled.all(where={"q": 0.5})
    filled.update_metadata(target.experience_id, {"q": 0.75, "history": [0.5, 0.75]})
    [loaded] = filled.get([target.experience_id])
    assert loaded.metadata == {"task_type": "pick", "q": 0.75, "history": [0.5, 0.75]}
    assert loaded.text == target.text
    filled.update_metadata(target.experience_id, {"history": 2})
    assert filled.get([target.experience_id])[0].metadata["history"] == 2
    with pytest.raises(KeyError):
        filled.update_metadata("missing", {"q": 1.0})


def test_delete_and_count(filled: ExperienceStore) -> None:
    assert filled.count() == 4
    assert filled.count(kind="skill") == 1
    [skill] = filled.all(kind="skill")
    filled.delete([skill.experience_id, "missing"])
    assert filled.count() == 3
    assert filled.count(kind="skill") == 0
    assert filled.get([skill.experience_id]) == []


def test_digest_changes_on_every_write(filled: ExperienceStore) -> None:
    seen = {filled.digest()}
    filled.add([experience("a brand new insight")])
    seen.add(filled.digest())
    [target] = filled.all(where={"q": 0.5})
    filled.update_metadata(target.experience_id, {"q": 0.6})
    seen.add(filled.digest())
    filled.delete([target.experience_id])
    seen.add(filled.digest())
    assert len(seen) == 4


def test_digest_unchanged_by_reads(filled: ExperienceStore) -> None:
    before = filled.digest()
    filled.get([item.experience_id for item in filled.all()])
    filled.all(kind="insight")
    filled.query("apple", k=3, task_type="pick")
    filled.count()
    filled.count(kind="skill")
    filled.size()
    assert filled.digest() == before


def test_digest_depends_on_contents_not_insertion_order() -> None:
    items = [experience(f"insight number {i}") for i in range(5)]
    forward = ExperienceStore(None, HashingEmbedder())
    backward = ExperienceStore(None, HashingEmbedder())
    forward.add(items)
    backward.add(items[::-1])
    assert forward.digest() == backward.digest()


def test_in_memory_stores_are_isolated() -> None:
    first = ExperienceStore(None, HashingEmbedder())
    second = ExperienceStore(None, HashingEmbedder())
    first.add([experience("only in the first store")])
    assert second.count() == 0


def test_read_only_view_refuses_writes_and_records_them(filled: ExperienceStore) -> None:
    before = filled.digest()
    view = filled.read_only()
    [target] = filled.all(kind="skill")
    attempts = [
        lambda: view.add([experience("sneaky test-time insight", split="test")]),
        lambda: view.update_metadata(target.experience_id, {"q": 9.0}),
        lambda: view.delete([target.experience_id]),
    ]
    for attempt in attempts:
        with pytest.raises(FrozenStoreError, match="frozen during evaluation"):
            attempt()
    # A method that swallows the error still leaves a record.
    try:
        view.delete(["x"])
    except FrozenStoreError:
        pass
    assert [v.operation for v in view.violations] == ["add", "update_metadata", "delete", "delete"]
    assert view.violations[1] == WriteViolation("update_metadata", (target.experience_id,))
    assert isinstance(FrozenStoreError("x"), RuntimeError)
    assert filled.digest() == before == view.digest()
    assert filled.count() == 4


def test_read_only_view_reads_like_the_store(filled: ExperienceStore) -> None:
    view = filled.read_only()
    assert view.all() == filled.all()
    assert view.count(kind="skill") == filled.count(kind="skill")
    assert view.query("apple", k=2, kind="insight") == filled.query("apple", k=2, kind="insight")
    ids = [item.experience_id for item in filled.all()]
    assert view.get(ids) == filled.get(ids)
    assert view.size() == filled.size()
    assert view.read_only() is view
    assert not hasattr(view, "_collection")


def test_persistence_and_digest_after_reopening(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "store"
    store = ExperienceStore(folder, HashingEmbedder())
    items = [experience(f"insight {i}", task_ids=(f"t{i}", "t0"), q=i / 10) for i in range(20)]
    store.add(items)
    store.update_metadata(items[3].experience_id, {"votes": [1, -1]})
    digest = store.digest()
    del store

    reopened = ExperienceStore(folder, HashingEmbedder())
    assert reopened.digest() == digest
    assert reopened.count() == 20
    [loaded] = reopened.get([items[3].experience_id])
    assert loaded.metadata == {"q": 0.3, "votes": [1, -1]}
    assert loaded.provenance == items[3].provenance
    assert reopened.query("insight 7", k=1)[0][0].experience_id == items[7].experience_id


def _threads() -> int:
    """Every thread of this process, chromadb's native sqlite and tokio workers included."""
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_closed_store_lets_its_chromadb_threads_go(tmp_path: Path) -> None:
    """A process that runs many runs (an experiment's arms, a test suite) kept every store's
    chromadb system and its worker threads until it exited: 98 threads after the isolation tests."""
    from arena.core.services.store import stored_experiences

    warm = ExperienceStore(tmp_path / "warm", HashingEmbedder())  # chromadb's own process-wide threads
    warm.add([experience("warm")])
    warm.close()
    stored_experiences(tmp_path / "warm")
    time.sleep(0.5)
    before = _threads()
    for index in range(4):
        folder = tmp_path / f"run{index}" / "store"
        store = ExperienceStore(folder, HashingEmbedder())
        store.add([experience(f"insight {index}")])
        store.close()
        store.close()  # twice is harmless
        assert [e.text for e in stored_experiences(folder)] == [f"insight {index}"]  # reread, then closed
        reopened = ExperienceStore(folder, HashingEmbedder())  # closing let the folder go, not its data
        assert reopened.count() == 1
        reopened.close()
    deadline = time.monotonic() + 10  # chromadb's workers end a moment after their system stops
    while _threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads() <= before


@pytest.mark.slow
def test_another_process_sees_the_same_store(tmp_path: Path) -> None:
    """What ``--resume`` needs: a fresh process reads back the same contents and digest."""
    folder = tmp_path / "store"
    store = ExperienceStore(folder, HashingEmbedder())
    store.add([experience(f"insight {i}", q=i) for i in range(10)])
    store.update_metadata(store.all()[0].experience_id, {"q": -1})
    script = (
        "import sys\n"
        "from arena.core.services.embedder import HashingEmbedder\n"
        "from arena.core.services.store import ExperienceStore\n"
        "store = ExperienceStore(sys.argv[1], HashingEmbedder())\n"
        "print(store.count(), store.digest())\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", script, str(folder)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert output == ["10", store.digest()]


def test_reopening_with_another_embedder_is_refused(tmp_path: Path) -> None:
    ExperienceStore(tmp_path / "store", HashingEmbedder(dim=64)).add([experience("x")])
    with pytest.raises(ValueError, match="not comparable"):
        ExperienceStore(tmp_path / "store", HashingEmbedder(dim=128))


def test_size_grows_with_items(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path / "store", HashingEmbedder())
    empty = store.size()
    assert empty["items"] == 0 and empty["content_bytes"] == 0
    store.add([experience(f"short insight {i}") for i in range(5)])
    small = store.size()
    store.add([experience(f"a much longer insight number {i} " * 20) for i in range(50)])
    large = store.size()
    assert (small["items"], large["items"]) == (5, 55)
    assert 0 < small["content_bytes"] < large["content_bytes"]
    assert large["disk_bytes"] > 0
    assert large["bytes"] == large["content_bytes"] + large["disk_bytes"]


def test_hashing_embeddings_are_normalised_and_deterministic() -> None:
    embedder = HashingEmbedder(dim=128)
    vectors = embedder.embed(["put the apple in the fridge", "", "!!!", "a b c d e f g"])
    assert vectors.shape == (4, 128) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(vectors, HashingEmbedder(dim=128).embed(
        ["put the apple in the fridge", "", "!!!", "a b c d e f g"]
    ))
    assert embedder.embed([]).shape == (0, 128)
    similarity = embedder.similarity(
        ["apple in the fridge"], ["the apple in a fridge", "heat a mug"]
    )
    assert similarity[0, 0] > similarity[0, 1]


def test_make_embedder() -> None:
    hashing = make_embedder({"name": "hashing", "dim": 64, "batch_size": 8})
    assert isinstance(hashing, HashingEmbedder) and hashing.dim == 64
    assert hashing.describe() == {"name": "hashing", "dim": 64}
    minilm = make_embedder({"name": "minilm", "batch_size": 16})
    assert isinstance(minilm, MiniLMEmbedder) and minilm.batch_size == 16
    with pytest.raises(ValueError, match=r"Unknown embedder 'x'\. Available: hashing, minilm"):
        make_embedder({"name": "x"})
    with pytest.raises(ValueError, match="does not take option"):
        make_embedder({"name": "minilm", "dim": 64})


@pytest.mark.slow
def test_minilm_scores_similar_sentences_higher() -> None:
    embedder = MiniLMEmbedder()
    vectors = embedder.embed(["put a clean mug in the coffee machine"])
    assert vectors.shape == (1, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    similarity = embedder.similarity(
        ["place a washed cup in the coffee maker"],
        ["put a clean mug in the coffee machine", "the stock market fell sharply today"],
    )
    assert similarity[0, 0] > similarity[0, 1] + 0.3
    description = embedder.describe()
    assert description["dim"] == 384 and len(description["weights_sha256"]) == 64

    store = ExperienceStore(None, embedder)
    store.add([experience("put a clean mug in the coffee machine"),
               experience("the stock market fell sharply today")])
    [(best, _)] = store.query("place a washed cup in the coffee maker", k=1)
    assert best.text == "put a clean mug in the coffee machine"


# -- additions for the memory methods: index texts, vectors, batch updates, recall filters,
# -- snapshots ---------------------------------------------------------------------------------


def test_add_with_index_texts_finds_items_by_their_task(store: ExperienceStore) -> None:
    transcripts = [
        experience("> go to fridge 1\n> open fridge 1\n> take apple 1", task_ids=("a",)),
        experience("> go to sinkbasin 1\n> clean mug 1 with sinkbasin 1", task_ids=("b",)),
    ]
    store.add(transcripts, index_texts=["put a cool apple in cabinet.", "clean some mug."])
    [(best, score)] = store.query("clean some mug.", k=1)
    assert best.text == transcripts[1].text  # the transcript comes back, found by its task
    assert score == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="one index text per experience"):
        store.add(transcripts, index_texts=["only one"])
    with pytest.raises(ValueError, match="not both"):
        store.add(transcripts, index_texts=["a", "b"], embeddings=np.ones((2, 256)))


def test_add_with_precomputed_vectors_and_query_vector(store: ExperienceStore) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(50, 256)).astype(np.float32)
    items = [experience(f"item {i}", task_ids=(f"t{i}",)) for i in range(50)]
    store.add(items, embeddings=vectors * 7.0)  # any scale: normalised on the way in
    [(best, score)] = store.query_vector(vectors[17], k=1)
    assert best.experience_id == items[17].experience_id
    assert score == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match=r"shape \(50, 256\)"):
        store.add(items, embeddings=vectors[:, :128])
    with pytest.raises(ValueError, match=r"shape \(1, 256\)"):
        store.query_vector(vectors[0, :10], k=1)


def test_update_metadata_many_is_one_write_or_none(filled: ExperienceStore) -> None:
    ids = [item.experience_id for item in filled.all()]
    filled.update_metadata_many({ids[0]: {"q": -0.3, "visits": 1}, ids[2]: {"q": 0.3}})
    first, third = filled.get([ids[0], ids[2]])
    assert (first.metadata["q"], first.metadata["visits"], third.metadata["q"]) == (-0.3, 1, 0.3)
    before = filled.digest()
    with pytest.raises(KeyError, match="missing"):
        filled.update_metadata_many({ids[1]: {"q": 9.0}, "missing": {"q": 1.0}})
    assert filled.digest() == before  # nothing written when one id is unknown
    filled.update_metadata_many({})
    assert filled.digest() == before


def test_query_min_similarity_drops_weak_matches(filled: ExperienceStore) -> None:
    everything = filled.query("heat the mug in the microwave", k=10)
    threshold = (everything[0][1] + everything[1][1]) / 2
    recalled = filled.query("heat the mug in the microwave", k=10, min_similarity=threshold)
    assert [e.text for e, _ in recalled] == ["heat the mug in the microwave"]
    assert filled.query("heat the mug in the microwave", k=10, min_similarity=-1.0) == everything


def test_query_excludes_source_tasks_and_still_returns_k(store: ExperienceStore) -> None:
    # The 30 nearest items all come from the excluded task: widening must find the others.
    store.add([experience(f"apple fridge note {i}", task_ids=("self", f"x{i}")) for i in range(30)]
              + [experience(f"mug sink note {i}", task_ids=(f"other{i}",)) for i in range(5)])
    kept = store.query("apple fridge note", k=4, exclude_source_tasks=["self"])
    assert len(kept) == 4
    assert all("self" not in e.provenance.source_task_ids for e, _ in kept)
    scores = [score for _, score in kept]
    assert scores == sorted(scores, reverse=True)
    only_one = store.query("apple fridge note", k=4, exclude_source_tasks=["x3"])
    assert len(only_one) == 4 and all("x3" not in e.provenance.source_task_ids for e, _ in only_one)
    assert len(store.query("apple", k=40, exclude_source_tasks=["self"])) == 5


@pytest.mark.parametrize("name", ["memory.jsonl", "memory.jsonl.gz"])
def test_snapshot_restore_round_trip(tmp_path: Path, filled: ExperienceStore, name: str) -> None:
    [target] = filled.all(where={"q": 0.5})
    filled.update_metadata(target.experience_id, {"q": 0.9, "history": [0.5, 0.9]})
    path = filled.snapshot(tmp_path / "snaps" / name)
    header = ExperienceStore.read_snapshot_header(path)
    assert header["count"] == 4 and header["digest"] == filled.digest()
    assert not list(path.parent.glob("*.partial"))

    other = ExperienceStore(tmp_path / "other", HashingEmbedder())
    other.add([experience("something that must disappear")])
    other.restore(path)
    assert other.digest() == filled.digest()
    assert other.all() == filled.all()
    assert other.query("apple fridge", k=2) == filled.query("apple fridge", k=2)
    reopened = ExperienceStore(tmp_path / "other", HashingEmbedder())
    assert reopened.digest() == filled.digest()


def test_restore_refuses_foreign_or_truncated_snapshots(tmp_path: Path, filled: ExperienceStore) -> None:
    path = filled.snapshot(tmp_path / "memory.jsonl")
    with pytest.raises(ValueError, match="not comparable"):
        ExperienceStore(None, HashingEmbedder(dim=64)).restore(path)
    lines = path.read_text().splitlines(keepends=True)
    (tmp_path / "cut.jsonl").write_text("".join(lines[:-1]))
    fresh = ExperienceStore(None, HashingEmbedder())
    with pytest.raises(ValueError, match="truncated: 3 of 4"):
        fresh.restore(tmp_path / "cut.jsonl")
    (tmp_path / "other.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="not an Arena store snapshot"):
        fresh.restore(tmp_path / "other.jsonl")


def test_a_methods_snapshot_stays_in_its_folder(tmp_path: Path, filled: ExperienceStore) -> None:
    """``run.store.snapshot`` writes with the harness's rights: a path out of the method's folder
    (``..``, absolute elsewhere, through a link) would replace the run's salt; it is refused."""
    from arena.core.services.run_services import GuardedStore
    from arena.core.storage.method_state import OutsideFolder

    run_path = tmp_path / "run"
    folder = run_path / "method"
    folder.mkdir(parents=True)
    (run_path / "eval_salt").write_text("kept\n")
    guarded = GuardedStore(filled, lambda: False, folder)
    (folder / "out").symlink_to(run_path)
    for escape in ("../eval_salt", folder / ".." / "eval_salt", run_path / "eval_salt", folder / "out" / "eval_salt",
                   tmp_path / "elsewhere.jsonl", folder):
        with pytest.raises(OutsideFolder, match="run.method_state.folder"):
            guarded.snapshot(escape)
    assert (run_path / "eval_salt").read_text() == "kept\n"
    assert not (tmp_path / "elsewhere.jsonl").exists()
    inside = guarded.snapshot("snaps/memory.jsonl")  # relative: in the method's folder
    assert inside == (folder / "snaps" / "memory.jsonl").resolve()
    assert ExperienceStore.read_snapshot_header(inside)["digest"] == filled.digest()
    assert guarded.snapshot(folder / "memory.jsonl.gz").exists()
    with pytest.raises(OutsideFolder):
        guarded.restore("../eval_salt")


def test_a_link_planted_where_a_snapshot_is_written_is_not_followed(tmp_path: Path, filled: ExperienceStore) -> None:
    """A method that owns the folder may plant a link at the snapshot's temporary name, or turn
    a subfolder into a link after the path was checked: the harness never writes through it."""
    folder = tmp_path / "method"
    (folder / "sub").mkdir(parents=True)
    victim = tmp_path / "eval_salt"
    victim.write_text("kept\n")
    (folder / "memory.jsonl.partial").symlink_to(victim)
    path = filled.snapshot(folder / "memory.jsonl", within=folder)
    assert victim.read_text() == "kept\n" and ExperienceStore.read_snapshot_header(path)["count"] == 4
    assert not (folder / "memory.jsonl.partial").exists()
    (folder / "sub").rmdir()
    (folder / "sub").symlink_to(tmp_path)  # swapped after a check of folder/sub/eval_salt
    with pytest.raises(OSError):
        filled.snapshot(folder / "sub" / "eval_salt", within=folder)
    assert victim.read_text() == "kept\n"


def test_read_only_view_snapshots_but_refuses_restore_and_batch_updates(
    tmp_path: Path, filled: ExperienceStore
) -> None:
    view = filled.read_only()
    before = filled.digest()
    path = view.snapshot(tmp_path / "frozen.jsonl")
    assert view.read_snapshot_header(path)["digest"] == before
    ids = [item.experience_id for item in filled.all()]
    with pytest.raises(FrozenStoreError):
        view.restore(path)
    with pytest.raises(FrozenStoreError):
        view.update_metadata_many({ids[0]: {"q": 1.0}})
    with pytest.raises(FrozenStoreError):
        view.add([experience("x")], index_texts=["y"])
    assert [v.operation for v in view.violations] == ["restore", "update_metadata", "add"]
    assert view.query_vector(HashingEmbedder().embed(["apple"])[0], 2) == filled.query("apple", k=2)
    recalled = filled.query("apple", k=3, exclude_source_tasks=["t9"], min_similarity=0.0)
    assert recalled and view.query("apple", k=3, exclude_source_tasks=["t9"], min_similarity=0.0) == recalled
    assert filled.digest() == before


def test_filtered_query_matches_exact_search_whether_the_filter_is_broad_or_rare() -> None:
    """A broad filter is answered from the unfiltered nearest items, a rare one by chromadb's
    filtered search; both must give the exact nearest allowed items."""
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(300, 256)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    kinds = ["rare" if i % 50 == 0 else "common" for i in range(300)]
    items = [experience(f"item {i}", kind=kinds[i], task_ids=(f"t{i}",), rank=i) for i in range(300)]
    store = ExperienceStore(None, HashingEmbedder())
    store.add(items, embeddings=vectors)
    query = vectors[7] + 0.3 * rng.normal(size=256).astype(np.float32)
    query /= np.linalg.norm(query)
    similarity = vectors @ query
    for kind, k in (("common", 5), ("rare", 5), ("rare", 2)):
        allowed = [i for i in range(300) if kinds[i] == kind]
        exact = sorted(allowed, key=lambda i: -similarity[i])[:k]
        found = store.query_vector(query, k, kind=kind)
        assert [e.metadata["rank"] for e, _ in found] == exact
        assert [score for _, score in found] == pytest.approx([float(similarity[i]) for i in exact], abs=1e-5)
    above = store.query_vector(query, 5, where={"rank": {"$gte": 290}})
    assert [e.metadata["rank"] for e, _ in above] == sorted(range(290, 300), key=lambda i: -similarity[i])[:5]


def test_python_filter_agrees_with_chromadb_on_stored_metadata() -> None:
    """The fast path of filtered queries evaluates ``where`` in Python: it must select exactly
    what chromadb selects, or hand the clause to chromadb."""
    from arena.core.services.store import _matches, _UnsupportedFilter

    store = ExperienceStore(None, HashingEmbedder())
    values = [1, 1.0, 2.5, -3, True, False, "1", "pick", "heat", None, [1, 2]]
    store.add([experience(f"item {i}", kind=("skill", "insight")[i % 2], task_ids=(f"t{i}",),
                          q=values[i % len(values)], **({"tag": "x"} if i % 3 else {}))
               for i in range(44)])
    stored = store._collection.get(include=["metadatas"])
    filters = [
        {"q": 1}, {"q": 1.0}, {"q": True}, {"q": "1"}, {"q": {"$ne": 1}}, {"q": {"$ne": True}},
        {"q": {"$in": [1, 3]}}, {"q": {"$in": [2.5, 1.0]}}, {"q": {"$nin": ["pick", "heat"]}}, {"q": {"$gt": 0.5}},
        {"q": {"$gte": 1}}, {"q": {"$lt": 0}}, {"q": {"$lte": 2.5}}, {"tag": "x"},
        {"tag": {"$ne": "x"}}, {"tag": {"$nin": ["x"]}}, {"missing": {"$ne": 1}},
        {"$and": [{"kind": "skill"}, {"q": {"$gte": 1}}]},
        {"$or": [{"kind": "skill"}, {"tag": {"$ne": "x"}}]},
        {"$and": [{"$or": [{"q": 1}, {"q": "heat"}]}, {"source_split": {"$nin": ["test_seen"]}}]},
    ]
    for where in filters:
        expected = set(store._collection.get(where=where, include=[])["ids"])
        ours = {i for i, m in zip(stored["ids"], stored["metadatas"]) if _matches(m, where)}
        assert ours == expected, where
    for unsupported in ({"q": {"$in": [1, "1"]}}, {"q": {"$in": [1, 2.5]}}, {"q": {"$gt": "a"}}, {"q": {"$regex": "x"}},
                        {"q": 1, "tag": "x"}, {"$and": [{"q": 1}]}):
        with pytest.raises(_UnsupportedFilter):
            _matches(stored["metadatas"][0], unsupported)


def test_reads_after_writes_never_see_stale_rows(filled: ExperienceStore) -> None:
    """Rows read by a query are kept in memory; every write must show in the next read."""
    [(nearest, _)] = filled.query("heat the mug in the microwave", k=1, kind="insight")
    filled.update_metadata_many({nearest.experience_id: {"q": 0.99}})
    [(again, _)] = filled.query("heat the mug in the microwave", k=1, kind="insight")
    assert again.metadata["q"] == 0.99
    assert filled.get([nearest.experience_id, nearest.experience_id]) == [again, again]
    replaced = Experience(nearest.kind, nearest.text, nearest.provenance, {"q": -1},
                          nearest.experience_id)
    filled.add([replaced])
    assert filled.query("heat the mug in the microwave", k=1, where={"q": {"$lt": 0}})[0][0] == replaced
    filled.delete([nearest.experience_id])
    assert nearest.experience_id not in {e.experience_id for e, _ in filled.query("heat", k=10)}
    assert filled.get([nearest.experience_id]) == []


def test_a_replacement_keeps_no_key_of_the_item_it_replaces(store: ExperienceStore) -> None:
    """chromadb's upsert merges metadata; ``add`` must replace it (a JSON-encoded key left
    behind would even decode as a raw string)."""
    original = experience("put the apple in the fridge", q=0.1, tags=["a", "b"], note="x")
    store.add([original])
    store.get([original.experience_id])  # cached, too
    replacement = Experience(original.kind, "reworded", original.provenance, {"q": 0.2},
                             original.experience_id)
    store.add([replacement])
    assert store.get([original.experience_id]) == [replacement]
    reopened_view = store._collection.get(ids=[original.experience_id], include=["metadatas"])
    assert set(reopened_view["metadatas"][0]) == {"q", "kind", "source_split", "source_task_ids", "_json_keys"}


def test_a_vector_one_ulp_off_keeps_the_digest_and_a_real_change_does_not(tmp_path: Path) -> None:
    """chromadb can hand back a restored vector 1 ulp off what was written (seen in a MemRL run),
    which must not read as a changed store; a changed component must."""
    store = ExperienceStore(tmp_path / "a", HashingEmbedder())
    store.add([experience("put a cool winebottle in microwave")])
    before = store.digest()
    [row_id] = store._collection.get(include=[])["ids"]
    vector = np.asarray(store._collection.get(include=["embeddings"])["embeddings"][0], dtype=np.float32)
    nudged = vector.copy()
    index = int(np.flatnonzero(nudged)[0])
    nudged[index] = np.nextafter(nudged[index], np.float32(1.0))
    store._collection.update(ids=[row_id], embeddings=nudged[None])
    assert store.digest() == before
    moved = vector.copy()
    moved[index] += 0.01
    store._collection.update(ids=[row_id], embeddings=moved[None])
    assert store.digest() != before


def test_minilm_embeds_each_text_once_when_episodes_ask_at_once() -> None:
    """Eight episodes begin an evaluation together, each asking for the same 1,200 train goals:
    the model encodes them once, not eight times side by side (0.6 GB of resident memory)."""
    import threading
    import time

    encoded: list[str] = []
    at_once = [0, 0]  # now, most

    class Model:
        def encode(self, texts: list[str], **_: object) -> np.ndarray:
            at_once[0] += 1
            at_once[1] = max(at_once)
            time.sleep(0.05)
            encoded.extend(texts)
            at_once[0] -= 1
            return np.ones((len(texts), MiniLMEmbedder.dim), dtype=np.float32)

    embedder = MiniLMEmbedder()
    embedder._model = Model()
    goals = [f"put a clean mug {i} in the coffee machine" for i in range(1200)]
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(embedder.similarity(goals[:1], goals)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(encoded) == sorted(goals) and at_once[1] == 1
    assert len(results) == 8 and all(r.shape == (1, 1200) for r in results)


@pytest.mark.slow
def test_minilm_without_sentence_transformers_gives_sentence_transformers_vectors() -> None:
    """The packaged MiniLM runs through plain transformers (mean pooling, L2 norm); its vectors
    are sentence-transformers' own, long texts (truncated at 256 tokens) and empty ones included."""
    from sentence_transformers import SentenceTransformer

    path = MiniLMEmbedder.model_path()
    assert MeanPoolingEncoder.fits(path)
    texts = ["put a clean mug in coffeemachine", "", "heat some egg and put it in garbagecan",
             "go to the drawer " * 120, "look at the alarmclock under the desklamp"]
    reference = SentenceTransformer(str(path), device="cpu", local_files_only=True).encode(
        texts, batch_size=2, convert_to_numpy=True, normalize_embeddings=True)
    vectors = MiniLMEmbedder(batch_size=2).embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (5, MiniLMEmbedder.dim)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)


def test_a_model_of_another_layout_goes_through_sentence_transformers(tmp_path: Path) -> None:
    """Only the exact layout MeanPoolingEncoder computes is taken off sentence-transformers."""
    import shutil

    source = MiniLMEmbedder.model_path()
    for name in ("modules.json", "sentence_bert_config.json"):
        shutil.copy(source / name, tmp_path / name)
    (tmp_path / "1_Pooling").mkdir()
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert MeanPoolingEncoder.fits(tmp_path)
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({**pooling, "pooling_mode_cls_token": True}))
    assert not MeanPoolingEncoder.fits(tmp_path)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = json.loads((source / "modules.json").read_text())[:2]  # no Normalize
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert not MeanPoolingEncoder.fits(tmp_path)
