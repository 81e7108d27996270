"""LLM backend for any OpenAI-compatible chat-completions server (``llm.backend=openai``).

The model runs elsewhere: vLLM's OpenAI server, llama.cpp's ``llama-server``, or a hosted API.
Requests go through the official ``openai`` client, which also retries connection errors,
timeouts and HTTP 408/409/429/5xx with exponential backoff (``llm.max_retries``, ``llm.timeout_s``);
other HTTP errors (400 bad request, 401 bad key, 404 unknown model) fail at once with
:class:`OpenAIBackendError`, which names the server, the model and what to check.

Usage::

    pip install 'arena[openai]'
    # a server, e.g. vLLM's on this machine, serving the embedded model as "smollm2":
    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 8000 \\
        --model "$(python -c 'from arena.backends.embedded import embedded_model_dir as d; print(d())')" \\
        --served-model-name smollm2 --max-model-len 2048 --enforce-eager
    arena run -m base llm.backend=openai llm.base_url=http://127.0.0.1:8000/v1 llm.model=smollm2

The API key is read from the environment variable named by ``llm.api_key_env`` (default
``OPENAI_API_KEY``; a local server without a key gets the placeholder ``EMPTY``). The key itself
never enters the config, ``results.json``, :meth:`OpenAIBackend.describe` or an error message, so
it is never written into a run directory.

What a server cannot give, and what is done instead:

* ``choose`` (``llm.choose_by: reply``, any server) cannot score every option. It asks for one
  reply constrained to the options (``llm.guided_choice``: vLLM's ``structured_outputs`` choice,
  the older ``guided_choice`` field, or ``none`` for a plain reply) and maps a reply that is not
  exactly an option to the nearest one (:func:`nearest_option`), so the result is always one of
  the given options. How each choice was made is counted (``exact``/``nearest``) and recorded in
  ``describe()["choices"]``, hence in the run's provenance: many ``nearest`` choices mean the
  constraint did not hold (e.g. an old server that ignores the field). ``option_logprobs`` holds
  the chosen option's summed reply log-prob when the server returned log-probs for an exact reply,
  else ``0.0``, and ``-inf`` for every other option: the distribution over options is not known,
  so :func:`sample_option` is not used; temperature, top-p and seed go to the server's sampler
  instead.
* ``llm.choose_by: option_scores`` (vLLM servers) scores every option instead, as the local
  backends do: the chat and each option are tokenized by the server (``/tokenize``), and one
  completions request per prompt returns the prompt log-probs (``prompt_logprobs``) of every
  ``chat + option + end-of-turn`` row; the pick is :func:`arena.core.contract.llm.sample_option` over the
  summed option log-probs, so a seed picks what it would pick locally, and ``Choice`` carries the
  token ids that were scored.
* No token ids from ``generate``: ``Generation`` has empty ``token_ids``, so methods that train
  the weights (RL) need a local backend (``transformers`` or ``vllm``).
  Token counts come from the server's ``usage`` (estimated as characters / 4 where it has none).
* No weights: ``weights_digest()`` is ``""``; ``describe()`` says ``"weights": "served"``.
* No truncation: a prompt longer than the server's context is the server's error (HTTP 400).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import math
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from arena.backends.common import CountingBackend
from arena.core.contract.llm import Chat, Choice, Generation, ParamsPerPrompt, SamplingParams, per_prompt, sample_option
from arena.core.contract.method_config import typed_config

INSTALL_HINT = "pip install 'arena[openai]'"
#: Sent as the key when ``api_key_env`` names an unset variable: local servers accept anything.
PLACEHOLDER_KEY = "EMPTY"
GUIDED_MODES = ("structured_outputs", "guided_choice", "none")
CHOOSE_BY = ("reply", "option_scores")
#: Option texts whose token ids are kept (admissible actions repeat from step to step).
_OPTION_CACHE = 4096
#: Status codes the openai client retries (with backoff) before giving up.
_RETRIED_STATUSES = frozenset({408, 409, 429})
#: Characters of a server's error text kept in our message (an HTML error page can be long).
_MAX_MESSAGE = 600
_T = TypeVar("_T")


class OpenAIBackendError(RuntimeError):
    """A request to the OpenAI-compatible server failed; the message says what to check."""


class OpenAIBackendTimeout(OpenAIBackendError):
    """No reply within ``llm.timeout_s`` on any of the ``llm.max_retries + 1`` attempts."""


@dataclass(frozen=True)
class OpenAIConfig:
    """The ``llm`` config section this backend reads; see ``openai_config.yaml`` for each field."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout_s: float = 120.0
    max_retries: int = 3
    guided_choice: str = "structured_outputs"
    choice_max_tokens: int | None = None
    logprobs: bool = True
    choose_by: str = "reply"

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> OpenAIConfig:
        """Take this backend's fields from ``cfg`` (other keys belong to the harness) and check
        them, saying which ``llm.*`` setting to fix."""
        if cfg.get("api_key") is not None:
            raise ValueError(
                "llm.api_key is not read: a key in the config would be written to results.json. "
                "Put the key in an environment variable and name it in llm.api_key_env."
            )
        config = typed_config(cfg, cls, prefix="llm.", ignore=(), others=True)
        if not config.model:
            raise ValueError(
                "llm.backend=openai needs llm.model, the model name the server serves (vLLM: its "
                "--served-model-name; list them with GET <base_url>/models), e.g. llm.model=smollm2."
            )
        if not config.base_url:
            raise ValueError("llm.base_url is empty; set it, e.g. llm.base_url=http://127.0.0.1:8000/v1")
        if config.guided_choice not in GUIDED_MODES:
            raise ValueError(
                f"llm.guided_choice={config.guided_choice!r} is not one of {list(GUIDED_MODES)}: "
                "structured_outputs for vLLM >= 0.11, guided_choice for older vLLM, none otherwise."
            )
        if config.choose_by not in CHOOSE_BY:
            raise ValueError(
                f"llm.choose_by={config.choose_by!r} is not one of {list(CHOOSE_BY)}: reply (one "
                "constrained reply, any server) or option_scores (every option scored from the "
                "server's prompt log-probs, vLLM)."
            )
        if config.concurrency < 1:
            raise ValueError(f"llm.concurrency must be at least 1, got {config.concurrency}.")
        if config.timeout_s <= 0:
            raise ValueError(f"llm.timeout_s must be positive, got {config.timeout_s}.")
        if config.max_retries < 0:
            raise ValueError(f"llm.max_retries must be 0 or more, got {config.max_retries}.")
        if config.choice_max_tokens is not None and config.choice_max_tokens < 1:
            raise ValueError(
                f"llm.choice_max_tokens must be at least 1 or null, got {config.choice_max_tokens}."
            )
        return config


def import_openai() -> Any:
    """The ``openai`` module, or an error naming the command that installs it (imported here,
    not at module level, so Arena loads this plugin without the client installed)."""
    try:
        import openai
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"llm.backend=openai needs the openai client, which is not importable here ({exc}). "
            f"Install it: {INSTALL_HINT}"
        ) from exc
    return openai


# ----------------------------------------------------------------------------------------------
# Mapping a free reply to an option
# ----------------------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Lower case, punctuation as spaces, single spaces: ``"Go to desk 1."`` -> ``"go to desk 1"``."""
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def exact_option(reply: str, options: Sequence[str]) -> int | None:
    """Index of the first option the stripped reply equals, else ``None``."""
    reply = reply.strip()
    for index, option in enumerate(options):
        if reply == option or reply == option.strip():
            return index
    return None


def nearest_option(reply: str, options: Sequence[str]) -> int:
    """Index of the option nearest to a free-text reply; always a valid index.

    In order: an option equal to the reply after :func:`normalise`; else the longest option the
    reply contains as whole words (``"I will go to desk 1 now"`` -> ``"go to desk 1"``, not
    ``"go to desk"``); else the highest ``difflib.SequenceMatcher`` ratio. Ties go to the first
    option, so the mapping is deterministic.
    """
    if not options:
        raise ValueError("No options to choose from: the admissible action list is empty.")
    said = normalise(reply)
    norms = [normalise(option) for option in options]
    for index, norm in enumerate(norms):
        if norm == said:
            return index
    padded = f" {said} "
    contained = [index for index, norm in enumerate(norms) if norm and f" {norm} " in padded]
    if contained:
        return max(contained, key=lambda index: (len(norms[index]), -index))
    ratios = [difflib.SequenceMatcher(None, said, norm, autojunk=False).ratio() for norm in norms]
    return max(range(len(options)), key=lambda index: (ratios[index], -index))


# ----------------------------------------------------------------------------------------------
# The backend
# ----------------------------------------------------------------------------------------------


class OpenAIBackend(CountingBackend):
    """Chat completions against an OpenAI-compatible server; a batch of N prompts is sent as N
    concurrent requests (at most ``llm.concurrency`` at a time)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.config = OpenAIConfig.from_mapping(config or {})
        self._openai = import_openai()
        self.model_id = self.config.model or ""  # from_mapping refused an empty one
        self.base_url = self.config.base_url
        self._key = os.environ.get(self.config.api_key_env) or PLACEHOLDER_KEY
        self.key_from_env = self._key != PLACEHOLDER_KEY
        self.timeout_s = self.config.timeout_s
        self.max_retries = self.config.max_retries
        self.client = self._openai.OpenAI(
            base_url=self.base_url,
            api_key=self._key,
            timeout=self.timeout_s,
            max_retries=self.max_retries,
        )
        #: Server routes outside /v1 (vLLM's /tokenize and /detokenize).
        self.root_client = self.client.with_options(base_url=server_root(self.base_url))
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._end_of_turn: list[int] | None = None
        self._option_ids: dict[str, list[int]] = {}
        #: How choices were made: the reply was an option (``exact``) or mapped to the nearest
        #: one (``nearest``); ``guided``: choose requests sent with a constraint.
        self._choices = {"exact": 0, "nearest": 0, "guided": 0}

    # ------------------------------------------------------------------------------------------
    # LLMBackend
    # ------------------------------------------------------------------------------------------

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        """One chat completion per prompt. With a seed, prompt ``i`` gets its own seed derived
        from ``(seed, i)`` (as in the vLLM backend), so equal prompts of one call still differ."""
        if params.max_new_tokens <= 0:
            empty = [Generation("", [], [], self._estimate_in(chat), 0) for chat in prompts]
            return self._count(empty)

        def one(item: tuple[int, Chat]) -> Generation:
            index, chat = item
            seed = None if params.seed is None else request_seed(params.seed, index)
            response = self._complete(chat, params, params.max_new_tokens, seed)
            text = _with_stop(response, _reply_text(response), params.stop)
            tokens_in, tokens_out = self._tokens(response, chat, text)
            return Generation(text, [], [], tokens_in, tokens_out)

        return self._count(self._map(one, list(enumerate(prompts))))

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        """Ask for a reply constrained to each prompt's options and return that option (or the
        nearest one, see :func:`nearest_option`); see the module docstring for the log-probs."""
        if len(options) != len(prompts):
            raise ValueError(f"Got {len(options)} option lists for {len(prompts)} prompts.")
        for opts in options:
            if not opts:
                raise ValueError("No options to choose from: the admissible action list is empty.")
        settings = per_prompt(params, len(prompts))
        one = self._score_one if self.config.choose_by == "option_scores" else self._choose_one
        return self._count(self._map(one, list(zip(prompts, options, settings))))

    def count_tokens(self, text: str) -> int:
        """Characters / 4: the server's tokenizer is not at hand (budgets only need a rough count)."""
        return max(1, len(text) // 4)

    def weights_digest(self, fresh: bool = False) -> str:
        """``""``: served weights are not visible to the client."""
        return ""

    def choice_counts(self) -> dict[str, int]:
        """A copy of the counts of how choices were made (``exact``, ``nearest``, ``guided``)."""
        with self._lock:
            return dict(self._choices)

    def describe(self) -> dict[str, Any]:
        """Provenance: server, model, how ``choose`` was constrained and how its choices were
        made. The API key is not in it (only the variable's name)."""
        return {
            "id": self.model_id,
            "backend": "openai",
            "base_url": public_url(self.base_url),
            "weights": "served",
            "weights_sha256": "",
            "guided_choice": self.config.guided_choice,
            "choose_by": self.config.choose_by,
            "choices": self.choice_counts(),
            "api_key_env": self.config.api_key_env,
            "api_key_set": self.key_from_env,
            "openai_version": _version("openai"),
        }

    def close(self) -> None:
        """Stop the request threads and close the client's connections."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.client.close()

    # ------------------------------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------------------------------

    def _choose_one(self, item: tuple[Chat, list[str], SamplingParams]) -> Choice:
        chat, opts, params = item
        mode = self.config.guided_choice
        distinct = list(dict.fromkeys(opts))
        extra_body: dict[str, Any] | None = None
        if mode == "structured_outputs":
            extra_body = {"structured_outputs": {"choice": distinct}}
        elif mode == "guided_choice":
            extra_body = {"guided_choice": distinct}
        # A token covers at least one character, so the longest option always fits.
        max_tokens = self.config.choice_max_tokens or max(len(option) for option in opts) + 8
        response = self._complete(
            chat, params, int(max_tokens), params.seed, extra_body, logprobs=self.config.logprobs
        )
        reply = _reply_text(response)
        index = exact_option(reply, opts)
        how = "exact" if index is not None else "nearest"
        if index is None:
            index = nearest_option(reply, opts)
        with self._lock:
            self._choices[how] += 1
            self._choices["guided"] += extra_body is not None
        token_logprobs = _token_logprobs(response) if how == "exact" else []
        option_logprobs = [-math.inf] * len(opts)
        option_logprobs[index] = float(sum(token_logprobs))
        tokens_in, tokens_out = self._tokens(response, chat, reply)
        return Choice(
            index=index,
            text=opts[index],
            token_ids=[],
            logprobs=token_logprobs,
            option_logprobs=option_logprobs,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
        )

    def _score_one(self, item: tuple[Chat, list[str], SamplingParams]) -> Choice:
        """Every option scored from the server's prompt log-probs (``choose_by: option_scores``)."""
        chat, opts, params = item
        context = self._tokenize({"messages": chat, "add_generation_prompt": True})
        distinct = list(dict.fromkeys(opts))
        rows = [context + self._encode_option(option) for option in distinct]
        response = self._request(lambda: self.client.completions.create(
            model=self.model_id, prompt=rows, max_tokens=1, temperature=0.0,
            extra_body={"prompt_logprobs": 0}))
        scored: dict[str, list[float]] = {}
        for choice in sorted(response.choices, key=lambda c: c.index):
            option = distinct[choice.index]
            scored[option] = _prompt_logprobs(choice, rows[choice.index], start=len(context))
        totals = [float(sum(scored[option])) for option in opts]
        index = sample_option(totals, params)
        option_ids = rows[distinct.index(opts[index])][len(context):]
        return Choice(
            index=index,
            text=opts[index],
            token_ids=option_ids,
            logprobs=scored[opts[index]],
            option_logprobs=totals,
            tokens_in=len(context),
            tokens_out=len(option_ids),
            prompt_token_ids=context,
        )

    def _encode_option(self, text: str) -> list[int]:
        """The option's token ids and the chat template's end-of-turn marker (what a local backend
        scores); cached, since the admissible actions repeat from step to step."""
        with self._lock:
            ids = self._option_ids.get(text)
        if ids is None:
            ids = self._tokenize({"prompt": text, "add_special_tokens": False})
            with self._lock:
                if len(self._option_ids) >= _OPTION_CACHE:
                    self._option_ids.clear()
                self._option_ids[text] = ids
        return ids + self._end_of_turn_ids()

    def _end_of_turn_ids(self) -> list[int]:
        """The tokens the server's chat template puts after an assistant message, read off the
        template (``<|im_end|>`` for SmolLM2); trailing whitespace is not part of the reply."""
        if self._end_of_turn is not None:
            return self._end_of_turn
        marker = "ARENA"
        user = [{"role": "user", "content": "x"}]
        head = self._tokenize({"messages": user, "add_generation_prompt": True})
        body = self._tokenize({"prompt": marker, "add_special_tokens": False})
        full = self._tokenize({"messages": user + [{"role": "assistant", "content": marker}],
                               "add_generation_prompt": False})
        if full[: len(head) + len(body)] != head + body or len(full) == len(head) + len(body):
            raise OpenAIBackendError(
                f"Could not read the end-of-turn marker off the chat template of {self.model_id!r} "
                f"at {public_url(self.base_url)}: an assistant message does not extend the "
                "generation prompt token by token. Use llm.choose_by=reply with this model."
            )
        tail = full[len(head) + len(body):]
        while len(tail) > 1 and not self._detokenize(tail[-1:]).strip():
            tail = tail[:-1]
        self._end_of_turn = tail
        return tail

    def _tokenize(self, body: dict[str, Any]) -> list[int]:
        """Token ids from the server's ``/tokenize`` (vLLM), a chat or a plain prompt."""
        answer = self._request(lambda: self.root_client.post(
            "/tokenize", body={"model": self.model_id, **body}, cast_to=object))
        return [int(token) for token in answer["tokens"]]

    def _detokenize(self, tokens: list[int]) -> str:
        answer = self._request(lambda: self.root_client.post(
            "/detokenize", body={"model": self.model_id, "tokens": tokens}, cast_to=object))
        return str(answer["prompt"])

    def _request(self, send: Callable[[], _T]) -> _T:
        """One request (the client retries transient failures); errors explained."""
        try:
            return send()
        except self._openai.APIError as exc:
            # ``from None``: the client's exception may carry server text that echoes the key.
            raise self._explain(exc) from None

    def _complete(
        self,
        chat: Chat,
        params: SamplingParams,
        max_tokens: int,
        seed: int | None,
        extra_body: dict[str, Any] | None = None,
        logprobs: bool = False,
    ) -> Any:
        """One chat completion (the client retries transient failures); errors explained."""
        kwargs: dict[str, Any] = {
            "model": self.model_id,
            "messages": chat,
            "temperature": max(params.temperature, 0.0),
            "top_p": params.top_p,
            "max_tokens": max_tokens,
        }
        if seed is not None:
            kwargs["seed"] = seed
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if logprobs:
            kwargs["logprobs"] = True
        if extra_body:
            kwargs["extra_body"] = extra_body
        return self._request(lambda: self.client.chat.completions.create(**kwargs))

    def _explain(self, exc: Exception) -> OpenAIBackendError:
        """A clear error for a failed request: what happened, where, and what to change."""
        openai = self._openai
        where = f"model {self.model_id!r} at {public_url(self.base_url)}"
        attempts = self.max_retries + 1
        raise_hint = "raise llm.timeout_s / llm.max_retries if the server is just slow or busy"
        if isinstance(exc, openai.APITimeoutError):
            return OpenAIBackendTimeout(
                f"No reply from {where} within llm.timeout_s={self.timeout_s:g} s, {attempts} "
                f"attempt(s) (llm.max_retries={self.max_retries}). Is the server up and not "
                f"overloaded? {raise_hint[0].upper()}{raise_hint[1:]}."
            )
        if isinstance(exc, openai.APIConnectionError):
            return OpenAIBackendError(
                f"Could not connect to {where} after {attempts} attempt(s) "
                f"(llm.max_retries={self.max_retries}): {self._redact(str(exc))}. "
                "Is the server up, and is llm.base_url right (scheme, host, port, /v1)?"
            )
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = self._redact(_server_message(exc)).rstrip(". ")
            retried = status in _RETRIED_STATUSES or status >= 500
            tried = f"after {attempts} attempt(s)" if retried else "(not retried)"
            if status in (401, 403):
                hint = (
                    f"Check the API key in the environment variable ${self.config.api_key_env} "
                    f"(llm.api_key_env; {'set' if self.key_from_env else 'unset, sent a placeholder'})."
                )
            elif status == 404:
                hint = (
                    "Check llm.model (the name the server serves: GET <base_url>/models) and "
                    "llm.base_url (usually ends in /v1)."
                )
                if self.config.choose_by == "option_scores":
                    hint += (" llm.choose_by=option_scores needs vLLM's /tokenize route and "
                             "prompt_logprobs; use llm.choose_by=reply with other servers.")
            elif retried:
                hint = f"The server is failing or overloaded; {raise_hint}, or check its log."
            else:
                hint = (
                    "Check llm.model, llm.base_url and llm.guided_choice (structured_outputs needs "
                    "vLLM >= 0.11; try guided_choice or none for other servers); a prompt longer "
                    "than the server's context is refused too."
                )
            return OpenAIBackendError(f"HTTP {status} from {where} {tried}: {message}. {hint}")
        return OpenAIBackendError(f"Request to {where} failed: {self._redact(str(exc))}")

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self.key_from_env else text

    def _map(self, function: Callable[[Any], _T], items: list[Any]) -> list[_T]:
        """``function`` over ``items``, up to ``llm.concurrency`` at once; results in order."""
        if len(items) <= 1 or self.config.concurrency <= 1:
            return [function(item) for item in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.config.concurrency, thread_name_prefix="arena-openai"
                )
            pool = self._pool
        return list(pool.map(function, items))

    def _tokens(self, response: Any, chat: Chat, reply: str) -> tuple[int, int]:
        """Prompt and completion tokens from the server's ``usage``, estimated where absent."""
        usage = getattr(response, "usage", None)
        tokens_in = getattr(usage, "prompt_tokens", None)
        tokens_out = getattr(usage, "completion_tokens", None)
        return (
            int(tokens_in) if tokens_in is not None else self._estimate_in(chat),
            int(tokens_out) if tokens_out is not None else self.count_tokens(reply),
        )

    def _estimate_in(self, chat: Chat) -> int:
        return self.count_tokens("".join(message.get("content", "") for message in chat))


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def request_seed(seed: int, index: int) -> int:
    """A per-prompt seed below 2**31 (servers differ in the range they accept), distinct across
    the prompts of a call and across consecutive call seeds."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


def public_url(url: str) -> str:
    """``url`` without user, password, query or fragment, which may hold credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def server_root(url: str) -> str:
    """The server's root for routes outside the OpenAI API: ``url`` without a trailing ``/v1``."""
    trimmed = url.rstrip("/")
    return trimmed[: -len("/v1")] if trimmed.endswith("/v1") else trimmed


def _prompt_logprobs(choice: Any, row: list[int], start: int) -> list[float]:
    """Log-probs of ``row[start:]`` from a completions choice's ``prompt_logprobs`` (vLLM: one
    ``{token id: {"logprob": ...}}`` per prompt position, ``None`` for the first)."""
    positions = getattr(choice, "prompt_logprobs", None)
    if positions is None:
        positions = (getattr(choice, "model_extra", None) or {}).get("prompt_logprobs")
    if not positions or len(positions) != len(row):
        raise OpenAIBackendError(
            "The server returned no prompt log-probs for the options (or not one per token): "
            "llm.choose_by=option_scores needs a vLLM server; use llm.choose_by=reply otherwise."
        )
    out = []
    for position in range(start, len(row)):
        entry = positions[position] or {}
        scored = entry.get(str(row[position]), entry.get(row[position]))
        if scored is None:
            raise OpenAIBackendError(f"No prompt log-prob for token {row[position]} at position {position}.")
        out.append(float(scored["logprob"] if isinstance(scored, dict) else scored.logprob))
    return out


def _reply_text(response: Any) -> str:
    choices = getattr(response, "choices", None) or []
    if not choices:
        raise OpenAIBackendError("The server's reply held no choices; is it OpenAI-compatible?")
    return choices[0].message.content or ""


def _with_stop(response: Any, text: str, stop: tuple[str, ...]) -> str:
    """``text`` with the stop string the server matched put back (OpenAI trims it; vLLM's and
    SGLang's servers name it as ``stop_reason`` or ``matched_stop``), as the other backends
    keep it."""
    choice = response.choices[0]
    matched = getattr(choice, "stop_reason", None) or getattr(choice, "matched_stop", None)
    if stop and getattr(choice, "finish_reason", None) == "stop" and matched in stop and not text.endswith(matched):
        return text + str(matched)
    return text


def _token_logprobs(response: Any) -> list[float]:
    """Per-token log-probs of the reply, if the server returned them."""
    logprobs = getattr(response.choices[0], "logprobs", None)
    content = getattr(logprobs, "content", None) or []
    return [float(token.logprob) for token in content if token.logprob is not None]


def _server_message(exc: Any) -> str:
    """The server's own error text (``{"error": {"message": ...}}`` or ``{"message": ...}``)."""
    body = getattr(exc, "body", None)
    if isinstance(body, str) and body:
        return body[:_MAX_MESSAGE]
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:_MAX_MESSAGE]
        if isinstance(inner, str):
            return inner[:_MAX_MESSAGE]
    return str(getattr(exc, "message", None) or exc)[:_MAX_MESSAGE]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def make_openai_backend(cfg: Mapping[str, Any]) -> OpenAIBackend:
    """Factory for the registry: ``cfg`` is the resolved ``llm`` section (DictConfig or dict)."""
    from arena.core.config.compose import to_plain

    return OpenAIBackend(to_plain(cfg))
