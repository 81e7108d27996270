"""The experience store: every method's learned experiences, in one chromadb collection.

Why one shared store: the harness can measure, digest and freeze what a method learned without
knowing the method. The store always passes vectors computed by the run's :class:`Embedder`;
chromadb's own embedding function is never used (it would download a model).

Metadata layout in chromadb (values must be str/int/float/bool there):

* reserved keys ``kind``, ``source_split``, ``source_task_ids`` (a JSON list) and ``_json_keys``;
* every key of ``Experience.metadata`` at top level, so ``where`` filters work on it directly
  (``{"q_value": {"$gt": 0}}``, ``{"task_type": "pick"}``); values that chromadb cannot hold
  (lists, dicts, None) are JSON-encoded and their keys listed in ``_json_keys`` to decode on read.

An experience is indexed by its text unless ``add`` is given other index texts (a trajectory found
by its task's goal) or precomputed vectors. ``snapshot``/``restore`` copy the whole store to and
from one portable file (ids, texts, metadata, vectors), so a learned memory can be kept, shipped
and reloaded bit for bit (same digest).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arena.core.contract.types import Experience, Provenance
from arena.core.services.embedder import Embedder
from arena.core.storage.files import folder_bytes
from arena.core.storage.journal import crash_point

DEFAULT_COLLECTION = "experiences"
SNAPSHOT_FORMAT = "arena-store-snapshot"
SNAPSHOT_VERSION = 1
#: Rows (text and stored metadata) kept in memory by id; past this the cache starts over.
_ROW_CACHE_MAX = 250_000
#: A filtered query first looks at this many times k nearest items without the filter (then
#: at the second factor's), before chromadb's own filtered search.
_OVERFETCH = (4, 32)
_JSON_KEYS = "_json_keys"
RESERVED_KEYS = frozenset({"kind", "source_split", "source_task_ids", _JSON_KEYS})
_SCALARS = (str, bool, int, float)


class FrozenStoreError(RuntimeError):
    """A write was attempted on a read-only (frozen) store."""


@dataclass(frozen=True)
class WriteViolation:
    """One refused write, kept so the harness can invalidate a run even if the error was caught."""

    operation: str
    ids: tuple[str, ...]


def _settings() -> Any:
    # A fresh object each time: chromadb clients mutate the Settings they are given.
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False, allow_reset=False)


def _encode_metadata(experience: Experience) -> dict[str, str | int | float | bool]:
    clash = RESERVED_KEYS & experience.metadata.keys()
    if clash:
        raise ValueError(
            f"Experience {experience.experience_id} uses reserved metadata key(s) {sorted(clash)}"
        )
    encoded: dict[str, str | int | float | bool] = {
        "kind": experience.kind,
        "source_split": experience.provenance.source_split,
        "source_task_ids": json.dumps(list(experience.provenance.source_task_ids)),
    }
    json_keys = []
    for key, value in experience.metadata.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, _SCALARS):
            encoded[key] = value
        else:
            encoded[key] = json.dumps(value, sort_keys=True)
            json_keys.append(key)
    encoded[_JSON_KEYS] = json.dumps(sorted(json_keys))
    return encoded


def _decode(experience_id: str, document: str, stored: dict[str, Any]) -> Experience:
    json_keys = set(json.loads(stored[_JSON_KEYS]))
    metadata = {
        key: json.loads(value) if key in json_keys else value
        for key, value in stored.items()
        if key not in RESERVED_KEYS
    }
    provenance = Provenance(
        source_task_ids=tuple(json.loads(stored["source_task_ids"])),
        source_split=stored["source_split"],
    )
    return Experience(
        kind=stored["kind"],
        text=document,
        provenance=provenance,
        metadata=metadata,
        experience_id=experience_id,
    )


def _decode_rows(rows: list[tuple[str, float, str, dict[str, Any]]]
                 ) -> list[tuple[Experience, float]]:
    return [(_decode(experience_id, document, metadata), score)
            for experience_id, score, document, metadata in rows]


def _combine_filters(clauses: list[dict[str, Any]]) -> dict[str, Any] | None:
    """chromadb's ``$and`` needs at least two clauses, so one clause is passed as it is."""
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


class _UnsupportedFilter(Exception):
    """A ``where`` clause :func:`_matches` does not evaluate; chromadb evaluates it instead."""


def _value_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    raise _UnsupportedFilter(f"value {value!r}")


def _same(stored: Any, value: Any) -> bool:
    """chromadb's equality: 1 == 1.0, but a bool never equals a number."""
    return _value_type(stored) == _value_type(value) and stored == value


def _matches(metadata: dict[str, Any], where: dict[str, Any]) -> bool:
    """chromadb's ``where`` semantics on one item's stored metadata, in Python.

    Negations ($ne, $nin, $not_contains) match items without the key, as in chromadb. Anything
    this does not know (another operator, a mixed-type list) raises
    :class:`_UnsupportedFilter`, so chromadb answers, and raises its own error if it is invalid.
    """
    if len(where) != 1:
        raise _UnsupportedFilter("a where dict with several keys")
    [(key, condition)] = where.items()
    if key in ("$and", "$or"):
        if not isinstance(condition, list) or len(condition) < 2:
            raise _UnsupportedFilter(key)
        results = [_matches(metadata, clause) for clause in condition]
        return all(results) if key == "$and" else any(results)
    if isinstance(condition, dict):
        if len(condition) != 1:
            raise _UnsupportedFilter("several operators in one clause")
        [(operator, value)] = condition.items()
    else:
        operator, value = "$eq", condition
    present = key in metadata
    stored = metadata.get(key)
    if operator in ("$eq", "$ne"):
        if _value_type(value) == "list":
            raise _UnsupportedFilter(f"{operator} on a list")
        equal = present and _same(stored, value)
        return equal if operator == "$eq" else not equal
    if operator in ("$in", "$nin"):
        # chromadb refuses lists mixing Python types (even 1 and 2.5): let it say so.
        if not isinstance(value, list) or not value or len({type(v) for v in value}) != 1:
            raise _UnsupportedFilter(operator)
        if _value_type(value[0]) == "list":
            raise _UnsupportedFilter(operator)
        inside = present and any(_same(stored, v) for v in value)
        return inside if operator == "$in" else not inside
    if operator in ("$gt", "$gte", "$lt", "$lte"):
        if _value_type(value) != "number":
            raise _UnsupportedFilter(f"{operator} on {value!r}")
        if not present or _value_type(stored) != "number":
            return False
        return {"$gt": stored > value, "$gte": stored >= value,
                "$lt": stored < value, "$lte": stored <= value}[operator]
    if operator in ("$contains", "$not_contains"):
        contained = present and isinstance(stored, list) and any(_same(v, value) for v in stored)
        return contained if operator == "$contains" else not contained
    raise _UnsupportedFilter(operator)


def stored_experiences(path: str | Path, name: str = DEFAULT_COLLECTION) -> list[Experience]:
    """Every experience in the store folder ``path``, read without its embedder (for reports and
    exports: no vector is needed to list them). An absent folder or collection holds none."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    import chromadb

    # Closed once read: an open client keeps its chromadb system (sqlite and tokio worker
    # threads) for the life of the process, one per folder a report or export ever read.
    client: Any = chromadb.PersistentClient(path=str(folder), settings=_settings())  # see close()
    try:
        if name not in {collection.name for collection in client.list_collections()}:
            return []
        result: Any = client.get_collection(name).get(include=["documents", "metadatas"])  # see __init__
    finally:
        client.close()
    return sorted((_decode(i, d, m) for i, d, m in zip(result["ids"], result["documents"], result["metadatas"])),
                  key=lambda experience: experience.experience_id)


class ExperienceStore:
    """Experiences with their embeddings, persisted under ``path`` (or in memory if None).

    Reopening the same folder with the same embedder sees the same experiences and digest, which
    is what ``--resume`` relies on. One store object is the folder's only writer at a time (a
    run has one); it caches rows it has read and evicts them on its own writes.
    """

    def __init__(
        self, path: str | Path | None, embedder: Embedder, name: str = DEFAULT_COLLECTION,
        before_write: Callable[[ExperienceStore, list[str]], None] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.embedder = embedder
        self.name = name
        import chromadb  # here: a second to import, and only runs that store anything need it

        if self.path is None:
            # Ephemeral clients share one in-process system; a private database per store keeps
            # two in-memory stores (e.g. in tests) from seeing each other's experiences.
            database = f"arena-{uuid.uuid4().hex}"
            chromadb.AdminClient(_settings()).create_database(database)
            client = chromadb.EphemeralClient(settings=_settings(), database=database)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            client = chromadb.PersistentClient(path=str(self.path), settings=_settings())
        embedder_info = {"embedder": embedder.name, "embedding_dim": embedder.dim}
        # Any: chromadb types every field of a result as optional, whatever ``include`` asked for.
        self._collection: Any = client.get_or_create_collection(
            name,
            embedding_function=None,
            configuration={"hnsw": {"space": "cosine"}},
            metadata=embedder_info,
        )
        stored_info = {key: (self._collection.metadata or {}).get(key) for key in embedder_info}
        if stored_info != embedder_info:
            raise ValueError(
                f"Store '{name}' at {self.path} was built with {stored_info}, "
                f"but this run uses {embedder_info}: its vectors are not comparable"
            )
        self._max_batch = client.get_max_batch_size()
        # Any: chromadb types its clients as ClientAPI, which does not declare the close() they have.
        self._client: Any = client
        # id -> (text, stored metadata). chromadb spends ~90 us per row returning texts and
        # metadata with a query (measured), more than the vector search itself at 10k items;
        # this store is its collection's only writer in a run, so a cache that every write
        # path below evicts stays exact.
        self._rows: dict[str, tuple[str, dict[str, Any]]] = {}
        #: Called with this store and the ids a write is about to change, before it changes
        #: them (the run's step journal keeps their rows, :meth:`rows_of`, to roll a killed
        #: learning step back).
        self.before_write = before_write

    # -- undo: the rows as they were, and putting them back ---------------------------------

    def rows_of(self, ids: Iterable[str]) -> dict[str, Any]:
        """The stored rows of ``ids`` as JSON (``None`` for an id not in the store)."""
        wanted = list(dict.fromkeys(ids))
        rows: dict[str, Any] = dict.fromkeys(wanted)
        for start in range(0, len(wanted), self._max_batch):
            result = self._collection.get(ids=wanted[start:start + self._max_batch],
                                          include=["documents", "metadatas", "embeddings"])
            for experience_id, document, metadata, embedding in zip(
                    result["ids"], result["documents"], result["metadatas"], result["embeddings"]):
                rows[experience_id] = {"document": document, "metadata": dict(metadata or {}),
                                       "embedding": [float(x) for x in embedding]}
        return rows

    def restore_rows(self, rows: dict[str, Any]) -> None:
        """Put rows back as :meth:`rows_of` saw them: absent ones deleted, the others rewritten
        whole (metadata keys added since are dropped). Applying it twice changes nothing."""
        absent = [experience_id for experience_id, row in rows.items() if row is None]
        present = {experience_id: row for experience_id, row in rows.items() if row is not None}
        self._forget(rows)
        if absent:
            self._collection.delete(ids=absent)
        if present:
            ids = list(present)
            now = self._stored_rows(ids)
            metadatas = []
            for experience_id in ids:
                metadata = dict(present[experience_id]["metadata"])
                stale = now.get(experience_id, ("", {}))[1].keys() - metadata.keys()
                metadata.update(dict.fromkeys(stale))
                metadatas.append(metadata)
            self._forget(ids)
            self._collection.upsert(ids=ids, documents=[present[i]["document"] for i in ids],
                                    metadatas=metadatas,
                                    embeddings=[present[i]["embedding"] for i in ids])

    def _before_write(self, ids: Iterable[str]) -> None:
        if self.before_write is not None:
            self.before_write(self, list(ids))

    # -- writes --------------------------------------------------------------------------------

    def add(
        self,
        experiences: list[Experience],
        *,
        index_texts: Sequence[str] | None = None,
        embeddings: np.ndarray | Sequence[Sequence[float]] | None = None,
    ) -> None:
        """Insert or replace experiences by ``experience_id`` (re-adding one is idempotent).

        Each experience is indexed (embedded) by its own text, or by ``index_texts[i]`` when
        given: a trajectory or a memory is then found by the task it came from, not by its
        transcript. ``embeddings`` passes precomputed vectors instead (bulk loads, benchmarks);
        they must have the store's dimension and are L2-normalised here.
        """
        if index_texts is not None and embeddings is not None:
            raise ValueError("Pass index_texts or embeddings to ExperienceStore.add, not both.")
        keys = list(index_texts) if index_texts is not None else [e.text for e in experiences]
        if len(keys) != len(experiences):
            raise ValueError(
                f"ExperienceStore.add got {len(experiences)} experiences but {len(keys)} index "
                "texts; pass one index text per experience."
            )
        vectors = (None if embeddings is None
                   else self._checked_vectors(embeddings, len(experiences)))
        # Last one wins for a repeated id, as an upsert of each in turn would do.
        latest = {experience.experience_id: index for index, experience in enumerate(experiences)}
        order = list(latest.values())
        self._before_write(latest)
        for start in range(0, len(order), self._max_batch):
            batch = order[start:start + self._max_batch]
            ids = [experiences[i].experience_id for i in batch]
            metadatas: list[dict[str, Any]] = [_encode_metadata(experiences[i]) for i in batch]
            # chromadb's upsert merges metadata into a stored item's; a replacement must not
            # keep keys of the item it replaces, so those are set to None (chromadb drops them).
            stored = self._stored_rows(ids)
            for experience_id, metadata in zip(ids, metadatas):
                if experience_id in stored:
                    stale = stored[experience_id][1].keys() - metadata.keys()
                    metadata.update(dict.fromkeys(stale))
            self._forget(ids)
            self._collection.upsert(
                ids=ids,
                documents=[experiences[i].text for i in batch],
                metadatas=metadatas,
                embeddings=(self.embedder.embed([keys[i] for i in batch]) if vectors is None
                            else vectors[batch]),
            )
        crash_point("store.written")

    def _checked_vectors(self, embeddings: Any, n: int) -> np.ndarray:
        vectors = np.asarray(embeddings, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape != (n, self.embedder.dim):
            raise ValueError(
                f"Expected embeddings of shape ({n}, {self.embedder.dim}) for store '{self.name}' "
                f"(embedder {self.embedder.name}), got {vectors.shape}."
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    def update_metadata(self, experience_id: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into one experience's metadata (Q-values, weights, votes).

        Text and embedding are untouched. Raises KeyError for an unknown id.
        """
        self.update_metadata_many({experience_id: changes})

    def update_metadata_many(self, changes: Mapping[str, dict[str, Any]]) -> None:
        """Merge ``changes[id]`` into each experience's metadata in one write (e.g. the Q-values
        of every memory an episode used). Raises KeyError, writing nothing, if an id is unknown."""
        if not changes:
            return
        ids = list(changes)
        found = {experience.experience_id: experience for experience in self.get(ids)}
        missing = [experience_id for experience_id in ids if experience_id not in found]
        if missing:
            raise KeyError(f"No experience {missing} in store '{self.name}'")
        for experience_id in ids:
            found[experience_id].metadata.update(changes[experience_id])
        self._before_write(ids)
        self._forget(ids)
        self._collection.update(
            ids=ids, metadatas=[_encode_metadata(found[experience_id]) for experience_id in ids]
        )
        crash_point("store.written")

    def delete(self, ids: Iterable[str]) -> None:
        """Remove experiences; unknown ids are ignored."""
        ids = list(ids)
        if ids:
            self._before_write(ids)
            self._forget(ids)
            self._collection.delete(ids=ids)
            crash_point("store.written")

    # -- reads ---------------------------------------------------------------------------------

    def get(self, ids: Iterable[str]) -> list[Experience]:
        """The experiences with these ids, in the order asked; ids not in the store are skipped."""
        ids = list(ids)
        rows = self._stored_rows(ids)
        return [_decode(experience_id, *rows[experience_id]) for experience_id in ids
                if experience_id in rows]

    def _stored_rows(self, ids: Iterable[str]) -> dict[str, tuple[str, dict[str, Any]]]:
        """Text and stored metadata of these ids (unknown ids left out), cached."""
        wanted = list(dict.fromkeys(ids))
        missing = [experience_id for experience_id in wanted if experience_id not in self._rows]
        if missing:
            if len(self._rows) + len(missing) > _ROW_CACHE_MAX:
                self._rows.clear()
            for start in range(0, len(missing), self._max_batch):
                result = self._collection.get(ids=missing[start:start + self._max_batch],
                                              include=["documents", "metadatas"])
                for experience_id, document, metadata in zip(
                        result["ids"], result["documents"], result["metadatas"]):
                    self._rows[experience_id] = (document, metadata)
        rows = {}
        for experience_id in wanted:
            row = self._rows.get(experience_id)
            if row is not None:
                rows[experience_id] = row
        return rows

    def _forget(self, ids: Iterable[str]) -> None:
        for experience_id in ids:
            self._rows.pop(experience_id, None)

    def all(self, kind: str | None = None, where: dict[str, Any] | None = None) -> list[Experience]:
        """Every experience matching the filters, sorted by id so callers see a stable order."""
        clauses = ([{"kind": kind}] if kind is not None else []) + ([where] if where else [])
        result = self._collection.get(
            where=_combine_filters(clauses), include=["documents", "metadatas"]
        )
        experiences = [
            _decode(experience_id, document, metadata)
            for experience_id, document, metadata in zip(
                result["ids"], result["documents"], result["metadatas"]
            )
        ]
        return sorted(experiences, key=lambda experience: experience.experience_id)

    def query(
        self,
        text: str,
        k: int,
        *,
        kind: str | None = None,
        task_type: str | None = None,
        source_split: str | None = None,
        where: dict[str, Any] | None = None,
        min_similarity: float | None = None,
        exclude_source_tasks: Iterable[str] | None = None,
    ) -> list[tuple[Experience, float]]:
        """The ``k`` experiences nearest to ``text`` with their cosine similarity, best first.

        ``min_similarity`` drops results below it (a recall threshold); ``exclude_source_tasks``
        drops experiences learned from any of these task ids (e.g. the task being played), and
        still returns ``k`` when enough others exist.
        """
        return self.query_vector(
            self.embedder.embed([text])[0], k, kind=kind, task_type=task_type,
            source_split=source_split, where=where, min_similarity=min_similarity,
            exclude_source_tasks=exclude_source_tasks,
        )

    def query_vector(
        self,
        vector: np.ndarray | Sequence[float],
        k: int,
        *,
        kind: str | None = None,
        task_type: str | None = None,
        source_split: str | None = None,
        where: dict[str, Any] | None = None,
        min_similarity: float | None = None,
        exclude_source_tasks: Iterable[str] | None = None,
    ) -> list[tuple[Experience, float]]:
        """:meth:`query` with an already embedded query (one vector of the store's dimension)."""
        if k <= 0:
            return []
        query = self._checked_vectors(np.asarray(vector, dtype=np.float32).reshape(1, -1), 1)
        filters = {"kind": kind, "task_type": task_type, "source_split": source_split}
        clauses = [{key: value} for key, value in filters.items() if value is not None]
        if where:
            clauses.append(where)
        where_clause = _combine_filters(clauses)
        excluded = set(exclude_source_tasks or ())
        # Exclusion is on the JSON-encoded provenance, which chromadb cannot filter: fetch more
        # than k and drop, widening until k remain or nothing more can come.
        wanted = k + 2 * k * bool(excluded)
        while True:
            found, exhausted = self._nearest(query, wanted, where_clause)
            if excluded:
                found = [
                    (experience, score) for experience, score in found
                    if excluded.isdisjoint(experience.provenance.source_task_ids)
                ]
            if len(found) >= k or exhausted:
                break
            wanted *= 4
        if min_similarity is not None:
            found = [(experience, score) for experience, score in found if score >= min_similarity]
        return found[:k]

    def _nearest(self, query: np.ndarray, n: int, where: dict[str, Any] | None
                 ) -> tuple[list[tuple[Experience, float]], bool]:
        """The ``n`` nearest experiences matching ``where``, and whether fewer exist.

        chromadb evaluates a filter over every stored item before searching (15 to 45 ms at
        10k items, measured; also with ``ids=`` given), while in a run's store most items pass a
        method's filter. So a filtered search first takes the ``4 n`` (then ``32 n``) nearest
        without the filter and applies the filter to them in Python with chromadb's semantics
        (:func:`_matches`); only if fewer than ``n`` pass (a rare kind) does chromadb run the
        filtered search. Both give the nearest allowed items, up to the index's approximation:
        an allowed item nearer than those found would have been among the nearest unfiltered.
        """
        if where is not None:
            for factor in _OVERFETCH:
                ids, distances = self._nearest_ids(query, factor * n, None)
                kept: list[tuple[str, float, str, dict[str, Any]]] = []
                try:
                    # Rows are read (and cached) a slice at a time, nearest first, and only
                    # until n pass: reading a row costs more than searching.
                    for start in range(0, len(ids), _OVERFETCH[0] * n):
                        kept += [row for row in self._rows_in_order(
                            ids[start:start + _OVERFETCH[0] * n],
                            distances[start:start + _OVERFETCH[0] * n]) if _matches(row[3], where)]
                        if len(kept) >= n:
                            break
                except _UnsupportedFilter:
                    break
                exhausted = len(ids) < factor * n
                if len(kept) >= n or exhausted:
                    return _decode_rows(kept[:n]), len(kept) < n
        ids, distances = self._nearest_ids(query, n, where)
        return _decode_rows(self._rows_in_order(ids, distances)), len(ids) < n

    def _nearest_ids(self, query: np.ndarray, n: int, where: dict[str, Any] | None
                     ) -> tuple[list[str], list[float]]:
        """chromadb's ``n`` nearest ids (filtered by ``where``) and their distances."""
        result = self._collection.query(
            query_embeddings=query, n_results=n, where=where, include=["distances"]
        )
        return result["ids"][0], result["distances"][0]

    def _rows_in_order(self, ids: list[str], distances: list[float]
                       ) -> list[tuple[str, float, str, dict[str, Any]]]:
        """(id, similarity, text, stored metadata) of these ids, in their order."""
        stored = self._stored_rows(ids)
        return [(experience_id, 1.0 - float(distance), *stored[experience_id])
                for experience_id, distance in zip(ids, distances) if experience_id in stored]

    def count(self, kind: str | None = None) -> int:
        if kind is None:
            return self._collection.count()
        return len(self._collection.get(where={"kind": kind}, include=[])["ids"])

    def size(self) -> dict[str, int]:
        """Items and bytes for ``results.json``.

        ``content_bytes`` counts text and metadata as stored (comparable across methods);
        ``bytes`` adds the on-disk size of the store folder when persistent.
        """
        result = self._collection.get(include=["documents", "metadatas"])
        content_bytes = sum(
            len(document.encode()) + len(json.dumps(metadata, sort_keys=True).encode())
            for document, metadata in zip(result["documents"], result["metadatas"])
        )
        disk_bytes = folder_bytes(self.path) if self.path is not None else 0
        return {
            "items": len(result["ids"]),
            "bytes": content_bytes + disk_bytes,
            "content_bytes": content_bytes,
            "disk_bytes": disk_bytes,
        }

    def digest(self) -> str:
        """sha256 of the full contents (ids, texts, metadata, embeddings) in id order.

        It depends on contents only, so it changes exactly when a write changes what is stored
        and is identical after reopening the folder; reads never touch it. Embeddings enter at 5
        decimals: chromadb can hand back a restored vector 1 ulp off what was written (seen with
        hashing-embedder vectors of sampled text), which must not count as a change.
        """
        result = self._collection.get(include=["documents", "metadatas", "embeddings"])
        digest = hashlib.sha256(f"{self.name}\n".encode())
        for experience_id, document, metadata, embedding in sorted(
            zip(result["ids"], result["documents"], result["metadatas"], result["embeddings"]),
            key=lambda row: row[0],
        ):
            digest.update(
                json.dumps([experience_id, document, metadata], sort_keys=True).encode()
            )
            digest.update(np.round(np.asarray(embedding, dtype=np.float64), 5).tobytes())
        return digest.hexdigest()

    # -- snapshot and restore ------------------------------------------------------------------

    def snapshot(self, path: str | Path, *, within: str | Path | None = None) -> Path:
        """Write the whole store to one file (gzipped JSON lines if the name ends in ``.gz``).

        The first line says what made it (embedder, count, digest); then one line per
        experience with its stored metadata and float32 vector, in id order. Reading never
        changes the store, so a frozen store can be snapshotted too. The file is written to a
        temporary name and renamed, so a killed run never leaves half a snapshot.

        ``within``: a folder ``path`` (resolved) lies in, that someone else may change while the
        snapshot is written (a method's folder): the file is then reached from it one folder at a
        time without following a link, and made new, so a link put there never redirects it.
        """
        path = Path(path)
        if within is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        else:
            folder = _open_beneath(Path(within), path.parent)
        partial = path.name + ".partial"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial, dir_fd=folder)  # a killed run's; a link is removed, not followed
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666,
                                 dir_fd=folder)
            try:
                with os.fdopen(descriptor, "wb") as raw:
                    self._write_snapshot(raw, gzipped=path.suffix == ".gz")
                os.replace(partial, path.name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial, dir_fd=folder)
                raise
        finally:
            os.close(folder)
        return path

    def _write_snapshot(self, raw: io.BufferedWriter, gzipped: bool) -> None:
        result = self._collection.get(include=["documents", "metadatas", "embeddings"])
        rows = sorted(
            zip(result["ids"], result["documents"], result["metadatas"], result["embeddings"]),
            key=lambda row: row[0],
        )
        header = {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "name": self.name,
            "embedder": self.embedder.name,
            "embedding_dim": self.embedder.dim,
            "count": len(rows),
            "digest": self.digest(),
        }
        binary: Any = gzip.GzipFile(fileobj=raw, mode="wb") if gzipped else raw
        with io.TextIOWrapper(binary, encoding="utf-8") as handle:
            handle.write(json.dumps(header, sort_keys=True) + "\n")
            for experience_id, document, metadata, embedding in rows:
                vector = np.asarray(embedding, dtype="<f4").tobytes()
                line = {"id": experience_id, "document": document, "metadata": metadata,
                        "embedding": base64.b64encode(vector).decode("ascii")}
                handle.write(json.dumps(line, sort_keys=True) + "\n")

    @staticmethod
    def read_snapshot_header(path: str | Path) -> dict[str, Any]:
        """The first line of a snapshot (format, embedder, count, digest), without loading it."""
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            header = json.loads(handle.readline())
        if header.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(
                f"{path} is not an Arena store snapshot (no '{SNAPSHOT_FORMAT}' header).")
        if header.get("version") != SNAPSHOT_VERSION:
            raise ValueError(
                f"{path} is snapshot version {header.get('version')}; this Arena reads version "
                f"{SNAPSHOT_VERSION}. Restore it with the Arena version that wrote it."
            )
        return header

    def restore(self, path: str | Path) -> None:
        """Replace the store's contents with a snapshot's; afterwards the digest is the one the
        snapshot recorded (checked). Refused if the snapshot was made with another embedder."""
        path = Path(path)
        header = self.read_snapshot_header(path)
        made_with = {"embedder": header["embedder"], "embedding_dim": header["embedding_dim"]}
        ours = {"embedder": self.embedder.name, "embedding_dim": self.embedder.dim}
        if made_with != ours:
            raise ValueError(
                f"Snapshot {path} was made with {made_with}, but store '{self.name}' uses {ours}: "
                "its vectors are not comparable. Restore it into a store with the same embedder."
            )
        ids, documents, metadatas, vectors = [], [], [], []
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            handle.readline()
            for line in handle:
                row = json.loads(line)
                ids.append(row["id"])
                documents.append(row["document"])
                metadatas.append(row["metadata"])
                vectors.append(np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4"))
        if len(ids) != header["count"]:
            raise ValueError(
                f"Snapshot {path} is truncated: {len(ids)} of {header['count']} items.")
        self._rows.clear()
        existing = self._collection.get(include=[])["ids"]
        for start in range(0, len(existing), self._max_batch):
            self._collection.delete(ids=existing[start:start + self._max_batch])
        for start in range(0, len(ids), self._max_batch):
            end = start + self._max_batch
            self._collection.upsert(
                ids=ids[start:end], documents=documents[start:end], metadatas=metadatas[start:end],
                embeddings=np.stack(vectors[start:end]).astype(np.float32),
            )
        if header["name"] == self.name and self.digest() != header["digest"]:
            raise ValueError(f"Store '{self.name}' restored from {path} does not match its digest.")

    def read_only(self) -> ReadOnlyExperienceStore:
        """A view for frozen evaluation: reads pass through, every write is refused and logged."""
        return ReadOnlyExperienceStore(self)

    def close(self) -> None:
        """Let chromadb stop this folder's system (its sqlite and tokio worker threads) once no
        other client of the folder is open: otherwise it lives as long as the process, and a
        process that runs many runs (an experiment's arms, a test suite) gathers their threads.
        The store is unusable afterwards; closing twice is harmless."""
        self._client.close()


def _open_beneath(root: Path, folder: Path) -> int:
    """A descriptor of ``folder`` (inside ``root``), made where missing, reached from ``root``
    one name at a time with ``O_NOFOLLOW``: a link on the way fails, it is never followed."""
    descriptor = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in folder.relative_to(root).parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=descriptor)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


class ReadOnlyExperienceStore:
    """The store as methods see it during frozen evaluation.

    Writes raise :class:`FrozenStoreError` and are appended to ``violations``: a method that
    catches the exception still leaves a record that marks the run invalid.
    """

    def __init__(self, store: ExperienceStore) -> None:
        self._store = store
        self.violations: list[WriteViolation] = []

    @property
    def name(self) -> str:
        return self._store.name

    @property
    def embedder(self) -> Embedder:
        return self._store.embedder

    def _refuse(self, operation: str, ids: Iterable[str]) -> FrozenStoreError:
        violation = WriteViolation(operation, tuple(ids))
        self.violations.append(violation)
        return FrozenStoreError(
            f"The experience store '{self.name}' is frozen during evaluation: writes are not "
            f"allowed ({operation} of {list(violation.ids)} refused)"
        )

    def add(self, experiences: list[Experience], **_: Any) -> None:
        raise self._refuse("add", [experience.experience_id for experience in experiences])

    def update_metadata(self, experience_id: str, changes: dict[str, Any]) -> None:
        raise self._refuse("update_metadata", [experience_id])

    def update_metadata_many(self, changes: Mapping[str, dict[str, Any]]) -> None:
        raise self._refuse("update_metadata", list(changes))

    def restore(self, path: str | Path) -> None:
        raise self._refuse("restore", [str(path)])

    def delete(self, ids: Iterable[str]) -> None:
        raise self._refuse("delete", ids)

    def get(self, ids: Iterable[str]) -> list[Experience]:
        return self._store.get(ids)

    def all(self, kind: str | None = None, where: dict[str, Any] | None = None) -> list[Experience]:
        return self._store.all(kind=kind, where=where)

    def query(self, text: str, k: int, **filters: Any) -> list[tuple[Experience, float]]:
        """:meth:`ExperienceStore.query`, which checks the filters' names."""
        return self._store.query(text, k, **filters)

    def query_vector(self, vector: np.ndarray | Sequence[float], k: int, **filters: Any
                     ) -> list[tuple[Experience, float]]:
        return self._store.query_vector(vector, k, **filters)

    def snapshot(self, path: str | Path, *, within: str | Path | None = None) -> Path:
        return self._store.snapshot(path, within=within)

    read_snapshot_header = staticmethod(ExperienceStore.read_snapshot_header)

    def count(self, kind: str | None = None) -> int:
        return self._store.count(kind)

    def size(self) -> dict[str, int]:
        return self._store.size()

    def digest(self) -> str:
        return self._store.digest()

    def read_only(self) -> ReadOnlyExperienceStore:
        return self
