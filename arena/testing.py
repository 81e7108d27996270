"""Test helpers for Arena and for plugin authors: a fast deterministic fake LLM backend.

``FakeLLM`` needs no model: its "log-probs" are a stable hash of prompt and option, so choices
are deterministic, differ between prompts, and cost nothing. Register it with
``arena.testing`` as backend ``fake`` (``llm.backend=fake``).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Callable

import arena
from arena.core.llm import (
    Chat,
    Choice,
    Generation,
    LLMBackend,
    SamplingParams,
    per_prompt,
    sample_option,
)


def _score(prompt: Chat, option: str) -> float:
    blob = (repr(prompt) + "\x00" + option).encode()
    return -int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") / 2**32 * 10


class FakeLLM(LLMBackend):
    """Deterministic, model-free backend. ``reply`` sets what ``generate`` returns."""

    model_id = "arena/fake"

    def __init__(self, reply: str | Callable[[Chat], str] = "A short insight.", weights: str = "w0"):
        super().__init__()
        self.reply = reply
        self.weights = weights  # tests change it to simulate a weight update

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        results = []
        for prompt in prompts:
            text = self.reply(prompt) if callable(self.reply) else self.reply
            tokens_in = self.count_tokens(repr(prompt))
            tokens_out = self.count_tokens(text)
            results.append(Generation(text, list(range(tokens_out)), [0.0] * tokens_out, tokens_in, tokens_out))
            self.usage.add(1, tokens_in, tokens_out)
        return results

    def choose(
        self,
        prompts: list[Chat],
        options: list[list[str]],
        params: SamplingParams | list[SamplingParams],
    ) -> list[Choice]:
        results = []
        for prompt, opts, param in zip(prompts, options, per_prompt(params, len(prompts))):
            scores = [_score(prompt, option) for option in opts]
            index = sample_option(scores, param)
            tokens_in = self.count_tokens(repr(prompt))
            tokens_out = self.count_tokens(opts[index])
            results.append(Choice(index, opts[index], [index], [scores[index]], scores, tokens_in, tokens_out))
            self.usage.add(1, tokens_in, tokens_out)
        return results

    def weights_digest(self, fresh: bool = False) -> str:
        return hashlib.sha256(self.weights.encode()).hexdigest()


def make_fake_llm(cfg: Any) -> FakeLLM:
    return FakeLLM(reply=str(cfg.get("reply", "A short insight.")) if cfg is not None else "A short insight.")


@arena.hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register("fake", make_fake_llm, config=Path(__file__).parent / "core" / "configs" / "fake_llm.yaml",
             description="Deterministic model-free backend for tests and plugin development.")


def random_chat(rng: random.Random) -> Chat:
    """A random two-message chat (property tests of backends)."""
    words = ["apple", "cabinet", "go", "to", "open", "the", "mug", "fridge", "heat", "cool"]
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))},
    ]
