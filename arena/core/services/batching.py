"""Dynamic batching: episodes run in threads, their LLM calls are merged into batches.

Each episode stays a plain sequential loop (easy to write a solver for), while the model sees one
batched forward for all episodes that are waiting on it, which is what makes a small CPU model
usable for hundreds of episodes. Calls are grouped by kind: choices of any sampling params share a
batch (each prompt keeps its own params), generations share one only with identical params.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from arena.core.contract.llm import (
    Chat,
    Choice,
    Generation,
    LLMBackend,
    ParamsPerPrompt,
    SamplingParams,
    WrappingBackend,
    per_prompt,
)


@dataclass
class _Request:
    kind: str  # "choose" or "generate"
    prompts: list[Chat]
    options: list[list[str]] | None
    params: ParamsPerPrompt
    future: Future = field(default_factory=Future)
    since: float = field(default_factory=time.monotonic)


class BatchingBackend(WrappingBackend):
    """Wraps a backend; concurrent callers' requests are served in batches of ``max_batch``.

    A batch is dispatched as soon as every registered caller (``enter``/``leave``) is waiting, the
    batch is full, or its oldest request has waited ``max_wait_s``. Per-request sampling seeds are kept, so a greedy
    or seeded episode gives the same actions whatever else is in its batch (up to float noise).
    """

    def __init__(self, inner: LLMBackend, max_batch: int = 8, max_wait_s: float = 0.02) -> None:
        super().__init__(inner)
        self.max_batch = max(1, max_batch)
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._active = 0
        self._busy = False

    # -- caller registration: how many threads may submit -----------------------------------

    def enter(self) -> None:
        with self._cond:
            self._active += 1

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    # -- LLMBackend ---------------------------------------------------------------------------

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        return self._submit(_Request("generate", prompts, None, params))

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        return self._submit(_Request("choose", prompts, options, params))

    # -- the batching itself ------------------------------------------------------------------

    def _submit(self, request: _Request) -> Any:
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
            while not request.future.done():
                if not self._busy and self._ready():
                    batch = self._take_batch()
                    self._busy = True
                    self._cond.release()
                    try:
                        self._run(batch)
                    finally:
                        self._cond.acquire()
                        self._busy = False
                        self._cond.notify_all()
                else:
                    self._cond.wait(timeout=self.max_wait_s)
        return request.future.result()

    def _ready(self) -> bool:
        waiting = sum(len(r.prompts) for r in self._pending)
        if not self._pending:
            return False
        everyone_waiting = len(self._pending) >= max(1, self._active)
        waited_enough = time.monotonic() - self._pending[0].since >= self.max_wait_s
        return waiting >= self.max_batch or everyone_waiting or waited_enough

    def _take_batch(self) -> list[_Request]:
        head = self._pending[0]
        batch, rest, size = [], [], 0
        for request in self._pending:
            if _compatible(request, head) and size + len(request.prompts) <= max(self.max_batch, len(head.prompts)):
                batch.append(request)
                size += len(request.prompts)
            else:
                rest.append(request)
        self._pending = rest
        return batch

    def _run(self, batch: list[_Request]) -> None:
        prompts = [p for r in batch for p in r.prompts]
        try:
            if batch[0].kind == "choose":
                options = [o for r in batch for o in (r.options or [])]
                params = [p for r in batch for p in per_prompt(r.params, len(r.prompts))]
                results: list[Any] = self.inner.choose(prompts, options, params)
            else:
                shared = batch[0].params  # generations share a batch only with equal params
                assert isinstance(shared, SamplingParams)
                results = self.inner.generate(prompts, shared)
        except BaseException as exc:
            for request in batch:
                request.future.set_exception(exc)
            return
        start = 0
        for request in batch:
            request.future.set_result(results[start : start + len(request.prompts)])
            start += len(request.prompts)


def _compatible(a: _Request, b: _Request) -> bool:
    """Choices batch with per-prompt params; generations need identical sampling settings."""
    if a.kind != b.kind:
        return False
    return a.kind == "choose" or a.params == b.params
