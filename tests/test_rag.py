"""rag: what is stored, what is retrieved (and never: test data), and the protocol end to end."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import arena
from arena.core import protocol
from arena.core.config.compose import compose
from arena.core.contract.types import Provenance, Step, Task, Termination, Trajectory
from arena.core.execution.context import EVALUATE, LEARN
from arena.core.execution.solver import Action, play
from arena.core.services.embedder import HashingEmbedder
from arena.core.services.store import ExperienceStore
from arena.plugins.rag import TRAJECTORY, Rag, example_experience, render_example
from tests.helpers.runs import harness_of

RAG_CONFIG = Path(arena.plugins.rag.__file__).with_name("config.yaml")


def task(number: int, goal: str, split: str = "train", task_type: str = "pick") -> Task:
    return Task(f"household/{split}/{number:05d}", "household", split, task_type, goal)


def episode(of: Task, won: bool, n_steps: int = 3) -> Trajectory:
    steps = [Step(f"go to cabinet {i}", f"You arrive at cabinet {i}.", True) for i in range(1, n_steps)]
    steps.append(Step("put mug 1 in/on cabinet 1", "You put the mug 1 in/on the cabinet 1.", True))
    return Trajectory(task=of, initial_observation="You are in a room.", steps=steps,
                      status=Termination.SUCCESS if won else Termination.STEP_LIMIT)


@pytest.fixture
def run(plugins):
    cfg = compose(plugins, "rag", overrides=["llm.backend=fake"])
    logged: list[tuple[int, dict]] = []
    return types.SimpleNamespace(cfg=cfg, store=ExperienceStore(None, HashingEmbedder()), phase=LEARN,
                                 track="frozen", has_store=lambda: True, logged=logged,
                                 budget=types.SimpleNamespace(used={"episodes": 1}),  # the episode just played
                                 log_metrics=lambda step, metrics: logged.append((step, dict(metrics))))


def learn_from(run, method: Rag, trajectories: list[Trajectory]) -> None:
    for trajectory in trajectories:
        method.update(run, [trajectory], method.extract(run, [trajectory]))


def test_render_keeps_the_goal_and_the_last_actions():
    long = episode(task(1, "put a mug in cabinet."), won=True, n_steps=60)
    text = render_example(long, max_chars=300)
    assert text.startswith("Solved example. Task: put a mug in cabinet.\n> ...\n")
    assert text.endswith("> put mug 1 in/on cabinet 1") and len(text) < 300 + 60
    short = render_example(episode(task(1, "put a mug in cabinet."), won=True), max_chars=300)
    assert "> ..." not in short and short.count("\n> ") == 3


def test_only_successes_are_stored_indexed_by_their_task(run):
    method = Rag(run)
    won, lost = episode(task(1, "put a mug in cabinet."), True), episode(task(2, "heat an egg."), False)
    learn_from(run, method, [won, lost])
    [stored] = run.store.all()
    assert stored.kind == TRAJECTORY and stored.provenance == Provenance((won.task.task_id,), "train")
    [(found, score)] = run.store.query("put a mug in cabinet.", k=1)
    assert found == stored and score == pytest.approx(1.0, abs=1e-5)  # indexed by task text
    learn_from(run, method, [won])  # the same success again: stored once
    assert run.store.count() == 1


def test_retrieval_excludes_only_the_task_itself_while_learning(run):
    method = Rag(run)
    same_goal = [task(1, "put a mug in cabinet."), task(2, "put a mug in cabinet.")]
    others = [task(3, "put a cool mug in cabinet.", task_type="cool"),
              task(4, "clean some plate and put it in shelf.", task_type="clean")]
    learn_from(run, method, [episode(t, True) for t in same_goal + others])
    ids = {t.task_id for t in same_goal + others}

    learning = method.retrieve(run, same_goal[0])
    sources = [e.provenance.source_task_ids[0] for e in learning]
    assert len(learning) == 3 and same_goal[0].task_id not in sources
    assert sources[0] == same_goal[1].task_id  # another task with the same goal is fair game
    assert set(sources) == ids - {same_goal[0].task_id}  # other task types are not filtered out

    run.phase = EVALUATE  # at evaluation nothing is excluded: plain top-k by task text
    probe = task(9, "put a mug in cabinet.", split="test_seen")
    expected = [e.experience_id for e, _ in run.store.query(probe.goal, k=3)]
    assert [e.experience_id for e in method.retrieve(run, probe)] == expected
    method.cfg.k = 10
    assert len(method.retrieve(run, probe)) == 4

    run.phase = LEARN
    method.cfg.retrieve_while_learning = False
    assert method.retrieve(run, same_goal[0]) == []


def test_frozen_retrieval_never_returns_test_data(run):
    method = Rag(run)
    learn_from(run, method, [episode(task(1, "heat some egg and put it in fridge."), True),
                             episode(task(2, "clean a knife."), True)])
    probe = task(7, "put two mug in cabinet.", split="test_unseen", task_type="pick_two")
    leaked = example_experience(episode(probe, True), 600)  # as if a test success got in
    run.store.add([leaked], index_texts=[probe.goal])
    run.phase = EVALUATE
    frozen = method.retrieve(run, probe)
    assert len(frozen) == 2 and all(e.provenance.source_split == "train" for e in frozen)
    run.track = "online"  # the online track learns from test episodes: there they count
    assert method.retrieve(run, probe)[0].experience_id == leaked.experience_id


# -- the protocol end to end (tiny model; the household expert plays the learning episodes so
# -- that there are successes to store) -----------------------------------------------------


class ExpertRag(Rag):
    """rag whose learning episodes are played by the household world's expert."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        if run.phase != LEARN:
            return None  # the harness's standard solver (the tiny model) at evaluation
        game = run.env.open(task)
        return play(game, lambda observation, trajectory: Action(game.expert_action() or "look"),
                    max_steps=harness_of(run).max_steps(), max_invalid_actions=10,
                    experience_ids=[e.experience_id for e in experiences])


def register_expert_rag(plugins) -> None:
    module = types.SimpleNamespace(__name__="rag_test_plugin")

    @arena.hookimpl
    def register_methods(register):
        register("expert_rag", ExpertRag, config=RAG_CONFIG)

    module.register_methods = register_methods
    plugins.register_plugin(module, name="rag_test_plugin")


TINY = ["llm.model=tiny", "embedder.name=hashing", "env.n_train=30", "env.n_valid=4", "env.n_test=4",
        "eval.limit=2", "eval.max_steps=3", "learn.max_steps=60", "eval.concurrency=2",
        "learn.budget.episodes=5"]


@pytest.mark.slow
def test_learns_on_train_and_evaluates_frozen(plugins, tmp_path):
    register_expert_rag(plugins)
    path, results = protocol.run("expert_rag", overrides=TINY, out=tmp_path / "r", plugins=plugins)
    assert results.valid is True, results.violations
    assert results.state.digest_before_eval == results.state.digest_after_eval
    saved = json.loads((path / "results.json").read_text())
    for split in ("test_seen", "test_unseen"):
        assert saved["splits"][split]["n_episodes"] == 2
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    learned = [e for e in episodes if e["phase"] == "learn"]
    assert len(learned) == 5 and all(e["success"] for e in learned)
    assert results.state.memory_items == results.state.method["trajectories"] == 5
    # later learning episodes saw earlier ones, never their own task
    assert [len(e["experience_ids"]) for e in learned] == [0, 1, 2, 3, 3]

    store = ExperienceStore(path / "store", HashingEmbedder())
    stored = {e.experience_id: e for e in store.all()}
    assert all(e.provenance.source_split == "train" for e in stored.values())
    evaluated = [e for e in episodes if e["phase"] == "evaluate"]
    assert len(evaluated) == 4
    for record in evaluated:
        assert len(record["experience_ids"]) == 3 and set(record["experience_ids"]) <= set(stored)


@pytest.mark.slow
def test_the_registered_rag_runs_with_the_tiny_model(plugins, tmp_path):
    _, results = protocol.run("rag", overrides=TINY[:-2] + ["learn.max_steps=3", "learn.budget.episodes=2"],
                              out=tmp_path / "plain", plugins=plugins)
    assert results.valid is True and results.method == "rag"
    assert results.learn.used["episodes"] == 2
    assert results.state.method["trajectories"] == results.state.memory_items
