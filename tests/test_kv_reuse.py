"""KV reuse across the steps of an episode is exact, and the transcript layout only ever appends.

Whole evaluations with the tiny model (float32) are played twice, with ``llm.prefix_cache`` on
(each step computes only what its prompt adds to a cached one) and off (every prompt computed from
scratch, left-padded in batches of concurrent episodes): every ``choose`` must return the same
choice, the same log-probs within 1e-4 and the same RL token records.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.core.contract.types import Observation, Step, Task, Trajectory
from arena.core.execution.solver import StandardSolver, build_prompt
from arena.testing import ChoiceRecorder

#: Episodes side by side (their calls batched when the cache is off), long enough to matter.
EVAL = ["llm.model=tiny", "llm.dtype=float32", "embedder.name=hashing", "env.n_train=8",
        "env.n_valid=4", "env.n_test=6", "eval.limit=null", "eval.max_steps=9", "eval.concurrency=3",
        "llm.batch_size=3"]


def recorded_choices(tmp_path: Path, layout: str, prefix_cache: bool) -> tuple[dict, dict[str, Any]]:
    """Every choose call of a base evaluation: prompt token ids -> (choice, logprobs, tokens)."""
    plugins = Plugins()
    plugins.load_defaults()
    recorder = ChoiceRecorder(plugins)
    out = tmp_path / f"{layout}-{prefix_cache}"
    _, results = protocol.run(
        "base", overrides=[*EVAL, "llm.backend=recording", f"solver.layout={layout}",
                           f"llm.prefix_cache={str(prefix_cache).lower()}"],
        out=out, plugins=plugins)
    calls = {tuple(c.choice.prompt_token_ids): (c.choice.text, c.choice.option_logprobs,
                                                c.choice.token_ids, c.choice.logprobs)
             for c in recorder.calls}
    stats = recorder.backends[-1].prefix_cache_stats
    return calls, {"results": results, "stats": stats, "out": out}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["transcript", "window"])
def test_cache_on_and_off_choose_the_same_with_the_same_logprobs(tmp_path: Path, layout: str) -> None:
    cached, on = recorded_choices(tmp_path, layout, prefix_cache=True)
    plain, off = recorded_choices(tmp_path, layout, prefix_cache=False)
    assert len(cached) >= 6 * 2 * 5, "too few distinct steps to compare"
    # Same prompts seen means every earlier step chose the same action.
    assert set(cached) == set(plain)
    for prompt, (text, option_logprobs, token_ids, logprobs) in cached.items():
        ref_text, ref_options, ref_ids, ref_logprobs = plain[prompt]
        assert text == ref_text
        assert token_ids == ref_ids  # the RL token records are unchanged
        assert option_logprobs == pytest.approx(ref_options, abs=1e-4)
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-4)
    assert off["stats"] == {}
    assert on["stats"]["tokens_reused"] > 0
    for run in (on, off):
        assert run["results"].solver.layout == layout
    steps_on = [json.loads(line) for line in (on["out"] / "episodes.jsonl").read_text().splitlines()]
    steps_off = [json.loads(line) for line in (off["out"] / "episodes.jsonl").read_text().splitlines()]
    key = lambda e: (e["task_id"], e["seed"], e.get("variant"))  # noqa: E731
    assert sorted((key(e), e["success"], e["steps"]) for e in steps_on) == sorted(
        (key(e), e["success"], e["steps"]) for e in steps_off)


@pytest.mark.slow
def test_transcript_steps_compute_only_what_they_append(tmp_path: Path) -> None:
    """In the transcript layout each step's prompt extends the previous step's, so the cache
    computes each step's new turn and little more (the first step of each episode shares only
    the system message)."""
    _, run = recorded_choices(tmp_path, "transcript", prefix_cache=True)
    stats = run["stats"]
    assert stats["tokens_reused"] > 3 * stats["tokens_computed"], stats


def test_transcript_layout_only_appends() -> None:
    task = Task(task_id="t1", env="household", split="test_seen", task_type="pick", goal="put a mug")
    trajectory = Trajectory(task=task, initial_observation="You are in a room. Your task is to: x.")
    admissible: list[list[str]] = []
    previous = None
    for k in range(4):
        observation = Observation(text=f"obs {k}", admissible_actions=(f"a{k}", "look"))
        admissible.append(list(observation.admissible_actions))
        chat = build_prompt(task, observation, trajectory, [], history=2, show_admissible=True,
                            max_experiences=4, max_experience_chars=800, layout="transcript",
                            admissible_shown=admissible)
        if previous is not None:
            assert chat[: len(previous)] == previous  # every earlier message kept verbatim
            assert [m["role"] for m in chat[len(previous):]] == ["assistant", "user"]
        assert chat[-1]["content"].endswith("Admissible actions: " + f"a{k}, look")
        previous = chat
        trajectory.steps.append(Step(action=f"a{k}", observation=f"obs {k + 1}", valid=True))
    assert [m["role"] for m in previous] == ["system", "user"] + ["assistant", "user"] * 3


def test_transcript_layout_needs_each_turns_admissible_actions() -> None:
    task = Task(task_id="t1", env="household", split="test_seen", task_type="pick", goal="g")
    trajectory = Trajectory(task=task, initial_observation="start")
    trajectory.steps.append(Step(action="look", observation="nothing", valid=True))
    observation = Observation(text="nothing", admissible_actions=("look",))
    with pytest.raises(ValueError, match="admissible_shown"):
        build_prompt(task, observation, trajectory, [], history=2, show_admissible=True,
                     max_experiences=4, max_experience_chars=800, layout="transcript",
                     admissible_shown=[["look"]])
    with pytest.raises(ValueError, match="Unknown solver.layout 'scroll'. Layouts: window, transcript"):
        StandardSolver(object(), layout="scroll")  # type: ignore[arg-type]


def test_a_transcript_past_the_context_keeps_its_task_and_cuts_in_blocks() -> None:
    """A transcript longer than ``llm.max_context`` loses its oldest exchanges, never the task,
    a block at a time: most steps still extend the previous step's prompt."""
    from arena.backends.transformers_backend import TransformersBackend

    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "max_context": 400})
    chat = [{"role": "system", "content": "RULES."}, {"role": "user", "content": "TASK: cool a mug."}]
    rows = []
    for k in range(40):
        chat = [*chat, {"role": "assistant", "content": f"go to shelf {k}"},
                {"role": "user", "content": f"You arrive at shelf {k}. On it you see nothing."}]
        rows.append(llm._encode_prompt(chat, reply_tokens=8))
    for row in rows:
        text = llm.tokenizer.decode(row)
        assert len(row) <= 392 and "RULES." in text and "TASK: cool a mug." in text
    assert llm.tokenizer.decode(rows[-1]).endswith("shelf 39. On it you see nothing.<|im_end|>\n"
                                                   "<|im_start|>assistant\n")
    extends = sum(later[: len(earlier)] == earlier for earlier, later in zip(rows, rows[1:]))
    assert extends >= 0.6 * (len(rows) - 1), extends


def test_the_cache_stays_within_its_token_bound_with_many_episodes_alive() -> None:
    """Twelve interleaved 'episodes' against a bound of 600 positions: the cache drops its
    least recently used prompts instead of growing, and scores stay exact."""
    from arena.backends.transformers_backend import TransformersBackend
    from arena.core.contract.llm import SamplingParams

    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": True,
                               "prefix_cache_tokens": 600})
    reference = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": False})
    chats = {k: [{"role": "system", "content": "Play."},
                 {"role": "user", "content": f"Episode {k}: find the mug {k}."}] for k in range(12)}
    for step in range(3):
        for k, chat in chats.items():
            chat += [{"role": "assistant", "content": f"go to shelf {step}"},
                     {"role": "user", "content": f"You arrive at shelf {step} of room {k}."}]
            [cached] = llm.choose([chat], [["look", "go to desk 1"]], SamplingParams())
            [plain] = reference.choose([chat], [["look", "go to desk 1"]], SamplingParams())
            assert cached.option_logprobs == pytest.approx(plain.option_logprobs, abs=1e-4)
            memory = llm.prefix_cache_memory()
            assert memory["tokens"] <= 600 and memory["bytes"] > 0
    assert llm.prefix_cache_stats["tokens_reused"] > 0


def test_a_step_replaces_its_previous_step_in_the_cache_so_many_long_episodes_all_hit() -> None:
    """Eight episodes whose prompts share the system message, then carry their own task and
    experience (reused by the next step), then a window that changes every step: the cache
    holds nine prompts' worth. Each step's entry replaces the one it was served by, so every
    step after the first reuses its episode's stable part; kept beside its successor, each
    episode held two entries, and the bound evicted the ones the next steps needed (a memrl
    evaluation recomputed such prompts for 38 % of its time). An entry another episode shared
    only the system message of is left alone."""
    import torch

    from arena.backends.transformers_backend import _PrefixCache

    def states(row: list[int]) -> object:
        layer = types.SimpleNamespace(keys=torch.zeros(1, 1, len(row) + 3, 1), values=torch.zeros(1, 1, len(row) + 3, 1))
        return types.SimpleNamespace(layers=[layer])  # 3 option nodes past the prompt

    system, stable, window = list(range(10)), 60, 25
    def prompt(episode: int, step: int) -> list[int]:
        own = [1000 * (episode + 1) + i for i in range(stable)]
        return system + own + [100_000 + 1000 * episode + 50 * step + i for i in range(window)]

    cache = _PrefixCache(capacity=32, max_tokens=9 * (len(system) + stable + window))
    reuse: dict[tuple[int, int], int] = {}
    for step in range(6):
        for episode in range(8):
            row = prompt(episode, step)
            reused, _, served_by = cache.longest(row)
            reuse[episode, step] = reused
            cache.store(row, states(row), served_by, reused)
            assert cache.tokens_held <= cache.max_tokens
    assert all(reuse[e, s] >= len(system) + stable for e in range(8) for s in range(1, 6)), reuse
    assert [reuse[e, 0] for e in range(1, 8)] == [len(system)] * 7  # served by another episode's entry
    assert cache.tokens_held == 8 * len(prompt(0, 0))  # one entry an episode: the latest


def test_changes_list_the_admissible_actions_once_then_what_changed() -> None:
    task = Task(task_id="t1", env="household", split="test_seen", task_type="pick", goal="g")
    trajectory = Trajectory(task=task, initial_observation="start")
    shown = [["go to desk 1", "look"], ["go to desk 1", "look", "take mug 1 from desk 1"],
             ["go to desk 1", "look", "take mug 1 from desk 1"], ["look"]]
    for action in ("go to desk 1", "look", "take mug 1 from desk 1"):
        trajectory.steps.append(Step(action=action, observation=f"after {action}", valid=True))
    chat = build_prompt(task, Observation(text="", admissible_actions=tuple(shown[-1])), trajectory, [],
                        history=2, show_admissible=True, max_experiences=4, max_experience_chars=800,
                        layout="transcript", admissible_shown=shown, admissible_turns="changes")
    users = [m["content"] for m in chat if m["role"] == "user"]
    assert users[0].endswith("Admissible actions: go to desk 1, look")
    assert users[1].endswith("Now admissible: take mug 1 from desk 1")
    assert users[2].endswith("Admissible actions: unchanged.")
    assert users[3].endswith("No longer admissible: go to desk 1, take mug 1 from desk 1")
    with pytest.raises(ValueError, match="Unknown solver.admissible_turns 'some'. Choices: full, changes"):
        StandardSolver(object(), admissible_turns="some")  # type: ignore[arg-type]


def test_an_auto_cache_bound_weighs_what_the_weights_weigh() -> None:
    """``llm.prefix_cache_tokens=auto``: positions whose keys and values weigh the model's weights,
    in either dtype; a number is kept; anything else is refused with what to set."""
    import torch

    from arena.backends.transformers_backend import (
        MIN_CACHE_TOKENS,
        TransformersBackend,
        kv_bytes_per_token,
        resolve_cache_tokens,
    )

    backend = TransformersBackend({"model": "tiny", "dtype": "float32"})
    model = backend.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    per_token = kv_bytes_per_token(model)
    config = model.config
    assert per_token == 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    assert backend.prefix_cache_tokens == max(MIN_CACHE_TOKENS, weights // per_token)
    assert backend.prefix_cache_tokens * per_token <= max(weights, MIN_CACHE_TOKENS * per_token)
    half = TransformersBackend({"model": "tiny", "dtype": "bfloat16"})
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert abs(half.prefix_cache_tokens - backend.prefix_cache_tokens) <= 1  # both halve together
    assert resolve_cache_tokens(600, model) == 600
    with pytest.raises(ValueError, match="auto or a number of tokens"):
        resolve_cache_tokens("lots", model)


def test_long_uncached_prompts_are_computed_in_chunks_with_the_same_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt whose states are not cached goes through the model PREFILL_CHUNK tokens at a
    time (a 2,000-token forward materialised 2,000 x 2,000 attention scores per head and layer):
    the scores are those of one forward, from scratch or from a cached prefix."""
    from arena.backends import transformers_backend
    from arena.backends.transformers_backend import TransformersBackend
    from arena.core.contract.llm import SamplingParams

    monkeypatch.setattr(transformers_backend, "PREFILL_CHUNK", 8)
    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": True})
    reference = TransformersBackend({"model": "tiny", "dtype": "float32", "prefix_cache": False})
    widths: list[int] = []
    decoder = llm.model.get_decoder()
    handle = decoder.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]),
                                               with_kwargs=True)
    chat = [{"role": "system", "content": "Play the household game."},
            {"role": "user", "content": "Your task is to put a clean mug in the coffee machine. " * 4}]
    options = [["look", "go to desk 1", "take mug 1 from desk 1"]]
    for _turn in range(2):  # from scratch, then from the first turn's cached states
        [cached] = llm.choose([chat], options, SamplingParams())
        [plain] = reference.choose([chat], options, SamplingParams())
        assert cached.option_logprobs == pytest.approx(plain.option_logprobs, abs=1e-4)
        chat = [*chat, {"role": "assistant", "content": "look"},
                {"role": "user", "content": "You see a desk 1, a shelf 2 and a coffee machine 1. " * 3}]
    handle.remove()
    chunks = [w for w in widths if w == 8]
    assert len(chunks) >= 6 and max(widths) <= 8 + len(options[0]) * 8, widths  # the last chunk carries the tree
