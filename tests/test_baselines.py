"""The critics' baselines: GiGPO, Reflexion and the Mem0-style memory, each unit by unit and end
to end through the frozen protocol (GiGPO on the tiny model, which it trains; the other two on
the fake backend)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.config.compose import compose
from arena.core.contract.method_config import typed_config
from arena.core.contract.types import Experience, Provenance, RolloutTokens, Step, Task, Termination, Trajectory
from arena.core.execution.context import EVALUATE, LEARN
from arena.core.rl import AdvantageSettings, EpisodeSignal, step_advantages
from arena.core.services.embedder import HashingEmbedder
from arena.core.services.store import ExperienceStore
from arena.plugins.gigpo.method import build_samples
from arena.plugins.gigpo.settings import GiGPOSettings
from arena.plugins.mem0.method import MEMORY, apply_events
from arena.plugins.mem0.prompts import EVENTS_PREFIX, FACTS_PREFIX, parse_events, parse_facts
from arena.plugins.reflexion.method import reflection_id, retry_due
from arena.plugins.reflexion.prompts import parse_reflection
from arena.testing import FakeLLM


def _episodes(jsonl: Path) -> list[dict]:
    return [json.loads(line) for line in jsonl.read_text().splitlines()]


# -- GiGPO -----------------------------------------------------------------------------------


def gigpo_settings(plugins, *overrides: str) -> GiGPOSettings:
    return typed_config(compose(plugins, "gigpo", overrides=list(overrides)).method, GiGPOSettings)


def _episode(task: Task, observations: list[str], won: bool) -> Trajectory:
    steps = [Step(f"act {i}", obs, True, rollout=RolloutTokens([1, 2, i], [5 + i], [-0.1]))
             for i, obs in enumerate(observations)]
    return Trajectory(task, "start", steps, Termination.SUCCESS if won else Termination.STEP_LIMIT,
                      progress=1.0 if won else 0.0)


def test_gigpo_samples_carry_each_decisions_own_advantage(plugins) -> None:
    cfg = gigpo_settings(plugins, "method.advantage.normalisation=mean",
                         "method.advantage.episode_level_over=episodes")
    task = Task("household/train/a", "household", "train", "pick", "put a mug on the desk")
    won = _episode(task, ["at desk", "done"], True)          # anchors: start, at desk
    lost = _episode(task, ["Nothing happens.", "at desk", "x"], False)  # start, Nothing, at desk
    samples, figures = build_samples([won, lost], ["g", "g"], cfg)
    expected = step_advantages([
        EpisodeSignal("g", 10.0, [0.0, 10.0], ["start", "at desk"]),
        EpisodeSignal("g", 0.0, [0.0, 0.0, 0.0], ["start", "Nothing happens.", "at desk"]),
    ], AdvantageSettings(estimator="gigpo", gamma=0.95, normalisation="mean"))
    assert [s.advantage for s in samples] == pytest.approx(expected[0] + expected[1])
    # The winner's second decision and the loser's third met the same state ("at desk"):
    # their step-level terms are opposite, on top of the episode terms +5 and -5.
    assert samples[1].advantage - 5.0 == pytest.approx(-(samples[4].advantage + 5.0))
    assert samples[3].advantage == pytest.approx(-5.0)  # a state met once: no step-level term
    assert figures["step_groups"] == 3 and figures["decisions_in_shared_states"] == pytest.approx(4 / 5)
    grpo = gigpo_settings(plugins, "method.advantage.estimator=grpo", "method.advantage.normalisation=mean",
                          "method.advantage.episode_level_over=episodes")
    assert [s.advantage for s in build_samples([won, lost], ["g", "g"], grpo)[0]] == [5, 5, -5, -5, -5]
    # The authors' defaults (mean and std, episode statistics over steps) go through the same estimator.
    authors = gigpo_settings(plugins)
    assert authors.estimator == AdvantageSettings(estimator="gigpo", gamma=0.95, step_weight=1.0,
                                                  normalisation="mean_std", episode_level_over="steps")
    signals_ = [EpisodeSignal("g", 10.0, [0.0, 10.0], ["start", "at desk"]),
                EpisodeSignal("g", 0.0, [0.0] * 3, ["start", "Nothing happens.", "at desk"])]
    flat = [a for row in step_advantages(signals_, authors.estimator) for a in row]
    assert [s.advantage for s in build_samples([won, lost], ["g", "g"], authors)[0]] == pytest.approx(flat)


def test_gigpo_takes_its_penalty_off_the_steps_whose_reply_was_malformed_only(plugins) -> None:
    """The authors' "invalid" is a reply without its tags (or in another script): a
    well-formed inadmissible action is not penalised; a malformed one is, on its own step."""
    from arena.core.execution.solver import well_formed
    from arena.plugins.gigpo.method import step_penalties, step_rewards

    assert well_formed("<reasoning>the mug is on the desk</reasoning> <Action>take mug 1</ACTION>")
    for reply in ("<action>take mug 1</action>", "<reasoning>x</reasoning> take mug 1",
                  "<reasoning>拿杯子</reasoning><action>take mug 1</action>"):
        assert not well_formed(reply), reply
    task = Task("household/train/a", "household", "train", "pick", "put a mug on the desk")
    episode = _episode(task, ["Nothing happens.", "at desk", "done"], True)
    episode.steps[0].valid = False  # inadmissible, in good form: no penalty
    episode.steps[1].well_formed = False
    cfg = gigpo_settings(plugins)
    assert cfg.invalid_action_penalty == 0.1  # the authors' coefficient
    assert step_rewards(episode, 10.0) == [0.0, 0.0, 10.0]
    assert step_penalties(episode, cfg) == pytest.approx([0.0, 0.1, 0.0])  # off its own row only
    unpenalised = gigpo_settings(plugins, "method.invalid_action_penalty=0")
    assert step_penalties(episode, unpenalised) == [0.0, 0.0, 0.0]
    other = _episode(task, ["Nothing happens.", "x", "y"], False)  # its second decision shares the state
    penalised, _ = build_samples([episode, other], ["g", "g"], cfg)
    plain, _ = build_samples([episode, other], ["g", "g"], unpenalised)
    assert penalised[1].advantage < plain[1].advantage  # the malformed step's own advantage drops


def test_the_react_solver_records_whether_each_reply_was_well_formed() -> None:
    from arena.core.execution.solver import StandardSolver, play
    from arena.envs.household.environment import HouseholdEnvironment

    replies = iter(["<reasoning>look</reasoning><action>look</action>", "look around"])
    llm = FakeLLM(reply=lambda prompt: next(replies))
    env = HouseholdEnvironment(level="easy", n_train=4, n_valid=2, n_test=2)
    task = env.tasks("train")[0]
    solver = StandardSolver(llm, mode="react", instructions=env.instructions())
    trajectory = play(env.open(task), solver.policy(task, [], seed=0), max_steps=2, max_invalid_actions=5)
    assert [step.well_formed for step in trajectory.steps] == [True, False]
    assert Trajectory.from_dict(json.loads(json.dumps(trajectory.to_dict()))).steps[1].well_formed is False


def test_gigpo_settings_are_checked(plugins) -> None:
    with pytest.raises(ValueError, match="group_size"):
        gigpo_settings(plugins, "method.group_size=1")
    with pytest.raises(ValueError, match="grpo"):
        gigpo_settings(plugins, "method.advantage.estimator=ppo")


TINY_GIGPO = ["llm.model=tiny", "embedder.name=hashing", "env.n_train=30", "env.n_valid=4", "env.n_test=4",
              "eval.limit=1", "eval.max_steps=3", "learn.max_steps=3", "eval.concurrency=4",
              "method.iterations=1", "method.tasks_per_iteration=2", "method.group_size=2",
              "method.trainer.micro_batch_size=16"]


@pytest.mark.slow
def test_gigpo_end_to_end_on_the_tiny_model(plugins, tmp_path) -> None:
    path, results = protocol.run("gigpo", overrides=TINY_GIGPO, out=tmp_path / "g", plugins=plugins)
    learned = [e for e in _episodes(path / "episodes.jsonl") if e["phase"] == "learn"]
    assert len(learned) == 2 * 2  # tasks x group size
    assert results.learn.used["gradient_steps"] == 1
    (metrics,) = [json.loads(line)["metrics"] for line in (path / "metrics.jsonl").read_text().splitlines()
                  if json.loads(line)["phase"] == "learn"]
    assert metrics["step_groups"] >= 2 and metrics["samples"] > 0 and "grad_norm" in metrics
    assert results.valid is True and results.state.method["trainable_parameters"] > 0
    # the board reads how its update computed (precision auto: bf16 autocast where native)
    import torch

    from arena.report import load_run
    from arena.report.aggregate import update_precisions

    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert update_precisions(load_run(path)) == {"bf16 autocast" if native else "float32"}


@pytest.mark.slow
def test_gigpo_runs_isolated_with_its_held_out_curve(plugins, tmp_path) -> None:
    """As the board runs it: the held-out check sends its sampling (a config section) from the
    worker, which must arrive as plain data."""
    path, results = protocol.run("gigpo", overrides=[*TINY_GIGPO, "run.isolation=process", "eval.salt=public",
                                                     "method.valid_every=1", "method.valid_tasks=1"],
                                 out=tmp_path / "g", plugins=plugins)
    assert results.valid is True and results.provenance.isolation["mode"] == "process"
    held_out = [json.loads(line)["metrics"] for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert any("valid_success" in m for m in held_out)


class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing on the way catches it."""


#: Each trainer with two checkpointed iterations (SkillRL: two RL steps after one SFT step).
TWO_CHECKPOINTS = {
    "gigpo": [*TINY_GIGPO, "method.iterations=2", "method.mini_batch_size=4"],
    "grpo": [*TINY_GIGPO[:-4], "method.iterations=2", "method.n_sources=2", "method.group_size=2",
             "method.valid_every=0", "method.mini_batch_size=4", "method.trainer.micro_batch_size=16",
             "learn.budget.gradient_steps=null"],
    "skillrl": [*TINY_GIGPO[:-4], "method.collect.tasks=1", "method.sft.tasks=1", "method.sft.steps=1",
                "method.rl.steps=2", "method.rl.tasks_per_step=2", "method.rl.group_size=2",
                "method.rl.mini_batch_size=4", "method.evolution.every=0", "method.teacher.max_new_tokens=8"],
}


@pytest.mark.slow
@pytest.mark.parametrize(("method", "kill_after_save"),
                         [("gigpo", True), ("gigpo", False), ("grpo", True), ("grpo", False), ("skillrl", True)])
def test_a_trainer_killed_around_its_checkpoint_charges_each_step_once(plugins, tmp_path, monkeypatch,
                                                                       method, kill_after_save) -> None:
    """Killed right after (or right before) saving the first iteration's checkpoint, a resumed
    run charges every optimizer step exactly once (rl.StepLedger) and learns both iterations."""
    from arena.core.rl.checkpointed import CheckpointedTrainer

    real_save = CheckpointedTrainer.save

    def save_then_die(self, number):
        if number == 1:
            if kill_after_save:
                real_save(self, number)
            raise Killed()
        real_save(self, number)

    monkeypatch.setattr(CheckpointedTrainer, "save", save_then_die)
    with pytest.raises(Killed):
        protocol.run(method, overrides=TWO_CHECKPOINTS[method], out=tmp_path / "k", plugins=plugins)
    monkeypatch.setattr(CheckpointedTrainer, "save", real_save)
    path, results = protocol.run(None, resume=tmp_path / "k", plugins=plugins)
    logged = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    updates = {m["step"]: m["metrics"].get("updates", 0) for m in logged
               if m["phase"] == "learn" and isinstance(m["step"], int) and m["step"] > 0 and "success" in m["metrics"]}
    sft = json.loads((path / "method" / "state.json").read_text()).get("sft", {}).get("sft/steps", 0)
    assert sorted(updates) == [1, 2]
    assert results.learn.used["gradient_steps"] == sum(updates.values()) + sft > 0
    assert results.valid is True


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gigpo", "grpo", "skillrl"])
def test_a_continued_trainer_trains_a_second_phase_charged_its_own_steps(plugins, tmp_path, method) -> None:
    """A run that continues from a trained one (run.continue_from) starts from its weights and
    trains its iterations again after the source's (arena.begin_learning_phase); it copies the
    source's state, ledger included, and its budget is charged the steps it takes only."""
    source, first = protocol.run(method, overrides=TWO_CHECKPOINTS[method], out=tmp_path / "first", plugins=plugins)
    assert first.learn.used["gradient_steps"] > 0
    path, results = protocol.run(method, overrides=[*TWO_CHECKPOINTS[method], f"run.continue_from={source}"],
                                 out=tmp_path / "second", plugins=plugins)
    logged = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    trained = {m["step"]: m["metrics"].get("updates", 0) for m in logged
               if m["phase"] == "learn" and isinstance(m["step"], int) and "success" in m["metrics"]}
    assert sorted(trained) == [3, 4]  # the source's iterations were 1 and 2
    assert results.learn.used["gradient_steps"] == sum(trained.values()) > 0
    state = json.loads((path / "method" / "state.json").read_text())
    progress = "steps_done" if method == "skillrl" else "iterations_done"  # SkillRL: its RL steps
    assert state[progress] == 4 and state["phase"] == 1 and state["phase_start"] == 2
    assert results.learn.continued_from["run"] == str(source.resolve())
    assert results.valid, results.violations


# -- Reflexion -------------------------------------------------------------------------------


def test_reflexion_retries_until_solved_or_out_of_trials() -> None:
    assert retry_due([], 3) and retry_due([False, False], 3)
    assert not retry_due([False, True], 3) and not retry_due([False, False, False], 3)
    assert parse_reflection(" Go to the fridge.\nThen open it.\n") == "Go to the fridge.\nThen open it."


def test_reflexion_learns_on_train_and_shows_reflections_of_similar_tasks_at_test(run_method) -> None:
    result = run_method("reflexion", ["llm.reply=Open the fridge before taking the apple.",
                                      "method.train_tasks=4", "method.trials=2", "eval.max_steps=4",
                                      "learn.max_steps=4"])
    episodes = _episodes(result.path / "episodes.jsonl")
    learned = [e for e in episodes if e["phase"] == "learn"]
    first = {e["task_id"]: e for e in learned if e["variant"] == "trial0"}
    second = [e for e in learned if e["variant"] == "trial1"]
    assert len(first) == 4
    # Only the failed tasks are tried again, each with its one reflection in the prompt.
    assert {e["task_id"] for e in second} == {t for t, e in first.items() if not e["success"]}
    assert second and all(len(e["experience_ids"]) == 1 for e in second)
    assert all(e["experience_ids"][0] == f"reflexion:train:{e['task_id']}:0" for e in second)
    # At test: reflections of train tasks of the same type, never of the test task itself.
    tested = [e for e in episodes if e["phase"] == "evaluate"]
    shown = [i for e in tested for i in e["experience_ids"]]
    assert shown and all(i.startswith("reflexion:train:") for i in shown)
    types_of = {e["task_id"]: e["task_type"] for e in learned}
    assert all(types_of[i.split(":")[2]] == e["task_type"] for e in tested for i in e["experience_ids"])
    state = result.results.state.method
    assert state["trials"] == len(learned) and state["train_tasks_tried"] == 4
    assert state["train_tasks_solved"] == sum(1 for e in learned if e["success"])
    assert state["reflections"] == sum(1 for e in learned if not e["success"])
    assert result.results.valid is True


def test_reflexion_on_the_online_track_reflects_on_test_failures(run_method) -> None:
    result = run_method("reflexion", ["run.track=online", "llm.reply=Look first.",
                                      "method.train_tasks=2", "method.trials=1", "eval.max_steps=3",
                                      "eval.concurrency=1"])
    assert result.results.track == "online"
    episodes = _episodes(result.path / "episodes.jsonl")
    failed = {phase: [e for e in episodes if e["phase"] == phase and not e["success"]]
              for phase in ("learn", "evaluate")}
    assert failed["evaluate"]
    # One reflection per failed episode: the train trials' and, online, the test episodes'.
    assert result.results.state.method["reflections"] == len(failed["learn"]) + len(failed["evaluate"])
    # A later test task of the same type is shown what an earlier one's failure taught.
    assert any(i.startswith("reflexion:test_") for e in episodes if e["phase"] == "evaluate"
               for i in e["experience_ids"])


def test_reflexion_indexes_reflections_by_their_tasks_goal(plugins) -> None:
    """A reflection is found from a similar task's goal, whatever its own text says."""
    from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
    from arena.plugins.reflexion.method import Reflexion

    cfg = compose(plugins, "reflexion", overrides=["llm.backend=fake"])
    run = types.SimpleNamespace(cfg=cfg, store=ExperienceStore(None, HashingEmbedder()),
                                llm=FakeLLM(reply="zzz qqq xxx"), env=types.SimpleNamespace(
                                    instructions=HOUSEHOLD_INSTRUCTIONS))
    method = Reflexion(run)
    goals = ["put a cool apple in fridge.", "clean some mug and put it in shelf."]
    failures = [Trajectory(Task(f"household/train/{i}", "household", "train", "t", goal), "start",
                           [Step("look", "Nothing happens.", True)], Termination.STEP_LIMIT)
                for i, goal in enumerate(goals)]
    added = method._reflect(run, failures, 0, seed=0, phase=0)
    assert [e.experience_id for e in added] == [reflection_id(t.task, 0) for t in failures]
    (best, _), *_ = run.store.query("clean some cup and put it in shelf.", k=2)
    assert best.metadata["task_id"] == "household/train/1"
    assert method._reflect(run, failures, 0, seed=0, phase=0) == []  # a replayed round adds nothing twice
    assert reflection_id(Task("t", "household", "train", "x", "g"), 2) == "reflexion:train:t:2"


# -- Mem0 ------------------------------------------------------------------------------------


def test_mem0_parses_whole_and_cut_replies() -> None:
    assert parse_facts('{"facts": ["The apple is in fridge 1.", "Mugs are in cabinets."]}', 8) == [
        "The apple is in fridge 1.", "Mugs are in cabinets."]
    # Cut at the token limit: the complete strings before the cut are kept.
    assert parse_facts(FACTS_PREFIX + 'The apple is in fridge 1.", "Mugs are in cabi', 8) == [
        "The apple is in fridge 1."]
    assert parse_facts("I could not find anything.", 8) == []
    assert parse_facts('{"facts": ["a", "a", "b", "c"]}', 2) == ["a", "b"]
    events = parse_events(EVENTS_PREFIX + '0", "text": "x", "event": "update"}, {"id": "1", "event": "BOGUS"}, '
                                          '{"id": "2", "text": "y", "event": "ADD"')
    assert events == [{"id": "0", "text": "x", "event": "UPDATE"}]
    assert parse_events('{"memory": [{"id": "0", "text": "", "event": "DELETE"}]}') == [
        {"id": "0", "text": "", "event": "DELETE"}]


def test_mem0_applies_add_update_delete_none_and_ignores_invented_ids() -> None:
    store = ExperienceStore(None, HashingEmbedder())
    source = Provenance(("household/train/a",), "train")
    kept, changed, dropped = (Experience(MEMORY, text, source, {"task_type": "pick"})
                              for text in ("Mugs are in cabinets.", "The apple is in fridge 1.", "Knives are in drawers."))
    store.add([kept, changed, dropped])
    run = types.SimpleNamespace(store=store)
    shown = {"0": kept, "1": changed, "2": dropped}
    counts = apply_events(run, [
        {"id": "0", "text": "Mugs are in cabinets.", "event": "NONE"},
        {"id": "1", "text": "The apple is in fridge 2.", "event": "UPDATE"},
        {"id": "0", "text": "", "event": "DELETE"},  # no text: skipped, as mem0 does
        {"id": "2", "text": "Knives are in drawers.", "event": "DELETE"},
        {"id": "9", "text": "Pans are on stoves.", "event": "UPDATE"},
        {"id": "3", "text": "Lamps are on desks.", "event": "ADD"},
    ], shown, Provenance(("household/train/b",), "train"), "look")
    assert counts == {"ADD": 1, "UPDATE": 1, "DELETE": 1, "NONE": 1, "unknown_id": 1, "empty": 1}
    by_id = {e.experience_id: e for e in store.all(kind=MEMORY)}
    assert dropped.experience_id not in by_id and kept.experience_id in by_id
    updated = by_id[changed.experience_id]  # the same id, the new text, its history noted
    assert updated.text == "The apple is in fridge 2." and updated.metadata["updates"] == 1
    assert updated.metadata["previous"] == "The apple is in fridge 1."
    assert updated.provenance.source_task_ids == ("household/train/a", "household/train/b")
    assert [e.text for e in by_id.values() if e.metadata.get("task_type") == "look"] == ["Lamps are on desks."]


@pytest.fixture
def mem0_replies(monkeypatch):
    """The fake backend answers fact extraction with two facts and the update with an ADD of
    the first fact and a NONE for the memory shown as "0"."""
    real = FakeLLM.generate

    def generate(self, prompts, params):
        def reply(chat):
            if chat[-1]["content"] == FACTS_PREFIX:
                return 'The apple is in fridge 1.", "Opening the fridge works."]}'
            if chat[-1]["content"] == EVENTS_PREFIX:
                return '0", "text": "The apple is in fridge 1.", "event": "NONE"}, ' \
                       '{"id": "1", "text": "The apple is in fridge 1.", "event": "ADD"}]}'
            return "?"
        self.reply = reply
        return real(self, prompts, params)

    monkeypatch.setattr(FakeLLM, "generate", generate)


def test_mem0_end_to_end_frozen_and_online(run_method, mem0_replies) -> None:
    frozen = run_method("mem0", ["learn.budget.episodes=3"])
    assert frozen.results.valid is True
    # Every ADD is a new memory, as in mem0 (telling a known fact apart is the LLM's NONE);
    # from the second episode on, the stored memory is shown as "0" and its NONE applied.
    assert frozen.results.state.method["memories"] == 3
    metrics = [json.loads(line)["metrics"] for line in (frozen.path / "metrics.jsonl").read_text().splitlines()
               if json.loads(line)["phase"] == LEARN]
    assert [m["events/add"] for m in metrics] == [1, 1, 1]
    assert [m["events/none"] for m in metrics] == [0, 1, 1]
    assert [m["events/unknown_id"] for m in metrics] == [1, 0, 0]
    tested = [e for e in _episodes(frozen.path / "episodes.jsonl") if e["phase"] == EVALUATE]
    assert tested and all(len(e["experience_ids"]) == 3 for e in tested)  # search_limit 4, 3 stored
    online = run_method("mem0", ["learn.budget.episodes=1", "run.track=online", "eval.concurrency=1"])
    assert online.results.track == "online" and online.results.valid is True
    tested = [e for e in _episodes(online.path / "episodes.jsonl") if e["phase"] == EVALUATE]
    # One memory from learning, then one ADD after each test episode.
    assert online.results.state.method["memories"] == 1 + len(tested)


@pytest.mark.parametrize("method, settings", [
    ("reflexion", ["method.train_tasks=2", "method.trials=2", "llm.reply=Look first."]),
    ("mem0", ["learn.budget.episodes=2"]),
])
def test_reflexion_and_mem0_run_isolated_as_the_board_runs_them(run_method, method, settings) -> None:
    result = run_method(method, ["run.isolation=process", "eval.salt=public", *settings])
    assert result.results.valid is True
    assert result.results.provenance.isolation["mode"] == "process"
    if method == "reflexion":  # what the worker wrote reached the harness's store
        failed = [e for e in _episodes(result.path / "episodes.jsonl") if e["phase"] == "learn" and not e["success"]]
        assert failed and result.results.state.method["reflections"] == len(failed)


@pytest.mark.slow
def test_a_slimmed_rl_run_finishes_its_evaluation_as_if_never_moved_and_learns_no_more(plugins, tmp_path) -> None:
    """`arena slim` on an RL run stopped in its evaluation (how a board row moves to another
    machine without Adam's moments): the resumed evaluation serves the learned weights, so it
    plays what an uninterrupted run plays, verifies, and the checkpoint is a third of its size.
    A run still learning is refused: its optimizer state is what learning resumes from; so is
    continuing to learn from a slimmed run."""
    from click.testing import CliRunner

    from arena.cli import cli
    from arena.core.storage.files import RunDirError
    from arena.report.verify import verify_run
    from tests.helpers.runs import killed_run

    def evaluation(path: Path) -> list[tuple]:
        lines = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
        return sorted((e["split"], e["task_id"], e["seed"], e["success"], e["steps"], e["status"])
                      for e in lines if e["phase"] == EVALUATE)

    def checkpoint_bytes(path: Path) -> int:
        return sum(f.stat().st_size for f in (path / "method").rglob("checkpoint-*/*") if f.is_file())

    reference, _ = protocol.run("gigpo", overrides=TINY_GIGPO, out=tmp_path / "reference", plugins=plugins)
    learned = sum(json.loads(line)["phase"] == LEARN for line in (reference / "episodes.jsonl").open())
    assert killed_run(tmp_path / "learning", TINY_GIGPO, "episode.recorded:1", method="gigpo") == 137
    refused = CliRunner().invoke(cli, ["slim", str(tmp_path / "learning")])
    assert refused.exit_code == 1 and "has not finished learning" in refused.output

    moved = tmp_path / "moved"
    assert killed_run(moved, TINY_GIGPO, f"episode.recorded:{learned + 1}", method="gigpo") == 137
    before = checkpoint_bytes(moved)
    slimmed = CliRunner().invoke(cli, ["slim", str(moved)])
    assert slimmed.exit_code == 0 and "MiB ->" in slimmed.output, slimmed.output
    assert 0 < checkpoint_bytes(moved) < 0.45 * before

    path, results = protocol.run(None, resume=moved, plugins=plugins)
    assert results.valid is True, results.violations  # the state on resume is the learned one
    assert evaluation(path) == evaluation(reference) and len(evaluation(path)) > 1
    assert verify_run(path).status == "verified"
    with pytest.raises(RunDirError, match="was slimmed.*full copy"):  # refused before anything is played
        protocol.run("gigpo", overrides=[*TINY_GIGPO, f"run.continue_from={path}"], out=tmp_path / "more",
                     plugins=plugins)
