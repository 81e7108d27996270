"""The experience store: every method's learned experiences, in one chromadb collection.

Why one shared store: the harness can measure, digest and freeze what a method learned without
knowing the method. The store always passes vectors computed by the run's :class:`Embedder`;
chromadb's own embedding function is never used (it would download a model).

Metadata layout in chromadb (values must be str/int/float/bool there):

* reserved keys ``kind``, ``source_split``, ``source_task_ids`` (a JSON list) and ``_json_keys``;
* every key of ``Experience.metadata`` at top level, so ``where`` filters work on it directly
  (``{"q_value": {"$gt": 0}}``, ``{"task_type": "pick"}``); values that chromadb cannot hold
  (lists, dicts, None) are JSON-encoded and their keys listed in ``_json_keys`` to decode on read.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chromadb
import numpy as np
from chromadb.config import Settings

from arena.core.embedder import Embedder
from arena.core.types import Experience, Provenance

DEFAULT_COLLECTION = "experiences"
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


def _settings() -> Settings:
    # A fresh object each time: chromadb clients mutate the Settings they are given.
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


def _combine_filters(clauses: list[dict[str, Any]]) -> dict[str, Any] | None:
    """chromadb's ``$and`` needs at least two clauses, so one clause is passed as it is."""
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _folder_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


class ExperienceStore:
    """Experiences with their embeddings, persisted under ``path`` (or in memory if None).

    Reopening the same folder with the same embedder sees the same experiences and digest, which
    is what ``--resume`` relies on.
    """

    def __init__(
        self, path: str | Path | None, embedder: Embedder, name: str = DEFAULT_COLLECTION
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.embedder = embedder
        self.name = name
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
        self._collection = client.get_or_create_collection(
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

    # -- writes --------------------------------------------------------------------------------

    def add(self, experiences: list[Experience]) -> None:
        """Insert or replace experiences by ``experience_id`` (re-adding one is idempotent)."""
        latest = {experience.experience_id: experience for experience in experiences}
        items = list(latest.values())
        for start in range(0, len(items), self._max_batch):
            batch = items[start:start + self._max_batch]
            self._collection.upsert(
                ids=[experience.experience_id for experience in batch],
                documents=[experience.text for experience in batch],
                metadatas=[_encode_metadata(experience) for experience in batch],
                embeddings=self.embedder.embed([experience.text for experience in batch]),
            )

    def update_metadata(self, experience_id: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into one experience's metadata (Q-values, weights, votes).

        Text and embedding are untouched. Raises KeyError for an unknown id.
        """
        found = self.get([experience_id])
        if not found:
            raise KeyError(f"No experience '{experience_id}' in store '{self.name}'")
        experience = found[0]
        experience.metadata.update(changes)
        self._collection.update(ids=[experience_id], metadatas=[_encode_metadata(experience)])

    def delete(self, ids: Iterable[str]) -> None:
        """Remove experiences; unknown ids are ignored."""
        ids = list(ids)
        if ids:
            self._collection.delete(ids=ids)

    # -- reads ---------------------------------------------------------------------------------

    def get(self, ids: Iterable[str]) -> list[Experience]:
        """The experiences with these ids, in the order asked; ids not in the store are skipped."""
        ids = list(ids)
        if not ids:
            return []
        result = self._collection.get(ids=ids, include=["documents", "metadatas"])
        by_id = {
            experience_id: _decode(experience_id, document, metadata)
            for experience_id, document, metadata in zip(
                result["ids"], result["documents"], result["metadatas"]
            )
        }
        return [by_id[experience_id] for experience_id in ids if experience_id in by_id]

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
    ) -> list[tuple[Experience, float]]:
        """The ``k`` experiences nearest to ``text`` with their cosine similarity, best first."""
        if k <= 0 or self._collection.count() == 0:
            return []
        filters = {"kind": kind, "task_type": task_type, "source_split": source_split}
        clauses = [{key: value} for key, value in filters.items() if value is not None]
        if where:
            clauses.append(where)
        result = self._collection.query(
            query_embeddings=self.embedder.embed([text]),
            n_results=k,
            where=_combine_filters(clauses),
            include=["documents", "metadatas", "distances"],
        )
        return [
            (_decode(experience_id, document, metadata), 1.0 - float(distance))
            for experience_id, document, metadata, distance in zip(
                result["ids"][0], result["documents"][0], result["metadatas"][0],
                result["distances"][0],
            )
        ]

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
        disk_bytes = _folder_bytes(self.path) if self.path is not None else 0
        return {
            "items": len(result["ids"]),
            "bytes": content_bytes + disk_bytes,
            "content_bytes": content_bytes,
            "disk_bytes": disk_bytes,
        }

    def digest(self) -> str:
        """sha256 of the full contents (ids, texts, metadata, float32 embeddings) in id order.

        It depends on contents only, so it changes exactly when a write changes what is stored
        and is identical after reopening the folder; reads never touch it.
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
            digest.update(np.asarray(embedding, dtype=np.float32).tobytes())
        return digest.hexdigest()

    def read_only(self) -> ReadOnlyExperienceStore:
        """A view for frozen evaluation: reads pass through, every write is refused and logged."""
        return ReadOnlyExperienceStore(self)


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

    def add(self, experiences: list[Experience]) -> None:
        raise self._refuse("add", [experience.experience_id for experience in experiences])

    def update_metadata(self, experience_id: str, changes: dict[str, Any]) -> None:
        raise self._refuse("update_metadata", [experience_id])

    def delete(self, ids: Iterable[str]) -> None:
        raise self._refuse("delete", ids)

    def get(self, ids: Iterable[str]) -> list[Experience]:
        return self._store.get(ids)

    def all(self, kind: str | None = None, where: dict[str, Any] | None = None) -> list[Experience]:
        return self._store.all(kind=kind, where=where)

    def query(
        self,
        text: str,
        k: int,
        *,
        kind: str | None = None,
        task_type: str | None = None,
        source_split: str | None = None,
        where: dict[str, Any] | None = None,
    ) -> list[tuple[Experience, float]]:
        return self._store.query(
            text, k, kind=kind, task_type=task_type, source_split=source_split, where=where
        )

    def count(self, kind: str | None = None) -> int:
        return self._store.count(kind)

    def size(self) -> dict[str, int]:
        return self._store.size()

    def digest(self) -> str:
        return self._store.digest()

    def read_only(self) -> ReadOnlyExperienceStore:
        return self
