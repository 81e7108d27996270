"""LLM backend on Hugging Face transformers: in-process, CPU or CUDA, batched.

``choose`` is the hot path of every agent step (one admissible action out of ~25), so it never
generates text: it scores each option as the assistant's reply. The prompts are run once
(prefill, left-padded across prompts). Then the options of each prompt, merged into a prefix
tree so that shared prefixes such as ``go to`` are fed once, follow the prompt in one segment
whose attention mask lets each token see the prompt's KV cache and its own option's earlier
tokens only. All options of all prompts of a batch are scored in that one extra forward; the
cache is neither recomputed nor copied per option (copies would cost ~6 MB per option and
prompt here).

An option is scored as ``option text + end-of-turn token`` (``<|im_end|>`` for SmolLM2): the
probability that the reply is exactly this option and then stops. Without the end token an
option that is a prefix of another ("go to desk" vs "go to desk 2") would always score at least
as high as the longer one.

On a CPU the forward pass is compute-bound: a batch of 6 prompts costs as much as 6 prompts run one
by one (measured: 2.17 s against 6 x 0.41 s), so batching saves little, while the prompts of one
episode repeat their start (system message, task, retrieved experience) at every step. With
``prefix_cache`` on (the default on CPU) ``choose`` runs each prompt alone and reuses the KV
cache of the longest prefix it shares with a recently scored prompt, computing only the rest.
transformers has no such cache across calls, hence :class:`_PrefixCache`.

Log-probs are always those of the model itself (temperature 1, no nucleus cut), whatever the
sampling parameters, so they can be compared across calls and fed to a trainer.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from arena.backends import cpu_attention
from arena.backends.common import CountingBackend, ModelSettings
from arena.backends.embedded import (
    EMBEDDED_MODEL_ID,
    TINY_MODEL_ID,
    embedded_model_dir,
    tiny_model_dir,
)
from arena.core.contract.llm import Chat, Choice, Generation, ParamsPerPrompt, SamplingParams, per_prompt, sample_option
from arena.core.contract.method_config import typed_config
from arena.core.host.allocator import return_freed_memory
from arena.core.host.cache import read_source
from arena.core.host.torch_utils import eval_mode, transformers_without_sklearn
from arena.warmstart.build import WarmStart
from arena.warmstart.build import apply as apply_warmstart
from arena.warmstart.build import resolve as resolve_warmstart

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
#: Messages dropped at a time when a long chat is cut to fit the context (an even number: whole
#: exchanges of a transcript).
TRUNCATION_BLOCK = 8
#: Tokens kept free for the reply when a chat is cut to fit for ``choose``.
CHOICE_RESERVE = 32
#: Uncached prompt tokens computed per forward when scoring from the prefix cache: a prompt of
#: 2,000 new tokens in one forward materialised 9 x 2,000 x 2,000 attention scores per layer
#: (the late steps of 8 long episodes, whose states no longer all fit the cache, pushed the first
#: command past 2.2 GiB); in chunks the scores are 4 times smaller and the work the same.
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class TransformersConfig(ModelSettings):
    """The ``llm`` config section this backend reads; see ``config.yaml`` for each field."""

    batch_size: int = 16
    prefix_cache: bool | str = "auto"
    prefix_cache_entries: int = 32
    prefix_cache_tokens: int | str = "auto"
    warmstart: str | None = "auto"

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> TransformersConfig:
        """Take this backend's fields from ``cfg``, typed; other keys belong to the harness."""
        return typed_config(cfg, cls, prefix="llm.", ignore=(), others=True)


class _OptionTree:
    """The options of one prompt as a prefix tree of the tokens that must be fed to the model.

    Every token of an option but the last is a node; the last is only predicted. Nodes are
    numbered in creation order, so a parent always precedes its children.
    """

    def __init__(self, options: list[list[int]]) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []  # -1: a child of the prompt
        self.depths: list[int] = []
        #: Per option, per token: the node whose output predicts it (-1: the prompt's last token).
        self.predictors: list[list[int]] = []
        index: dict[tuple[int, int], int] = {}
        for option in options:
            parent, path = -1, []
            for token in option[:-1]:
                path.append(parent)
                if (parent, token) not in index:
                    index[parent, token] = len(self.tokens)
                    self.tokens.append(token)
                    self.parents.append(parent)
                    self.depths.append(self.depths[parent] + 1 if parent >= 0 else 0)
                parent = index[parent, token]
            self.predictors.append([*path, parent])


PromptKey = tuple[int, ...]
#: The share of a cached prompt a new prompt must reuse for the new one to replace it in the
#: prefix cache (:meth:`_PrefixCache.store`): a step's next prompt in the window layout reuses
#: the system message, the task and the experience shown (about 70 % of a memrl prompt), while
#: another episode's prompt shares the system message alone (about 10 %).
SUPERSEDED = 0.5


class _PrefixCache:
    """The KV caches of recently scored prompts, to reuse for a prompt that starts the same way.

    Entries hold per-layer key/value tensors of one prompt (batch 1). A lookup hands out views of
    the part shared with the new prompt: the model's cache layers concatenate new states onto
    them into fresh tensors, never writing into them, so one entry serves any number of later
    prompts (the system message is shared by every episode; in the transcript layout the whole
    previous step by the next step of its episode). Least recently used entries are dropped
    beyond ``capacity`` entries or ``max_tokens`` positions in all, so memory stays bounded
    however many episodes are alive; a prompt longer than ``max_tokens`` is not kept (its next
    step is recomputed). Cleared whenever the weights change.
    """

    def __init__(self, capacity: int, max_tokens: int) -> None:
        self.capacity = capacity
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], _CachedPrompt] = OrderedDict()
        self._held = 0
        self.tokens_reused = 0
        self.tokens_computed = 0

    def clear(self) -> None:
        self._entries.clear()
        self._held = 0

    @property
    def tokens_held(self) -> int:
        return self._held

    def bytes_held(self) -> int:
        """Bytes of the key/value tensors the entries keep alive (views keep whole tensors)."""
        seen: dict[int, int] = {}
        for entry in self._entries.values():
            for keys, values in entry.layers:
                for tensor in (keys, values):
                    storage = tensor.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def longest(self, row: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None, PromptKey | None]:
        """Length of the longest cached prefix of ``row`` (at most ``len(row) - 1``, since the
        last prompt token must be fed to predict the reply), views of its key/values, and the
        entry they come from (for :meth:`store`)."""
        limit = len(row) - 1
        if limit <= 0 or not self._entries:
            return 0, None, None
        target = np.asarray(row, dtype=np.int64)
        best_len, best_key = 0, None
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), limit)
            if n <= best_len:
                continue
            differ = np.flatnonzero(entry.tokens[:n] != target[:n])
            shared = int(differ[0]) if differ.size else n
            if shared > best_len:
                best_len, best_key = shared, key
        if best_key is None:
            return 0, None, None
        self._entries.move_to_end(best_key)
        layers = [(keys[:, :, :best_len], values[:, :, :best_len])
                  for keys, values in self._entries[best_key].layers]
        return best_len, layers, best_key

    def store(self, row: list[int], cache: Any, served_by: PromptKey | None = None, reused: int = 0) -> None:
        """Keep the first ``len(row)`` positions of ``cache`` (later ones are option nodes).

        ``served_by``, the entry ``row``'s lookup reused ``reused`` positions of, is dropped
        when that was most of it (:data:`SUPERSEDED`): it is then the previous step of the same
        episode, and the new entry holds everything of it a later prompt can share (the
        window layout's next prompt shares only the reused part; the transcript's extends the
        new one). Kept beside its successor, with its recency renewed by the lookup, each
        episode held two entries: 8 episodes of 900-token prompts then passed the token bound,
        and the bound evicted the one entry an episode's next step needed (py-spy samples of a
        memrl evaluation found 38 % of its time in prompts computed again past the system
        message). An entry another episode's prompt shared only a little of (the system
        message) stays: it is that episode's."""
        length, key = len(row), tuple(row)
        if length > self.max_tokens:
            return
        if served_by is not None and served_by != key and served_by in self._entries \
                and reused >= SUPERSEDED * len(self._entries[served_by].tokens):
            self._held -= len(self._entries.pop(served_by).tokens)
        if key in self._entries:
            self._held -= len(self._entries.pop(key).tokens)
        layers = [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in cache.layers]
        self._entries[key] = _CachedPrompt(np.asarray(row, dtype=np.int64), layers)
        self._held += length
        while len(self._entries) > self.capacity or self._held > self.max_tokens:
            _, dropped = self._entries.popitem(last=False)
            self._held -= len(dropped.tokens)


@dataclass
class _CachedPrompt:
    tokens: np.ndarray
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def _reused_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None, config: Any) -> Any:
    """A DynamicCache that starts from ``layers`` as they are. Filling it through its constructor
    would concatenate them onto empty tensors: one copy of the whole prefix per step."""
    from transformers import DynamicCache

    if not layers:
        return None
    cache = DynamicCache(config=config)
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.lazy_initialization(keys, values)
        cast(Any, layer).keys, cast(Any, layer).values = keys, values
    return cache


def auto_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware computes it natively, else float32.

    Measured with benchmarks/bench_llm.py on a 2-core AVX-512-BF16 Xeon, bfloat16 runs SmolLM2
    1.9x faster than float32 in ``choose`` and 1.35x in ``generate``; on a 2-core AVX2-only EPYC
    bfloat16 is emulated and a 110-token forward takes 5.7x as long as in float32. The answer
    therefore depends on the machine: results record it, and the leaderboard never pools two
    (docs/numerics.md).
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32


class ModelNotFoundError(FileNotFoundError, ValueError):
    """``llm.model`` names no model: a user's error (the CLI prints it as one line), still a
    FileNotFoundError for code that catches that."""


#: The fewest positions an ``auto`` prefix cache holds: a few prompts of a small model.
MIN_CACHE_TOKENS = 2048


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of keys and values one prompt position holds across the model's layers."""
    shape = model.config  # the model's architecture, not a run's config
    heads = getattr(shape, "num_key_value_heads", None) or shape.num_attention_heads
    head_dim = getattr(shape, "head_dim", None) or shape.hidden_size // shape.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * int(shape.num_hidden_layers) * int(heads) * int(head_dim) * element


def resolve_cache_tokens(setting: int | str, model: Any) -> int:
    """``llm.prefix_cache_tokens``: a number as given, or ``auto``: the positions whose keys and
    values weigh what the weights do (SmolLM2-135M: about 11,700 in either dtype, 0.5 GB in
    float32), so the cache grows with the model, not past it (it was a fixed 65,536: 3 GB of
    float32 states for a 0.5 GB model)."""
    if setting != "auto":
        if not isinstance(setting, int) or isinstance(setting, bool) or setting < 0:
            raise ValueError(f"llm.prefix_cache_tokens must be auto or a number of tokens >= 0: {setting!r}")
        return setting
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(MIN_CACHE_TOKENS, weights // kv_bytes_per_token(model))


def resolve_model(name: str) -> tuple[Path, str]:
    """The folder and model id of ``"embedded"``, ``"tiny"`` or a local Hugging Face folder."""
    if name == "embedded":
        return embedded_model_dir(), EMBEDDED_MODEL_ID
    if name == "tiny":
        return tiny_model_dir(), TINY_MODEL_ID
    folder = Path(name).expanduser()
    fix = ("set llm.model to a folder holding a Hugging Face model (config.json and weights), "
           "or to 'embedded' (the packaged SmolLM2) or 'tiny'")
    if not folder.is_dir():
        raise ModelNotFoundError(
            f"llm.model={name!r} is neither 'embedded', 'tiny' nor a local model folder: {fix}.")
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"llm.model={name!r} is a folder without a model's config.json: {fix}.")
    return folder, folder.name


class TransformersBackend(CountingBackend):
    """A causal LM run in this process; ``model`` and ``tokenizer`` are public so a trainer can
    update the very module that serves the agent (then call :meth:`mark_weights_changed`)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.config = TransformersConfig.from_mapping(config or {})
        if self.config.batch_size < 1:
            raise ValueError("llm.batch_size must be at least 1")
        if self.config.threads is not None:
            torch.set_num_threads(self.config.threads)
        self.folder, self.model_id = resolve_model(self.config.model)
        self.device = torch.device(self.config.device)
        if self.config.dtype != "auto" and self.config.dtype not in _DTYPES:
            raise ValueError(f"llm.dtype must be auto, bfloat16 or float32: {self.config.dtype!r}")
        self.dtype = (
            auto_dtype(self.device) if self.config.dtype == "auto" else _DTYPES[self.config.dtype]
        )

        transformers_without_sklearn()
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # Arena draws its own progress bars
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(self.folder, dtype=self.dtype, local_files_only=True)
        #: The shared warm-start base merged into the weights (``llm.warmstart``), or None. A run's
        #: ``auto`` is resolved when its config is composed; a backend built from its YAML alone (a
        #: method's auxiliary model) has no world to resolve it for and serves the model as shipped.
        self.warmstart: WarmStart | None = None
        if self.config.warmstart and self.config.warmstart != "auto":
            self.warmstart = resolve_warmstart(self.config.warmstart, self.folder)
            model = apply_warmstart(model, self.warmstart)
        self.model: Any = model.to(self.device).eval()
        cpu_attention.use_on(self.model)  # batched decoding up to 2x faster on a CPU, same numbers
        self._pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id
        )
        self._end_of_turn = self._end_of_turn_ids()
        self._stop_ids = torch.tensor(
            sorted({*self._end_of_turn[:1], self.tokenizer.eos_token_id}), device=self.device
        )
        self._digest: str | None = None
        self._lock = threading.Lock()
        prefix_cache = self.config.prefix_cache
        if prefix_cache not in ("auto", True, False):
            raise ValueError(f"llm.prefix_cache must be auto, true or false: {prefix_cache!r}")
        if prefix_cache == "auto":
            prefix_cache = self.device.type == "cpu"
        #: Prompt positions the prefix cache may hold (``llm.prefix_cache_tokens``; auto: as many
        #: as weigh what the model's weights weigh).
        self.prefix_cache_tokens = resolve_cache_tokens(self.config.prefix_cache_tokens, self.model)
        self._prefix_cache = (
            _PrefixCache(self.config.prefix_cache_entries, self.prefix_cache_tokens)
            if prefix_cache
            else None
        )

    # ------------------------------------------------------------------------------------------
    # LLMBackend
    # ------------------------------------------------------------------------------------------

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        """Sample (or greedily decode) a reply to each chat, ``batch_size`` chats per forward.

        ``token_ids`` and ``logprobs`` include the end-of-turn token when the reply ended with
        one; ``text`` never does.
        """
        encoded = [self.encode_prompt(chat, reply_tokens=params.max_new_tokens) for chat in prompts]
        rows, cut = [ids for ids, _ in encoded], [was_cut for _, was_cut in encoded]
        generator = self._generator(params.seed, self.device)
        by_index: dict[int, Generation] = {}
        with self._inference():
            for chunk in self._chunks(rows):
                replies = self._generate_chunk([rows[i] for i in chunk], params, generator)
                for i, (token_ids, logprobs) in zip(chunk, replies):
                    by_index[i] = Generation(
                        text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                        token_ids=token_ids,
                        logprobs=logprobs,
                        tokens_in=len(rows[i]),
                        tokens_out=len(token_ids),
                        prompt_token_ids=list(rows[i]),
                        prompt_cut=cut[i],
                    )
        return self._count([by_index[i] for i in range(len(rows))])

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        """Score every option as the assistant's reply and pick one per chat.

        The pick is :func:`arena.core.contract.llm.sample_option` with each prompt's own params (greedy:
        the highest summed log-prob, first on ties). ``token_ids``/``logprobs`` are the chosen
        option's tokens followed by the end-of-turn token, exactly what was scored.
        """
        return self._count(self.choose_with(prompts, options, params, self._score_rows))

    def choose_with(
        self,
        prompts: list[Chat],
        options: list[list[str]],
        params: ParamsPerPrompt,
        score: Callable[[list[list[int]], list[list[list[int]]]], Sequence[list[list[float]]]],
    ) -> list[Choice]:
        """:meth:`choose` with another scorer: ``score(prompt rows, option ids)`` gives each
        option's per-token log-probs. The checks, this model's encoding and the pick are shared
        with backends that score elsewhere (vLLM); usage is not counted here."""
        params_each = per_prompt(params, len(prompts))
        if len(prompts) != len(options):
            raise ValueError(f"{len(prompts)} prompts but {len(options)} option lists")
        for i, opts in enumerate(options):
            if not opts:
                raise ValueError(f"prompt {i} has no options to choose from")
        option_ids = [[self._encode_option(text) for text in opts] for opts in options]
        rows = [
            # A fixed reserve (unless an option is longer): the cut of a long transcript must
            # not move with each step's longest option, or consecutive prompts stop sharing
            # their prefix.
            self._encode_prompt(chat, reply_tokens=max(CHOICE_RESERVE, *map(len, opts)))
            for chat, opts in zip(prompts, option_ids)
        ]
        scores = score(rows, option_ids)
        results = []
        for i, row in enumerate(rows):
            totals = [sum(token_logprobs) for token_logprobs in scores[i]]
            index = sample_option(totals, params_each[i])
            results.append(
                Choice(
                    index=index,
                    text=options[i][index],
                    token_ids=option_ids[i][index],
                    logprobs=scores[i][index],
                    option_logprobs=totals,
                    tokens_in=len(row),
                    tokens_out=len(option_ids[i][index]),
                    prompt_token_ids=list(row),
                )
            )
        return results

    def _score_rows(
        self, rows: list[list[int]], option_ids: list[list[list[int]]]
    ) -> list[list[list[float]]]:
        """Per-token log-probs of every option: prompt by prompt from the prefix cache, or in
        length-sorted batches."""
        scores: dict[int, list[list[float]]] = {}
        with self._inference():
            if self._prefix_cache is not None:
                for i, row in enumerate(rows):
                    scores[i] = self._score_cached(row, option_ids[i], self._prefix_cache)
                    return_freed_memory()
            else:
                for chunk in self._chunks(rows):
                    chunk_scores = self._score_chunk(
                        [rows[i] for i in chunk], [option_ids[i] for i in chunk]
                    )
                    scores.update(zip(chunk, chunk_scores))
        return [scores[i] for i in range(len(rows))]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def weights_digest(self, fresh: bool = False) -> str:
        """SHA-256 over every state-dict tensor (name, dtype, shape, bytes) in name order.

        Hashing ~0.5 GB takes a second or two, so the digest is cached until
        :meth:`mark_weights_changed`; ``fresh=True`` (the frozen-state check) always rehashes,
        so weights changed in place without that call are still caught.
        """
        if self._digest is None or fresh:
            digest = hashlib.sha256()
            for name, tensor in sorted(self.model.state_dict().items()):
                data = tensor.detach().to("cpu").contiguous().reshape(-1)
                digest.update(f"{name}|{data.dtype}|{tuple(tensor.shape)}|".encode())
                digest.update(data.view(torch.uint8).numpy())
            self._digest = digest.hexdigest()
        return self._digest

    def mark_weights_changed(self) -> None:
        """Call after changing the weights in place (a training step): refreshes the digest and
        drops cached prompt states computed with the old weights."""
        self._digest = None
        self.drop_cached_states()

    def drop_cached_states(self) -> None:
        """Drop the prompt states cached with the current weights (a trainer's call as its step
        starts: they are stale once it ends, and their memory serves the step)."""
        if self._prefix_cache is not None:
            with self._lock:
                self._prefix_cache.clear()

    @property
    def prefix_cache_stats(self) -> dict[str, int]:
        """Prompt tokens taken from the prefix cache and computed, since the backend started."""
        if self._prefix_cache is None:
            return {}
        return {
            "tokens_reused": self._prefix_cache.tokens_reused,
            "tokens_computed": self._prefix_cache.tokens_computed,
        }

    def prefix_cache_memory(self) -> dict[str, int]:
        """Prompt positions and bytes of key/value tensors the prefix cache holds now."""
        if self._prefix_cache is None:
            return {"tokens": 0, "bytes": 0}
        with self._lock:
            return {"tokens": self._prefix_cache.tokens_held, "bytes": self._prefix_cache.bytes_held()}

    def describe(self) -> dict[str, Any]:
        description: dict[str, Any] = {
            "id": self.model_id,
            "weights_sha256": self.weights_digest(),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "folder": str(self.folder),
        }
        if self.warmstart is not None:
            description["warmstart"] = self.warmstart.describe()
        gguf_sha256 = read_source(self.folder).get("gguf_sha256")
        if gguf_sha256:
            description["source_gguf_sha256"] = gguf_sha256
        return description

    # ------------------------------------------------------------------------------------------
    # Encoding
    # ------------------------------------------------------------------------------------------

    def _render(self, chat: Chat) -> list[int]:
        """Chat-template ids; a chat that ends with an assistant message is continued from it
        (a reply prefix, e.g. the opening of a JSON object), not answered."""
        if chat and chat[-1]["role"] == "assistant":
            text = self.tokenizer.apply_chat_template(
                chat, tokenize=False, continue_final_message=True
            )
        else:
            text = self.tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=True
            )
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _encode_prompt(self, chat: Chat, reply_tokens: int) -> list[int]:
        """Chat-template token ids, left-truncated so prompt + reply fit in ``max_context``."""
        return self.encode_prompt(chat, reply_tokens)[0]

    def encode_prompt(self, chat: Chat, reply_tokens: int) -> tuple[list[int], bool]:
        """:meth:`_encode_prompt`'s ids and whether the chat had to be cut to fit."""
        budget = self.config.max_context - reply_tokens
        ids = self._render(chat)
        return (ids, False) if len(ids) <= budget else (self._truncate(chat, budget), True)

    def _truncate(self, chat: Chat, budget: int) -> list[int]:
        """Drop the oldest turns after the first message, then that message, then the start of
        the last one; never the system message.

        The end of a prompt (the current observation and admissible actions) matters most to
        the next step, the system message carries the rules and the first message the task, so
        they are kept longest. Turns go in blocks of :data:`TRUNCATION_BLOCK` messages: the cut
        then stays put for several steps of a growing transcript, whose prompts keep sharing
        their prefix (a cut moved at every step would make every step compute its whole prompt).
        """
        head = list(chat[:1]) if chat and chat[0]["role"] == "system" else []
        # A reply prefix (a final assistant message) is kept whole, like the system message.
        tail = list(chat[-1:]) if len(chat) > len(head) + 1 and chat[-1]["role"] == "assistant" else []
        body = list(chat[len(head) : len(chat) - len(tail)])
        middle = len(body) - 2  # the turns between the first message and the last
        for end in range(TRUNCATION_BLOCK, middle + TRUNCATION_BLOCK, TRUNCATION_BLOCK):
            ids = self._render(head + body[:1] + body[1 + min(end, middle) :] + tail)
            if len(ids) <= budget:
                return ids
        body = body[:1] + body[-1:] if len(body) > 1 else body
        while len(body) > 1:
            body.pop(0)
            ids = self._render(head + body + tail)
            if len(ids) <= budget:
                return ids
        if not body:
            raise ValueError(f"the system message alone exceeds the prompt budget of {budget}")
        last = body[-1]
        content = self.tokenizer(last["content"], add_special_tokens=False).input_ids
        keep = budget - len(self._render(head + [{**last, "content": ""}] + tail))
        while keep > 0:
            text = self.tokenizer.decode(content[-keep:])
            ids = self._render(head + [{**last, "content": text}] + tail)
            if len(ids) <= budget:
                return ids
            keep -= len(ids) - budget
        raise ValueError(
            f"no room for the last message in the prompt budget of {budget} tokens (llm.max_context"
            " minus the reply); raise llm.max_context or shorten the system message"
        )

    def _end_of_turn_ids(self) -> list[int]:
        """The tokens the chat template puts after an assistant message (``<|im_end|>``).

        Read off the template itself, so any chat model's own end-of-turn marker is used;
        trailing whitespace after it is not part of the reply.
        """
        marker = "\x00ARENA\x00"
        chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False)
        suffix = text.split(marker, 1)[1].rstrip() if marker in text else ""
        ids = self.tokenizer(suffix, add_special_tokens=False).input_ids if suffix else []
        return ids or [self.tokenizer.eos_token_id]

    def _encode_option(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids + self._end_of_turn

    # ------------------------------------------------------------------------------------------
    # Model calls
    # ------------------------------------------------------------------------------------------

    @contextmanager
    def _inference(self) -> Iterator[None]:
        """One caller at a time, in eval mode (a trainer may have left the module training);
        what the call freed goes back to the system before the next one."""
        with self._lock, torch.inference_mode(), eval_mode(self.model):
            try:
                yield
            finally:
                return_freed_memory()

    def _chunks(self, rows: Sequence[list[int]]) -> Iterator[list[int]]:
        """Indices of ``rows`` in batches of similar length, so left padding wastes little."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        for start in range(0, len(order), self.config.batch_size):
            yield order[start : start + self.config.batch_size]

    def _left_pad(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, ...]:
        """Token ids, attention mask and position ids of left-padded prompts."""
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, width - len(row) :] = torch.tensor(row)
            mask[b, width - len(row) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def _prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any = None
    ) -> tuple[Any, torch.Tensor]:
        """Run the prompts once: their KV cache (into ``cache`` where given) and the log-probs of
        the first reply token."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.past_key_values, out.logits[:, -1].float().log_softmax(-1)

    def _generate_chunk(
        self, rows: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[tuple[list[int], list[float]]]:
        from arena.backends.reserved_cache import reserved_cache

        ids, mask, positions = self._left_pad(rows)
        # The reply's positions reserved up front: each step writes its states in place.
        reserved = reserved_cache(self.model.config, ids.shape[1] + params.max_new_tokens)
        cache, logprobs = self._prefill(ids, mask, positions, reserved)
        next_position = positions[:, -1:] + 1
        finished = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        tokens, token_logprobs = [], []
        tails = [""] * len(rows)  # each reply's last characters, for its stop strings
        for step in range(params.max_new_tokens):
            token = _sample(logprobs, params, generator)
            tokens.append(token)
            token_logprobs.append(logprobs.gather(-1, token[:, None])[:, 0])
            finished |= torch.isin(token, self._stop_ids)
            if params.stop:  # a reply that wrote a stop string is done (cut exactly below)
                for b, piece in enumerate(self.tokenizer.batch_decode(token[:, None].tolist())):
                    tails[b] = (tails[b] + piece)[-64:]
                    if any(stop in tails[b] for stop in params.stop):
                        finished[b] = True
            if finished.all() or step == params.max_new_tokens - 1:
                break
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            cache, next_position = out.past_key_values, next_position + 1
            logprobs = out.logits[:, -1].float().log_softmax(-1)
            if step % 8 == 7:
                self._tell_generated(step + 1, params.max_new_tokens, len(rows))
        self._tell_generated(params.max_new_tokens, params.max_new_tokens, len(rows))
        if not tokens:
            return [([], []) for _ in rows]
        all_tokens = torch.stack(tokens, dim=1).tolist()
        all_logprobs = torch.stack(token_logprobs, dim=1).tolist()
        stops = set(self._stop_ids.tolist())
        replies = []
        for row_tokens, row_logprobs in zip(all_tokens, all_logprobs):
            end = next((k + 1 for k, t in enumerate(row_tokens) if t in stops), len(row_tokens))
            end = self._stop_string_end(row_tokens[:end], params.stop)
            replies.append((row_tokens[:end], row_logprobs[:end]))
        return replies

    def _stop_string_end(self, tokens: list[int], stop: tuple[str, ...]) -> int:
        """How many of ``tokens`` a reply keeps under the stop strings ``stop``: up to the token
        that completes the first of them (kept, as SGLang's ``no_stop_trim``); all without one.
        Decoding is causal, so the reply kept is the one generation would have stopped at; the
        tokens sampled after it are discarded, never shown or trained on."""
        if not stop or not any(s in self.tokenizer.decode(tokens, skip_special_tokens=True) for s in stop):
            return len(tokens)
        return next(k for k in range(1, len(tokens) + 1)
                    if any(s in self.tokenizer.decode(tokens[:k], skip_special_tokens=True) for s in stop))

    def _tell_generated(self, tokens: int, limit: int, replies: int) -> None:
        if self.on_generated is not None:
            self.on_generated(tokens, limit, replies)

    def _score_chunk(
        self, rows: list[list[int]], options: list[list[list[int]]]
    ) -> list[list[list[float]]]:
        """Per-token log-probs of every option of every prompt: prefill + one tree forward.

        The options of a prompt are merged into a prefix tree (``go to desk 1``, ``go to bed 2``
        share ``go to``) whose nodes are fed in one segment after the prompt. A node attends to
        the prompt's unpadded cache, its ancestors and itself, at position prompt length + depth:
        exactly the attention and positions of ``prompt + option`` run alone.
        """
        ids, mask, positions = self._left_pad(rows)
        cache, first_logprobs = self._prefill(ids, mask, positions)
        return self._score_options(rows, options, mask, cache, first_logprobs)

    def _score_cached(
        self, row: list[int], options: list[list[int]], prefix_cache: _PrefixCache
    ) -> list[list[float]]:
        """:meth:`_score_chunk` for one prompt from the longest cached prefix, in one forward.

        The prompt's uncached tokens and the option tree's nodes go in one segment: a prompt
        token sees the cached prefix and the prompt tokens before it; a node sees the whole
        prompt, its ancestors and itself. Those are the attention and positions of each
        ``prompt + option`` run alone, so nothing but the new tokens is computed, and the model
        is called once per step (its weights are read once, which dominates on a CPU for short
        segments).
        """
        reused, layers, served_by = prefix_cache.longest(row)
        shared = reused  # from the cache; ``reused`` then counts the chunks computed below too
        cache = _reused_cache(layers, self.model.config)
        while len(row) - reused > PREFILL_CHUNK:  # the last chunk goes with the option tree
            cache = self._prefill_from(cache, row[reused : reused + PREFILL_CHUNK], reused)
            reused += PREFILL_CHUNK
        tree = _OptionTree(options)
        fresh, nodes = len(row) - reused, len(tree.tokens)
        width = fresh + nodes
        allowed = torch.zeros((width, reused + width), dtype=torch.bool)
        allowed[:, :reused] = True
        allowed[:fresh, reused : reused + fresh] = torch.ones(fresh, fresh, dtype=torch.bool).tril()
        allowed[fresh:, reused : reused + fresh] = True
        allowed[fresh:, reused + fresh :] = self._tree_visibility(tree, nodes)
        additive = self._additive(allowed)
        positions = torch.cat(
            [torch.arange(reused, len(row)), len(row) + torch.tensor(tree.depths, dtype=torch.long)]
        )
        out = self.model.get_decoder()(
            input_ids=torch.tensor([row[reused:] + tree.tokens], device=self.device),
            attention_mask=additive,
            position_ids=positions[None].to(self.device),
            past_key_values=cache,
            use_cache=True,
        )
        # Only the last prompt position and the nodes go through the 49k-wide output layer.
        logprobs = (
            self.model.get_output_embeddings()(out.last_hidden_state[0, fresh - 1 :])
            .float()
            .log_softmax(-1)
        )
        (scores,) = self._gather_scores([tree], [options], logprobs[:1], logprobs[1:])
        prefix_cache.store(row, out.past_key_values, served_by, shared)
        prefix_cache.tokens_reused += shared
        prefix_cache.tokens_computed += len(row) - shared
        return scores

    def _prefill_from(self, cache: Any, tokens: list[int], start: int) -> Any:
        """The states of ``tokens`` (prompt positions ``start`` on) added to ``cache``, causally."""
        width = len(tokens)
        allowed = torch.ones((width, start + width), dtype=torch.bool)
        allowed[:, start:] = torch.ones(width, width, dtype=torch.bool).tril()
        out = self.model.get_decoder()(
            input_ids=torch.tensor([tokens], device=self.device),
            attention_mask=self._additive(allowed),
            position_ids=torch.arange(start, start + width, device=self.device)[None],
            past_key_values=cache,
            use_cache=True,
        )
        return out.past_key_values

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """A ``[queries, keys]`` (or ``[batch, queries, keys]``) visibility table as the model's
        additive attention mask, ``[batch, 1, queries, keys]`` on the model's device."""
        allowed = allowed[None, None] if allowed.dim() == 2 else allowed[:, None]
        additive = torch.zeros(allowed.shape, dtype=self.dtype)
        additive.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return additive.to(self.device)

    @staticmethod
    def _tree_visibility(tree: _OptionTree, width: int) -> torch.Tensor:
        """[width, width]: node i sees node j when j is i or one of its ancestors (padding
        nodes past the tree see themselves only, so no softmax row is empty)."""
        visible = torch.eye(width, dtype=torch.bool)
        for node, parent in enumerate(tree.parents):
            if parent >= 0:  # parents precede children, so their rows are complete
                visible[node] |= visible[parent]
        return visible

    def _score_options(
        self,
        rows: list[list[int]],
        options: list[list[list[int]]],
        mask: torch.Tensor,
        cache: Any,
        first_logprobs: torch.Tensor,
    ) -> list[list[list[float]]]:
        """Per-token option log-probs given the prompts' cache and first-token log-probs."""
        trees = [_OptionTree(opts) for opts in options]
        width = max(len(tree.tokens) for tree in trees)
        node_logprobs = first_logprobs[:0]
        if width:
            node_logprobs = self._score_nodes(trees, rows, mask, cache, width)
        return self._gather_scores(trees, options, first_logprobs, node_logprobs)

    @staticmethod
    def _gather_scores(
        trees: list[_OptionTree],
        options: list[list[list[int]]],
        first_logprobs: torch.Tensor,
        node_logprobs: torch.Tensor,
    ) -> list[list[list[float]]]:
        """Each option's per-token log-probs out of one table: row b of ``first_logprobs``
        predicts prompt b's first reply token, ``node_logprobs`` holds the trees' nodes in
        order (predictor -1 is the prompt's last position)."""
        node_offsets = [len(trees)]
        for tree in trees[:-1]:
            node_offsets.append(node_offsets[-1] + len(tree.tokens))
        table_rows, targets = [], []
        for b, (tree, opts) in enumerate(zip(trees, options)):
            for predictors, opt in zip(tree.predictors, opts):
                table_rows += [b if node < 0 else node_offsets[b] + node for node in predictors]
                targets += opt
        table = torch.cat([first_logprobs, node_logprobs])
        picked = table[torch.tensor(table_rows), torch.tensor(targets)].tolist()

        scores: list[list[list[float]]] = []
        cursor = 0
        for opts in options:
            row_scores = []
            for opt in opts:
                row_scores.append(picked[cursor : cursor + len(opt)])
                cursor += len(opt)
            scores.append(row_scores)
        return scores

    def _score_nodes(
        self,
        trees: list[_OptionTree],
        rows: list[list[int]],
        mask: torch.Tensor,
        cache: Any,
        width: int,
    ) -> torch.Tensor:
        """Next-token log-probs at every tree node (row-major over prompts), reusing ``cache``."""
        batch = len(trees)
        node_ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        node_positions = torch.zeros((batch, width), dtype=torch.long)
        visible = torch.stack([self._tree_visibility(tree, width) for tree in trees])
        for b, (tree, row) in enumerate(zip(trees, rows)):
            count = len(tree.tokens)
            node_ids[b, :count] = torch.tensor(tree.tokens, dtype=torch.long)
            node_positions[b, :count] = len(row) + torch.tensor(tree.depths, dtype=torch.long)
        prompt = mask.bool().cpu()[:, None, :].expand(batch, width, mask.shape[1])
        hidden = self.model.get_decoder()(
            input_ids=node_ids.to(self.device),
            attention_mask=self._additive(torch.cat([prompt, visible], dim=-1)),
            position_ids=node_positions.to(self.device),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        real = torch.tensor([[n < len(t.tokens) for n in range(width)] for t in trees])
        # Only real nodes go through the 49k-wide output layer.
        logits = self.model.get_output_embeddings()(hidden[real.to(self.device)])
        return logits.float().log_softmax(-1)

    # ------------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------------

    @staticmethod
    def _generator(seed: int | None, device: torch.device) -> torch.Generator:
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return generator


def _sample(
    logprobs: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> torch.Tensor:
    """Next token per row: argmax at temperature 0, else nucleus sampling at the temperature."""
    if params.temperature <= 0:
        return logprobs.argmax(-1)
    probs = (logprobs / params.temperature).softmax(-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        # Keep the smallest head of the distribution whose mass reaches top_p.
        sorted_probs[(sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def make_transformers_backend(cfg: Mapping[str, Any]) -> TransformersBackend:
    """Factory for the registry: ``cfg`` is the resolved ``llm`` section (DictConfig or dict)."""
    from arena.core.config.compose import to_plain

    return TransformersBackend(to_plain(cfg))
