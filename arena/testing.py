"""Test kit for Arena and for plugin authors: a fake LLM backend, fixtures and protocol checks.

* ``FakeLLM`` needs no model: its "log-probs" are a stable hash of prompt and option, so choices
  are deterministic, differ between prompts, and cost nothing. This module registers it as the
  LLM backend ``fake`` (``llm.backend=fake``).
* :func:`run_method` runs a method (by name, or a plugin/class not installed at all) through the
  whole protocol, learn then frozen evaluation, on a small world in about a second.
* :func:`assert_frozen_protocol` fails with a readable message if a run broke the protocol.
* A pytest plugin (entry point ``pytest11``, so every test of an environment with Arena installed
  has them): the fixtures ``arena_overrides``, ``arena_plugins``, ``household_env``, ``fake_llm``,
  ``tiny_llm``, ``experience_store``, ``learn_run`` and ``run_method``.
* :func:`learning_context` and :func:`expert_trajectory` help test hooks one at a time.
* :class:`ChoiceRecorder` registers a ``recording`` backend that keeps every ``choose`` prompt of
  a run with its choice (what the model was asked, step by step).

pytest is imported only where it is installed: Arena itself loads this module for the ``fake``
backend, and a plain install has no pytest.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arena
from arena.core.contract.llm import (
    Chat,
    Choice,
    Generation,
    LLMBackend,
    ParamsPerPrompt,
    SamplingParams,
    WrappingBackend,
    per_prompt,
    sample_option,
)
from arena.core.contract.results import Results
from arena.core.contract.results import validate as validate_results
from arena.core.contract.types import EpisodeResult, Observation

try:  # only the fixtures need it
    import pytest
except ImportError:  # pragma: no cover - a plain install without the dev extra
    pytest = None  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------------
# The fake backend
# ---------------------------------------------------------------------------------------------


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

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
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
    return FakeLLM(reply=cfg.get("reply", "A short insight.") if cfg is not None else "A short insight.")


@arena.hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register("fake", make_fake_llm, config=Path(__file__).parent / "core" / "configs" / "fake_llm.yaml",
             description="Deterministic model-free backend for tests and plugin development.")


@dataclass
class RecordedChoice:
    """One prompt of a ``choose`` call, as a :class:`ChoiceRecorder` kept it."""

    prompt: Chat
    options: list[str]
    params: SamplingParams
    choice: Choice
    seconds: float  # the call's wall time divided by its prompts


class RecordingBackend(WrappingBackend):
    """A backend that passes every call to ``inner`` and keeps each ``choose`` prompt with its
    choice, and each ``generate`` prompt in ``generated``; anything else (``tokenizer``,
    ``prefix_cache_stats``, ...) is ``inner``'s."""

    def __init__(self, inner: LLMBackend, calls: list[RecordedChoice],
                 generated: list[Chat] | None = None) -> None:
        super().__init__(inner)
        self.calls = calls
        self.generated = generated if generated is not None else []

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Generation]:
        self.generated.extend(prompts)
        return self.inner.generate(prompts, params)

    def choose(self, prompts: list[Chat], options: list[list[str]], params: ParamsPerPrompt) -> list[Choice]:
        started = time.perf_counter()
        choices = self.inner.choose(prompts, options, params)
        seconds = (time.perf_counter() - started) / max(1, len(prompts))
        self.calls.extend(RecordedChoice(prompt, list(opts), each, choice, seconds) for prompt, opts, each, choice
                          in zip(prompts, options, per_prompt(params, len(prompts)), choices))
        return choices

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during construction or unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class ChoiceRecorder:
    """Registers the backend ``recording`` on ``plugins``: the backend ``inner`` (with its config),
    every ``choose`` prompt of which lands in :attr:`calls` and every ``generate`` prompt in
    :attr:`generated`. For tests and benchmarks that look at what the model was asked during a
    whole run (``llm.backend=recording``)."""

    def __init__(self, plugins: Any, inner: str = "transformers") -> None:
        self.entry = plugins.backends.get(inner)
        self.calls: list[RecordedChoice] = []
        self.generated: list[Chat] = []
        self.backends: list[RecordingBackend] = []
        plugins.register_plugin(self, name="arena.testing.recorder")

    def build(self, cfg: Any) -> RecordingBackend:
        backend = RecordingBackend(self.entry.factory(cfg), self.calls, self.generated)
        self.backends.append(backend)
        return backend

    @arena.hookimpl
    def register_backends(self, register: Callable[..., None]) -> None:
        register("recording", self.build, config=list(self.entry.configs),
                 description=f"{self.entry.name}, every choose call recorded (tests, benchmarks)")


def random_chat(rng: random.Random) -> Chat:
    """A random two-message chat (property tests of backends)."""
    words = ["apple", "cabinet", "go", "to", "open", "the", "mug", "fridge", "heat", "cool"]
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))},
    ]


# ---------------------------------------------------------------------------------------------
# Running a method through the protocol
# ---------------------------------------------------------------------------------------------

#: A small household world, the fake LLM and the model-free embedder: a whole run in a second.
#: Later overrides win, so ``run_method("x", ["llm.backend=transformers", "llm.model=tiny"])``
#: swaps in the tiny test model.
FAST_OVERRIDES: tuple[str, ...] = (
    "llm.backend=fake",
    "embedder.name=hashing",
    "env.n_train=60",
    "env.n_valid=12",
    "env.n_test=12",
    "eval.limit=4",
    "eval.max_steps=12",
    "eval.concurrency=2",
    "learn.budget.episodes=8",
)

#: Overrides that put the tiny random 2-layer Llama (built offline from a seed) behind the run.
TINY_MODEL_OVERRIDES: tuple[str, ...] = ("llm.backend=transformers", "llm.model=tiny")

#: Splits a method may learn from; the protocol refuses test splits while learning.
#: The sizes :func:`shrunk_overrides` shrinks, wherever a composed config has the key.
PRESET_SIZES: dict[str, Any] = {
    "env.n_train": 30, "env.n_valid": 4, "env.n_test": 4,
    "eval.limit": 1, "eval.max_steps": 2, "learn.max_steps": 2, "eval.concurrency": 2,
    "learn.budget.gradient_steps": 1,
    "solver.reasoning_max_tokens": 12,
    # Evolving-RL and its GRPO baseline
    "method.iterations": 1, "method.n_sources": 1, "method.n_skills": 2, "method.k_downstream": 1,
    "method.group_size": 2, "method.valid_tasks": 1, "method.mini_batch_size": None,
    "method.extractor_max_tokens": 12, "method.eval_extractor_max_tokens": 12,
    # SkillRL
    "method.collect.tasks": 2, "method.sft.tasks": 2, "method.sft.steps": 1, "method.sft.epochs": None,
    "method.sft.batch_size": 2, "method.rl.steps": 1, "method.rl.tasks_per_step": 1,
    "method.rl.group_size": 2, "method.evolution.valid_tasks": 1,
    "method.teacher.max_new_tokens": 8, "method.distill.consolidate_max_tokens": 8,
    # The memory methods: episodes learned from, trials, reply lengths
    "learn.budget.episodes": 2, "method.train_tasks": 1, "method.trials": 2,
    "method.reflection_max_tokens": 8, "method.facts_max_tokens": 8, "method.update_max_tokens": 8,
    "method.script_max_tokens": 8,
}


def shrunk_overrides(cfg: Any) -> list[str]:
    """Overrides that shrink a composed config (a method with its preset) to one iteration and
    one evaluation task: counts and token limits only (:data:`PRESET_SIZES`, where ``cfg`` has
    the key), never dtype, precision, context, layout or aggregation, so a smoke run of a preset
    still runs what the preset is for. Add the machine (``llm.model=tiny``, ``llm.device=cpu``)."""
    from omegaconf import OmegaConf

    overrides = []
    for key, value in PRESET_SIZES.items():
        present = OmegaConf.select(cfg, key, default="<absent>")
        if present == "<absent>" or (present is None and value is not None):
            continue  # absent, or null by design (e.g. "the learning length")
        overrides.append(f"{key}={'null' if value is None else value}")
    return overrides


LEARN_SPLITS = frozenset({"train", "valid"})


@dataclass
class MethodRun:
    """What :func:`run_method` returns: the run directory and its ``results.json`` (as the
    :class:`~arena.core.contract.results.Results` model: ``run.results.learn.used["episodes"]``)."""

    path: Path
    results: Results

    def episodes(self, phase: str | None = None) -> list[EpisodeResult]:
        """Every recorded episode (``episodes.jsonl``), optionally of one phase."""
        lines = (self.path / "episodes.jsonl").read_text().splitlines()
        records = [EpisodeResult.from_dict(json.loads(line)) for line in lines if line.strip()]
        return [r for r in records if phase is None or r.phase == phase]

    def success_rate(self, split: str = "test_seen") -> float:
        return self.results.splits[split].success_rate

    def __getitem__(self, key: str) -> Any:
        """results.json's value at ``key``, as JSON (``run["splits"]["test_seen"]``): what
        ``run[key]`` gave before the results were a model."""
        return self.results.to_json()[key]


def fresh_plugins(*, entry_points: bool = True) -> Any:
    """Built-in plugins plus (by default) installed entry points, loaded anew (not the cached
    process-wide set), so a test sees exactly what is installed now."""
    from arena.core.config.plugins import Plugins

    plugins = Plugins()
    plugins.load_defaults()
    if entry_points:
        plugins.load_entry_points()
    return plugins


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _register_in_process(plugins: Any, method: Any, name: str | None, config: Any) -> str:
    """Register a plugin module/object or a bare method class; the method name to run."""
    registers = getattr(method, "register_methods", None)
    if registers is not None and hasattr(registers, "arena_impl"):
        before = set(plugins.methods.names())
        plugin_name = getattr(method, "__name__", None) or type(method).__name__
        plugins.register_plugin(method, name=f"arena.testing:{plugin_name}")
        added = sorted(set(plugins.methods.names()) - before)
        if name is not None:
            if name not in added:
                raise ValueError(f"Plugin {plugin_name} registered {added}, not '{name}'.")
            return name
        if len(added) != 1:
            raise ValueError(
                f"Plugin {plugin_name} registered methods {added}; pass name= to say which to run."
            )
        return added[0]
    if not callable(method):
        raise TypeError(
            f"run_method takes a method name, a plugin with register_methods, or a method class; "
            f"got {method!r}."
        )
    method_name = name or getattr(method, "name", None) or _snake(getattr(method, "__name__", "method"))
    factory = method

    @arena.hookimpl
    def register_methods(register: Callable[..., None]) -> None:
        register(method_name, factory, config=config)

    wrapper = types.SimpleNamespace(__name__=f"arena.testing.{method_name}",
                                    register_methods=register_methods)
    plugins.register_plugin(wrapper, name=f"arena.testing:{method_name}")
    return str(method_name)


def run_method(
    method: str | Any,
    overrides: Sequence[str] = (),
    *,
    out: str | Path,
    name: str | None = None,
    config: str | Path | list[str | Path] | None = None,
    env: str | None = None,
    preset: str | None = None,
    plugins: Any = None,
    fast: bool = True,
) -> MethodRun:
    """Run learn + frozen evaluation of ``method`` and return its results.

    ``method`` is a registered name (built-in or installed), a plugin module/object with
    ``register_methods`` (registered for this run only), or a method class or factory
    (registered as ``name``, its ``name`` attribute, or its class name in snake case, with the
    YAML ``config`` if given). ``overrides`` come after :data:`FAST_OVERRIDES` (unless
    ``fast=False``), so they win. ``out`` is the run directory; it must not exist yet.
    """
    loaded = plugins if plugins is not None else fresh_plugins()
    method_name = (method if isinstance(method, str)
                   else _register_in_process(loaded, method, name, config))
    from arena.core import protocol

    settings = [*(FAST_OVERRIDES if fast else ()), *overrides]
    path, results = protocol.run(method_name, env, overrides=settings, out=out, plugins=loaded, preset=preset)
    return MethodRun(Path(path), results)


def learning_context(
    method: str = "base",
    overrides: Sequence[str] = (),
    *,
    out: str | Path,
    plugins: Any = None,
    fast: bool = True,
) -> Any:
    """A real :class:`~arena.core.execution.context.RunContext` in the learning phase, to call a method's
    hooks one by one (``MyMethod(run).update(run, ...)``) against a real store and world.

    The context's own hooks (``run.hook``, ``run.play``) are those of ``method``. Close its
    environment with ``run.env.close()`` when done (the ``learn_run`` fixture does).
    """
    from arena.core import protocol

    loaded = plugins if plugins is not None else fresh_plugins()
    settings = [*(FAST_OVERRIDES if fast else ()), *overrides]
    prepared = protocol.prepare(method, overrides=settings, out=out, plugins=loaded)
    session = protocol.Session(prepared, loaded)
    session.ctx.budget.start_metering()
    return session.ctx


def expert_trajectory(env: Any, task: Any, *, max_steps: int = 100) -> Any:
    """A successful trajectory of ``task``, played by the environment's expert (the household
    world has one): a success to learn from without a model that can solve anything."""
    from arena.core.execution.solver import Action, play

    episode = env.open(task)

    def expert(observation: Any, trajectory: Any) -> Action:
        action = episode.expert_action()
        if action is None:
            raise RuntimeError(f"Environment {task.env} has no expert for task {task.task_id}.")
        return Action(text=action)

    return play(episode, expert, max_steps=max_steps, max_invalid_actions=3)


def random_play(episodes: list[Any], steps: int, seed: int) -> int:
    """Uniformly random admissible commands over ``episodes`` (``steps`` split evenly between
    them), each reset when it ends; returns the steps taken. An environment's throughput
    benchmark (``benchmarks/bench_household.py``, ``bench_babyai.py``)."""
    rng = random.Random(seed)
    per_episode = steps // len(episodes)
    taken = 0
    for episode in episodes:
        observation = episode.reset()
        for _ in range(per_episode):
            observation = episode.step(rng.choice(observation.admissible_actions))
            taken += 1
            if observation.done:
                observation = episode.reset()
    return taken


def expert_episode(episode: Any) -> tuple[Observation, int]:
    """``episode`` played from a reset by its environment's expert, until it ends or the expert
    has no next command; the last observation and the steps played."""
    observation, steps = episode.reset(), 0
    while not observation.done and (action := episode.expert_action()) is not None:
        observation = episode.step(action)
        steps += 1
    return observation, steps


def expert_play(episodes: list[Any]) -> int:
    """Each episode played by its expert (:func:`expert_episode`); returns the episodes won."""
    return sum(expert_episode(episode)[0].won for episode in episodes)


def assert_frozen_protocol(run: MethodRun | Results | dict[str, Any] | str | Path) -> None:
    """Fail, saying what went wrong, unless the run kept the frozen evaluation protocol.

    Checks: the run is valid (no recorded violation), on the frozen track; the state digest
    before and after evaluation is the same; learning used only train/valid; and, where the run
    directory is at hand, every evaluated (task, seed, variant) was played exactly once and no
    test task appears in the learning phase. A results.json object (a dict) must match the
    results schema.
    """
    path: Path | None = None
    if isinstance(run, (str, Path)):
        path = Path(run)
        results = validate_results(json.loads((path / "results.json").read_text()), str(path / "results.json"))
    elif isinstance(run, MethodRun):
        path, results = run.path, run.results
    else:
        results = run if isinstance(run, Results) else validate_results(run)
    problems = []
    if results.violations:
        problems.append("violations: " + " | ".join(results.violations))
    if not results.valid:
        problems.append("results.json says valid: false")
    if results.track != "frozen":
        problems.append(f"track is {results.track!r}, not 'frozen'")
    before, after = results.state.digest_before_eval, results.state.digest_after_eval
    if not before or before != after:
        problems.append(
            f"state digest changed during evaluation ({str(before)[:12]} -> {str(after)[:12]}): "
            "the method learned from test episodes (store writes, state_digest, weights)"
        )
    used = set(results.learn.splits_used)
    if used - LEARN_SPLITS:
        problems.append(f"learned from {sorted(used - LEARN_SPLITS)}; only train/valid are allowed")
    if path is not None and (path / "episodes.jsonl").exists():
        records = MethodRun(path, results).episodes()
        learn_splits = {r.split for r in records if r.phase == "learn"} - LEARN_SPLITS
        if learn_splits:
            problems.append(f"learning episodes on {sorted(learn_splits)}")
        evaluated = Counter(r.key for r in records if r.phase == "evaluate")
        repeated = [key for key, count in evaluated.items() if count > 1]
        if repeated:
            problems.append(f"episodes played more than once: {repeated[:3]}")
        wrong_track = {r.track for r in records if r.phase == "evaluate"} - {"frozen"}
        if wrong_track:
            problems.append(f"evaluation episodes on track {sorted(wrong_track)}")
    if problems:
        raise AssertionError(
            f"Method '{results.method}' broke the frozen protocol:\n- " + "\n- ".join(problems)
        )


# ---------------------------------------------------------------------------------------------
# pytest fixtures (registered by the ``pytest11`` entry point ``arena.testing``)
# ---------------------------------------------------------------------------------------------

if pytest is not None:

    @pytest.fixture
    def arena_overrides() -> list[str]:
        """:data:`FAST_OVERRIDES` as a list to extend: fake LLM, hashing embedder, small world."""
        return list(FAST_OVERRIDES)

    @pytest.fixture
    def arena_plugins() -> Any:
        """Built-in plugins plus installed entry points, fresh for each test (register
        in-process plugins on it without touching other tests)."""
        return fresh_plugins()

    @pytest.fixture
    def household_env() -> Iterator[Any]:
        """The household world with small splits (60 train, 12 valid, 12 per test split)."""
        from arena.envs.household.plugin import make_household

        env = make_household({"n_train": 60, "n_valid": 12, "n_test": 12})
        yield env
        env.close()

    @pytest.fixture
    def fake_llm() -> FakeLLM:
        """The deterministic model-free backend (``generate`` answers "A short insight.")."""
        return FakeLLM()

    @pytest.fixture
    def tiny_llm() -> Any:
        """The tiny test model: a random 2-layer Llama with SmolLM2's tokenizer, real tokens and
        log-probs, built offline from a seed (a few seconds the first time on a machine)."""
        from arena.backends.transformers_backend import make_transformers_backend

        return make_transformers_backend({"model": "tiny", "dtype": "float32", "device": "cpu"})

    @pytest.fixture
    def experience_store(tmp_path: Path) -> Any:
        """An empty experience store in a temporary folder, with the model-free embedder."""
        from arena.core.services.embedder import HashingEmbedder
        from arena.core.services.store import ExperienceStore

        return ExperienceStore(tmp_path / "store", HashingEmbedder())

    @pytest.fixture
    def learn_run(tmp_path: Path, arena_plugins: Any) -> Iterator[Callable[..., Any]]:
        """``learn_run(method="base", overrides=())``: a real RunContext of ``method`` in the
        learning phase (fake LLM, small household world, empty store under ``tmp_path``). Call
        the method's hooks as Arena does: ``run.hook.update(run=run, trajectories=..., ...)``."""
        contexts: list[Any] = []

        def make(method: str = "base", overrides: Sequence[str] = (), **options: Any) -> Any:
            options.setdefault("out", tmp_path / f"learn-run{len(contexts)}")
            options.setdefault("plugins", arena_plugins)
            contexts.append(learning_context(method, overrides, **options))
            return contexts[-1]

        yield make
        for run in contexts:
            run.env.close()

    # Named by ``name=``: a function called ``run_method`` here would hide the one above.
    @pytest.fixture(name="run_method")
    def run_method_fixture(tmp_path: Path, arena_plugins: Any) -> Callable[..., MethodRun]:
        """:func:`run_method` with a fresh run directory under ``tmp_path`` for each call."""
        counter = iter(range(1_000_000))

        def run(method: str | Any, overrides: Sequence[str] = (), **options: Any) -> MethodRun:
            options.setdefault("out", tmp_path / f"run{next(counter)}")
            options.setdefault("plugins", arena_plugins)
            return run_method(method, overrides, **options)

        return run
