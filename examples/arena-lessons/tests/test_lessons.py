"""Tests of the lessons method, with the fixtures of Arena's pytest plugin (arena.testing)."""

from __future__ import annotations

from importlib.metadata import version
from types import SimpleNamespace

from arena_lessons.plugin import LESSON, Lessons
from omegaconf import OmegaConf

from arena import Step, Termination, Trajectory
from arena.testing import FakeLLM, assert_frozen_protocol, fresh_plugins


def test_plugin_is_installed() -> None:
    entry = fresh_plugins().methods.get("lessons")
    assert (entry.package, entry.version) == ("arena-lessons", version("arena-lessons"))
    assert set(entry.hooks) == {"extract", "update", "retrieve", "state_size"}


def test_learns_lessons_and_uses_them_frozen(run_method) -> None:
    run = run_method("lessons", ["learn.budget.episodes=6"])
    assert_frozen_protocol(run)
    assert run.results.state.method == {"lessons": 6}
    learned_types = {r.task_type for r in run.episodes("learn")}
    evaluated = run.episodes("evaluate")
    # An episode is shown lessons exactly when its task type was learned: never a lesson of
    # another type (test_unseen's types are not in train at all).
    assert any(r.experience_ids for r in evaluated)
    for r in evaluated:
        assert bool(r.experience_ids) == (r.task_type in learned_types), r


def test_one_lesson_per_episode_none_from_a_crash(household_env, fake_llm: FakeLLM) -> None:
    played, crashed = household_env.tasks("train")[:2]
    trajectories = [
        Trajectory(task=played, initial_observation="You are in a room.",
                   steps=[Step(action="look", observation="Nothing happens.", valid=True)]),
        Trajectory(task=crashed, initial_observation="", status=Termination.ERROR),
    ]
    run = SimpleNamespace(llm=fake_llm, cfg=OmegaConf.create(
        {"method": {"k": 2, "min_similarity": 0.0, "max_new_tokens": 8, "transcript_steps": 4}}))
    lessons = Lessons(run).extract(run, trajectories)
    assert [lesson.provenance.source_task_ids for lesson in lessons] == [(played.task_id,)]
    assert lessons[0].kind == LESSON and lessons[0].text.endswith(fake_llm.reply)
    assert fake_llm.usage.llm_calls == 1
