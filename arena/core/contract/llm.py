"""The LLM backend interface: batched chat generation and constrained choice.

Every backend (transformers, vLLM, an OpenAI-compatible server) implements :class:`LLMBackend`.
Methods never talk to a model any other way, so the harness can count every call and token.
"""

from __future__ import annotations

import math
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: A chat message, e.g. ``{"role": "user", "content": "..."}``.
Message = dict[str, str]
Chat = list[Message]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy (deterministic)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    #: ``generate`` ends a reply at the first of these strings, which the reply keeps (as
    #: slime asks SGLang: ``no_stop_trim``); nothing after it is generated or returned.
    stop: tuple[str, ...] = ()


#: Sampling for a batch of prompts: one setting for all, or one per prompt (episodes with seeds
#: of their own share a batch).
ParamsPerPrompt = SamplingParams | list[SamplingParams]


@dataclass
class Generation:
    """Free text generated for one prompt."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    tokens_in: int
    tokens_out: int
    #: The prompt as the model saw it (after chat template and truncation), for RL training.
    prompt_token_ids: list[int] = field(default_factory=list)
    #: The chat was longer than ``llm.max_context`` allows beside the reply, and older turns were
    #: cut to fit (backends that cut locally say so; a server's own limit is its error).
    prompt_cut: bool = False


@dataclass
class Choice:
    """The option chosen for one prompt, with the tokens and log-probs of that option.

    ``option_logprobs`` holds every option's summed log-prob under the model, so a caller can
    recompute the distribution the choice was drawn from.
    """

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    option_logprobs: list[float]
    tokens_in: int
    tokens_out: int
    #: The prompt as the model saw it (after chat template and truncation), for RL training.
    prompt_token_ids: list[int] = field(default_factory=list)


@dataclass
class Usage:
    """Running totals of one backend; the harness reads them to fill ``cost``."""

    llm_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, calls: int, tokens_in: int, tokens_out: int) -> None:
        with self._lock:
            self.llm_calls += calls
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out

    def snapshot(self) -> dict[str, int]:
        return {"llm_calls": self.llm_calls, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out}


class LLMBackend(ABC):
    """One model behind a uniform, batched interface.

    Each prompt in a batch counts as one LLM call in :attr:`usage`.
    """

    #: Identifier recorded in results, e.g. ``"HuggingFaceTB/SmolLM2-135M-Instruct"``.
    model_id: str = ""

    def __init__(self) -> None:
        self.usage = Usage()
        #: Told ``(tokens, limit, replies)`` as a long generation advances and ``(limit, limit,
        #: replies)`` when it ends, by backends that generate locally; the harness shows it, so a
        #: minutes-long batch of replies is not a silent progress line.
        self.on_generated: Callable[[int, int, int], None] | None = None

    @abstractmethod
    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        """Free-text completion of each chat (used for extraction, reflection, reasoning)."""

    @abstractmethod
    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        """For each chat, pick one of its options (an admissible action).

        ``params`` is one setting for all prompts or one per prompt (so episodes with their own
        seeds can share a batch). Options are scored by summed log-prob and picked with
        :func:`sample_option`. The result is always one of the given options.
        """

    def count_tokens(self, text: str) -> int:
        """Token count of a text (for budgets); backends override with their tokenizer."""
        return max(1, len(text) // 4)

    def weights_digest(self, fresh: bool = False) -> str:
        """SHA-256 over the current weights: part of the frozen-state check and provenance.

        A backend may cache it; ``fresh=True`` must recompute it from the weights themselves.
        """
        return ""

    def describe(self) -> dict[str, Any]:
        """What provenance records about the model (id, weights digest, dtype...)."""
        return {"id": self.model_id, "weights_sha256": self.weights_digest()}

    def close(self) -> None:
        """Release what the backend holds (request threads, connections, an engine); the harness
        calls it when a run ends. Nothing to release by default."""


@runtime_checkable
class TrainableBackend(Protocol):
    """A backend whose model a method may train in-process (``run.trainable_backend()``).

    ``model`` is the torch module that serves the agent (a trainer updates it in place, or a
    method replaces it, e.g. with an SFT result); after any change the method calls
    :meth:`mark_weights_changed`, so the backend serves the new weights and rehashes them.
    The transformers and vLLM backends implement it. A backend that caches states of the
    current weights may also offer ``drop_cached_states()``, which the harness's trainer calls
    as a step starts (optional, so it is not part of this runtime-checked protocol).
    """

    model: Any
    tokenizer: Any

    def mark_weights_changed(self) -> None: ...


class WrappingBackend(LLMBackend):
    """A backend in front of another (``inner``): every call and the usage counters are
    ``inner``'s unless a subclass changes a call (batching, recording)."""

    def __init__(self, inner: LLMBackend) -> None:
        super().__init__()
        self.inner = inner
        self.usage = inner.usage
        self.model_id = inner.model_id

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        return self.inner.generate(prompts, params)

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        return self.inner.choose(prompts, options, params)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def weights_digest(self, fresh: bool = False) -> str:
        return self.inner.weights_digest(fresh)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


def per_prompt(params: ParamsPerPrompt, n: int) -> list[SamplingParams]:
    """One :class:`SamplingParams` per prompt."""
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"Got {len(params)} sampling params for {n} prompts; pass one or one each.")
    return list(params)


def sample_option(option_logprobs: list[float], params: SamplingParams) -> int:
    """Pick an option index from summed log-probs: argmax when greedy (first on ties), else a
    seeded draw from softmax(logprob / temperature) restricted to the top-p nucleus.

    Every backend uses this, so a seed picks the same option whichever backend scored it.
    """
    if not option_logprobs:
        raise ValueError("No options to choose from: the admissible action list is empty.")
    if params.temperature <= 0:
        return max(range(len(option_logprobs)), key=lambda i: (option_logprobs[i], -i))
    scaled = [lp / params.temperature for lp in option_logprobs]
    top = max(scaled)
    weights = [math.exp(v - top) for v in scaled]
    total = sum(weights)
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    nucleus, mass = [], 0.0
    for index in order:
        nucleus.append(index)
        mass += weights[index] / total
        if mass >= params.top_p:
            break
    rng = random.Random(params.seed)
    return rng.choices(nucleus, weights=[weights[i] for i in nucleus], k=1)[0]
