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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

import arena
from arena.backends.embedded import (
    EMBEDDED_MODEL_ID,
    TINY_MODEL_ID,
    embedded_model_dir,
    read_source,
    tiny_model_dir,
)
from arena.core.torch_utils import eval_mode
from arena.core.llm import (
    Chat,
    Choice,
    Generation,
    LLMBackend,
    SamplingParams,
    per_prompt,
    sample_option,
)

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_Result = TypeVar("_Result", Generation, Choice)


@dataclass(frozen=True)
class TransformersConfig:
    """The ``llm`` config section this backend reads; see ``config.yaml`` for each field."""

    model: str = "embedded"
    dtype: str = "auto"
    threads: int | None = None
    max_context: int = 2048
    batch_size: int = 16
    device: str = "cpu"
    prefix_cache: bool | str = "auto"
    prefix_cache_entries: int = 32

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> TransformersConfig:
        """Take this backend's fields from ``cfg``; other keys belong to the harness."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in cfg.items() if key in names})


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


class _PrefixCache:
    """The KV caches of recently scored prompts, to reuse for a prompt that starts the same way.

    Entries hold per-layer key/value tensors of one prompt (batch 1). A lookup copies the part
    shared with the new prompt, so one entry serves any number of later prompts (the system
    message is shared by every episode; the task and experiences by every step of one). Least
    recently used entries are dropped beyond ``capacity``. Cleared whenever the weights change.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = (
            OrderedDict()
        )
        self.tokens_reused = 0
        self.tokens_computed = 0

    def clear(self) -> None:
        self._entries.clear()

    def longest(self, row: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Length of the longest cached prefix of ``row`` (at most ``len(row) - 1``, since the
        last prompt token must be fed to predict the reply) and copies of its key/values."""
        best_len, best_key = 0, None
        for key in self._entries:
            shared = _shared_prefix(key, row, limit=len(row) - 1)
            if shared > best_len:
                best_len, best_key = shared, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        layers = [
            (keys[:, :, :best_len].clone(), values[:, :, :best_len].clone())
            for keys, values in self._entries[best_key]
        ]
        return best_len, layers

    def store(self, row: list[int], cache: Any) -> None:
        """Keep the first ``len(row)`` positions of ``cache`` (later ones are option nodes)."""
        length = len(row)
        self._entries[tuple(row)] = [
            (layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in cache.layers
        ]
        self._entries.move_to_end(tuple(row))
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


def _shared_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def auto_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware computes it natively, else float32.

    Measured with benchmarks/bench_llm.py on this project's 2-core AVX-512-BF16 CPU, bfloat16
    runs SmolLM2 1.9x faster than float32 in ``choose`` and 1.35x in ``generate``; without
    native support bfloat16 is emulated and slower than float32.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32


def resolve_model(name: str) -> tuple[Path, str]:
    """The folder and model id of ``"embedded"``, ``"tiny"`` or a local Hugging Face folder."""
    if name == "embedded":
        return embedded_model_dir(), EMBEDDED_MODEL_ID
    if name == "tiny":
        return tiny_model_dir(), TINY_MODEL_ID
    folder = Path(name).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"llm.model={name!r} is neither 'embedded', 'tiny' nor a local model folder"
        )
    return folder, folder.name


class TransformersBackend(LLMBackend):
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

        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # Arena draws its own progress bars
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.folder, dtype=self.dtype, local_files_only=True
        )
        self.model.to(self.device).eval()
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
        self._prefix_cache = _PrefixCache(self.config.prefix_cache_entries) if prefix_cache else None

    # ------------------------------------------------------------------------------------------
    # LLMBackend
    # ------------------------------------------------------------------------------------------

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        """Sample (or greedily decode) a reply to each chat, ``batch_size`` chats per forward.

        ``token_ids`` and ``logprobs`` include the end-of-turn token when the reply ended with
        one; ``text`` never does.
        """
        rows = [self._encode_prompt(chat, reply_tokens=params.max_new_tokens) for chat in prompts]
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
                    )
        return self._count([by_index[i] for i in range(len(rows))])

    def choose(
        self,
        prompts: list[Chat],
        options: list[list[str]],
        params: SamplingParams | list[SamplingParams],
    ) -> list[Choice]:
        """Score every option as the assistant's reply and pick one per chat.

        The pick is :func:`arena.core.llm.sample_option` with each prompt's own params (greedy:
        the highest summed log-prob, first on ties). ``token_ids``/``logprobs`` are the chosen
        option's tokens followed by the end-of-turn token, exactly what was scored.
        """
        return self._count(self.choose_with(prompts, options, params, self._score_rows))

    def choose_with(
        self,
        prompts: list[Chat],
        options: list[list[str]],
        params: SamplingParams | list[SamplingParams],
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
            self._encode_prompt(chat, reply_tokens=max(map(len, opts)))
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

    def describe(self) -> dict[str, Any]:
        description = {
            "id": self.model_id,
            "weights_sha256": self.weights_digest(),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "folder": str(self.folder),
        }
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
        budget = self.config.max_context - reply_tokens
        ids = self._render(chat)
        return ids if len(ids) <= budget else self._truncate(chat, budget)

    def _truncate(self, chat: Chat, budget: int) -> list[int]:
        """Drop the oldest messages, then the start of the last one; never the system message.

        The end of a prompt (the current observation and admissible actions) matters most to
        the next step, and the system message carries the rules, so both are kept.
        """
        head = list(chat[:1]) if chat and chat[0]["role"] == "system" else []
        # A reply prefix (a final assistant message) is kept whole, like the system message.
        tail = list(chat[-1:]) if len(chat) > len(head) + 1 and chat[-1]["role"] == "assistant" else []
        body = list(chat[len(head) : len(chat) - len(tail)])
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
        """One caller at a time, in eval mode (a trainer may have left the module training)."""
        with self._lock, torch.inference_mode(), eval_mode(self.model):
            yield

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
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[Any, torch.Tensor]:
        """Run the prompts once: their KV cache and the log-probs of the first reply token."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.past_key_values, out.logits[:, -1].float().log_softmax(-1)

    def _generate_chunk(
        self, rows: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[tuple[list[int], list[float]]]:
        ids, mask, positions = self._left_pad(rows)
        cache, logprobs = self._prefill(ids, mask, positions)
        next_position = positions[:, -1:] + 1
        finished = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        tokens, token_logprobs = [], []
        for step in range(params.max_new_tokens):
            token = _sample(logprobs, params, generator)
            tokens.append(token)
            token_logprobs.append(logprobs.gather(-1, token[:, None])[:, 0])
            finished |= torch.isin(token, self._stop_ids)
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
        if not tokens:
            return [([], []) for _ in rows]
        all_tokens = torch.stack(tokens, dim=1).tolist()
        all_logprobs = torch.stack(token_logprobs, dim=1).tolist()
        stops = set(self._stop_ids.tolist())
        replies = []
        for row_tokens, row_logprobs in zip(all_tokens, all_logprobs):
            end = next((k + 1 for k, t in enumerate(row_tokens) if t in stops), len(row_tokens))
            replies.append((row_tokens[:end], row_logprobs[:end]))
        return replies

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
        """:meth:`_score_chunk` for one prompt, starting from the longest cached prefix."""
        reused, layers = prefix_cache.longest(row)
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=layers, config=self.model.config) if layers else None
        suffix = torch.tensor([row[reused:]], device=self.device)
        out = self.model(
            input_ids=suffix,
            position_ids=torch.arange(reused, len(row), device=self.device)[None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        first_logprobs = out.logits[:, -1].float().log_softmax(-1)
        mask = torch.ones((1, len(row)), dtype=torch.long, device=self.device)
        (scores,) = self._score_options([row], [options], mask, out.past_key_values, first_logprobs)
        prefix_cache.store(row, out.past_key_values)
        prefix_cache.tokens_reused += reused
        prefix_cache.tokens_computed += len(row) - reused
        return scores

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

        # One gather over [prompt rows; tree nodes]: predictor -1 is the prompt's last position.
        node_offsets = [len(rows)]
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
        # Padding nodes attend to themselves only, so no row of the softmax is empty (NaN).
        visible = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)
        for b, (tree, row) in enumerate(zip(trees, rows)):
            count = len(tree.tokens)
            node_ids[b, :count] = torch.tensor(tree.tokens, dtype=torch.long)
            node_positions[b, :count] = len(row) + torch.tensor(tree.depths, dtype=torch.long)
            for node, parent in enumerate(tree.parents):
                if parent >= 0:  # parents precede children, so their rows are complete
                    visible[b, node] |= visible[b, parent]
        prompt = mask.bool().cpu()[:, None, :].expand(batch, width, mask.shape[1])
        allowed = torch.cat([prompt, visible], dim=-1)[:, None].to(self.device)
        additive = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        additive.masked_fill_(~allowed, torch.finfo(self.dtype).min)

        hidden = self.model.get_decoder()(
            input_ids=node_ids.to(self.device),
            attention_mask=additive,
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

    def _count(self, results: list[_Result]) -> list[_Result]:
        self.usage.add(
            len(results), sum(r.tokens_in for r in results), sum(r.tokens_out for r in results)
        )
        return results


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
    from arena.core.config import to_plain

    return TransformersBackend(to_plain(cfg))


@arena.hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register(
        "transformers",
        make_transformers_backend,
        config=Path(__file__).with_name("config.yaml"),
        description="Hugging Face transformers in-process (embedded SmolLM2-135M by default)",
    )
