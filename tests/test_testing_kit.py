"""arena.testing as a pytest plugin: its fixtures, run_method and assert_frozen_protocol."""

from __future__ import annotations

import pytest

import arena
from arena.core.contract.llm import SamplingParams
from arena.core.contract.types import Experience, Provenance
from arena.testing import FakeLLM, MethodRun, assert_frozen_protocol, expert_trajectory


class CountingMethod:
    """Counts learning episodes in its own state and reports it through state_digest."""

    name = "counting"

    def __init__(self, run):
        self.seen = 0

    @arena.hookimpl
    def update(self, run, trajectories):
        self.seen += len(trajectories)

    @arena.hookimpl
    def state_digest(self):
        return str(self.seen)


class CheatingMethod(CountingMethod):
    """Also keeps learning from test episodes: the frozen protocol must catch it."""

    name = "cheating"

    @arena.hookimpl
    def episode_end(self, run, result):
        self.seen += 1


class StoreWriter:
    """Writes the store while retrieving: refused during frozen evaluation."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def retrieve(self, run, task):
        run.store.add([Experience("note", task.goal, Provenance((task.task_id,), task.split))])
        return []


def test_fixtures_give_a_small_world_fake_model_and_empty_store(
        household_env, fake_llm, experience_store, arena_overrides) -> None:
    assert len(household_env.tasks("train")) == 60
    assert len(household_env.tasks("test_unseen")) == 12
    assert isinstance(fake_llm, FakeLLM)
    assert experience_store.count() == 0
    task = household_env.tasks("train")[0]
    experience_store.add([Experience("note", task.goal, Provenance((task.task_id,), "train"))])
    assert experience_store.count(kind="note") == 1
    assert "llm.backend=fake" in arena_overrides


def test_run_method_runs_an_uninstalled_class_and_it_passes(run_method) -> None:
    run = run_method(CountingMethod)
    assert isinstance(run, MethodRun) and run["method"] == "counting"
    assert len(run.episodes("learn")) == 8  # FAST_OVERRIDES: learn.budget.episodes=8
    assert {r.phase for r in run.episodes()} == {"learn", "evaluate"}
    assert_frozen_protocol(run)
    assert_frozen_protocol(run.path)  # from the run directory alone, too


def test_assert_frozen_protocol_catches_learning_from_test_episodes(run_method) -> None:
    run = run_method(CheatingMethod)
    with pytest.raises(AssertionError, match="state digest changed during evaluation"):
        assert_frozen_protocol(run)


def test_assert_frozen_protocol_catches_a_store_write(run_method) -> None:
    run = run_method(StoreWriter, name="store_writer")
    with pytest.raises(AssertionError, match="Refused store write"):
        assert_frozen_protocol(run)


def test_assert_frozen_protocol_rejects_the_online_track(run_method) -> None:
    run = run_method("rag", ["run.track=online"])
    with pytest.raises(AssertionError, match="track is 'online'"):
        assert_frozen_protocol(run)


def test_learn_run_calls_a_methods_hooks_as_arena_does(learn_run) -> None:
    run = learn_run("rag")
    task = run.tasks("train")[0]
    trajectory = expert_trajectory(run.env, task)
    assert trajectory.success
    examples = run.hook.extract(run=run, trajectories=[trajectory])
    run.hook.update(run=run, trajectories=[trajectory], experiences=examples)
    assert run.store.count() == 1
    other = next(t for t in run.tasks("train") if t.task_type == task.task_type and t != task)
    assert [e.experience_id for e in run.hook.retrieve(run=run, task=other)] == \
        [examples[0].experience_id]


@pytest.mark.slow
def test_tiny_llm_scores_options(tiny_llm) -> None:
    chat = [{"role": "user", "content": "Pick one."}]
    (choice,) = tiny_llm.choose([chat], [["go to cabinet 1", "look"]], SamplingParams())
    assert choice.text in ("go to cabinet 1", "look") and len(choice.option_logprobs) == 2
    assert all(lp < 0 for lp in choice.option_logprobs)  # real log-probs of a real model
