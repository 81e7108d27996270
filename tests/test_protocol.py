"""The evaluation protocol: frozen state, digests, coverage, budgets, tracks, results schema."""

from __future__ import annotations

import json
from collections import Counter
from typing import ClassVar

import pytest

import arena
from arena.core import protocol
from arena.core.contract.env import TEST_SPLITS
from arena.core.contract.types import Experience, Provenance
from arena.core.execution.context import ProtocolViolation
from arena.core.execution.tasks import select_tasks
from arena.core.storage.rundir import RunDirError
from tests.helpers.runs import register


def note(trajectory):
    return Experience(
        kind="note",
        text=f"{trajectory.task.goal} -> {'won' if trajectory.success else 'lost'}",
        provenance=Provenance((trajectory.task.task_id,), trajectory.task.split),
        metadata={"task_type": trajectory.task.task_type},
    )


class MemoryMethod:
    """A tiny memory method: stores one note per episode, retrieves the 2 most similar."""

    updates: ClassVar[list[str]] = []

    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def extract(self, run, trajectories):
        return [note(t) for t in trajectories]

    @arena.hookimpl
    def update(self, run, trajectories, experiences):
        MemoryMethod.updates.append(trajectories[0].task.split)
        run.store.add(experiences)

    @arena.hookimpl
    def retrieve(self, run, task):
        if run.store.count() == 0:
            return []
        return [experience for experience, _ in run.store.query(task.goal, k=2)]


class SneakyWriter(MemoryMethod):
    """Writes to the store while being evaluated (through a reference kept from learning)."""

    def __init__(self, run):
        super().__init__(run)
        self.kept = run.store

    @arena.hookimpl
    def retrieve(self, run, task):
        if task.split in TEST_SPLITS:
            try:
                self.kept.add([Experience("note", "peeked at " + task.goal, Provenance((task.task_id,), task.split))])
            except Exception:
                pass  # swallowing the error must not hide the violation
        return []


class DriftingMethod:
    """Changes its private state during evaluation, which the digest must catch."""

    def __init__(self, run):
        self.counter = 0

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        if task.split in TEST_SPLITS:
            self.counter += 1
        return run.play(arena.EpisodeRequest(task, experiences, seed, policy=arena.STANDARD))

    @arena.hookimpl
    def state_digest(self, run):
        return str(self.counter)


class PeekingMethod:
    """Asks for a test split while learning."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def learn(self, run):
        run.tasks("test_unseen")
        return True


class GreedyLearner:
    """Plays train tasks until the harness stops it; uses the valid split too."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def learn(self, run):
        from arena.core.execution.context import BudgetExhausted

        tasks = run.tasks("train") + run.tasks("valid")
        try:
            for number in range(1000):
                run.play(arena.EpisodeRequest(tasks[number % len(tasks)], [], 0, f"v{number}"))
                run.charge(gradient_steps=1)
        except BudgetExhausted:
            return True
        raise AssertionError("the budget was never enforced")


class UnboundedLearner:
    """Never checks its budget: the harness must stop it and still evaluate."""

    record = True

    def __init__(self, run):
        pass

    @arena.hookimpl
    def learn(self, run):
        task = run.tasks("train")[0]
        for number in range(1000):
            run.play(arena.EpisodeRequest(task, [], 0, f"v{number}", record=self.record))
        raise AssertionError("the budget was never enforced")


class OffTheRecordLearner(UnboundedLearner):
    """Plays its learning episodes with record=False and never records them: they must still
    be charged, or a method could learn without limit."""

    record = False


class RecordsLater:
    """Plays two learning episodes off the record, then records them (as a method recording
    after its update does): each is charged once."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def learn(self, run):
        task = run.tasks("train")[0]
        played = run.play([arena.EpisodeRequest(task, [], 0, f"v{number}", record=False) for number in range(2)])
        for number, trajectory in enumerate(played):
            run.record(trajectory, seed=0, variant=f"v{number}")


class OwnEpisodeWithSampling:
    """Plays the episode its solve is solving with a policy of its own and a sampling, which
    that policy would silently ignore."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        def first_action(observation, trajectory):
            return arena.Action(observation.admissible_actions[0])

        return run.play(arena.EpisodeRequest(task, experiences, policy=first_action,
                                             sampling={"temperature": 1.0}))


def read_episodes(path):
    return [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]


def test_every_test_task_once_per_seed(plugins, fast, tmp_path):
    path, results = protocol.run("base", overrides=fast + ["run.seeds=[0,1]"], out=tmp_path / "r", plugins=plugins)
    episodes = read_episodes(path)
    keys = Counter((e["split"], e["task_id"], e["seed"]) for e in episodes)
    assert set(keys.values()) == {1}
    for split in TEST_SPLITS:
        assert results.splits[split].n_tasks == 12
        assert results.splits[split].n_episodes == 24
    assert {e["seed"] for e in episodes} == {0, 1}


def test_frozen_store_refuses_writes_and_marks_run_invalid(plugins, fast, tmp_path):
    register(plugins, sneaky=SneakyWriter)
    _, results = protocol.run("sneaky", overrides=fast + ["learn.budget.episodes=3", "eval.limit=2"],
                                 out=tmp_path / "s", plugins=plugins)
    assert results.valid is False
    assert any("frozen" in v.lower() for v in results.violations)
    assert results.state.digest_before_eval == results.state.digest_after_eval
    assert results.state.memory_items == 3  # the refused writes did not happen


def test_state_digest_mismatch_marks_run_invalid(plugins, fast, tmp_path):
    register(plugins, drifting=DriftingMethod)
    _, results = protocol.run("drifting", overrides=fast + ["eval.limit=2"], out=tmp_path / "d", plugins=plugins)
    assert results.valid is False
    assert results.state.digest_before_eval != results.state.digest_after_eval
    assert any("changed during frozen evaluation" in v for v in results.violations)


def test_base_run_is_valid_and_frozen(plugins, fast, tmp_path):
    _, results = protocol.run("base", overrides=fast + ["eval.limit=3"], out=tmp_path / "b", plugins=plugins)
    assert results.valid is True and results.violations == []
    assert results.track == "frozen"
    assert results.state.digest_before_eval == results.state.digest_after_eval
    assert results.cost.learn.episodes == 0


def test_learning_from_a_test_split_is_refused(plugins, fast, tmp_path):
    register(plugins, peeker=PeekingMethod)
    _, results = protocol.run("peeker", overrides=fast + ["eval.limit=1"], out=tmp_path / "p", plugins=plugins)
    assert results.valid is False
    assert any("test split 'test_unseen'" in v for v in results.violations)


def test_direct_test_split_access_raises(plugins, fast, tmp_path):
    prepared = protocol.prepare("base", overrides=fast, out=tmp_path / "x", plugins=plugins)
    session = protocol.Session(prepared, plugins)
    with pytest.raises(ProtocolViolation, match="while learning"):
        session.ctx.tasks("test_seen")
    assert len(session.ctx.tasks("train")) == 60


def test_learn_budget_is_enforced_and_valid_split_recorded(plugins, fast, tmp_path):
    register(plugins, greedy=GreedyLearner)
    path, results = protocol.run(
        "greedy", overrides=fast + ["learn.budget.episodes=5", "eval.limit=1", "learn.max_steps=3"],
        out=tmp_path / "g", plugins=plugins)
    learn_episodes = [e for e in read_episodes(path) if e["phase"] == "learn"]
    assert len(learn_episodes) == 5
    assert max(e["steps"] for e in learn_episodes) == 3  # learn.max_steps, not eval.max_steps
    assert results.learn.used["episodes"] == 5
    assert results.learn.used["gradient_steps"] == 5
    assert results.learn.used_valid_split is True
    assert results.cost.learn.episodes == 5
    assert all(e["split"] in ("train", "valid") for e in learn_episodes)


def test_memory_method_learns_on_train_and_uses_it_frozen(plugins, fast, tmp_path):
    register(plugins, memory=MemoryMethod)
    MemoryMethod.updates.clear()
    path, results = protocol.run("memory", overrides=fast + ["learn.budget.episodes=4", "eval.limit=2"],
                                 out=tmp_path / "m", plugins=plugins)
    assert results.valid is True
    assert MemoryMethod.updates == ["train"] * 4  # update never ran on a test episode
    assert results.state.memory_items == 4
    evaluated = [e for e in read_episodes(path) if e["phase"] == "evaluate"]
    assert evaluated and all(len(e["experience_ids"]) == 2 for e in evaluated)
    assert results.cost.learn.llm_calls > 0


def test_online_track_updates_after_each_test_episode(plugins, fast, tmp_path):
    register(plugins, memory=MemoryMethod)
    MemoryMethod.updates.clear()
    _, results = protocol.run("memory", overrides=fast + ["run.track=online", "eval.limit=2"],
                              out=tmp_path / "o", plugins=plugins)
    assert results.track == "online"
    assert Counter(MemoryMethod.updates) == {"test_seen": 2, "test_unseen": 2}
    assert results.state.memory_items == 4


def test_results_schema(plugins, fast, tmp_path):
    """results.json as written (the file's keys), and the model returned reads the same."""
    path, returned = protocol.run("base", overrides=fast + ["eval.limit=2"], out=tmp_path / "r", plugins=plugins)
    results = json.loads((path / "results.json").read_text())
    assert results == returned.to_json()
    for key in ("schema_version", "method", "env", "track", "seeds", "splits", "cost", "state", "provenance"):
        assert key in results
    split = results["splits"]["test_seen"]
    for key in ("n_tasks", "n_episodes", "success_rate", "ci95", "progress_rate", "valid_action_rate",
                "mean_steps", "by_task_type"):
        assert key in split
    assert "variants" not in split  # an optional key is absent where there is nothing to say
    assert 0.0 <= split["ci95"][0] <= split["success_rate"] <= split["ci95"][1] <= 1.0
    for phase in ("learn", "evaluate"):
        assert set(results["cost"][phase]) >= {"episodes", "env_steps", "llm_calls", "tokens_in", "tokens_out", "wall_s"}
    assert results["cost"]["evaluate"]["episodes"] == 4
    assert results["cost"]["evaluate"]["llm_calls"] == results["cost"]["evaluate"]["env_steps"]
    prov = results["provenance"]
    for key in ("arena_version", "git_sha", "packages", "env_version", "split_hashes", "model", "config"):
        assert key in prov
    assert set(prov["split_hashes"]) >= {"train", "valid", "test_seen", "test_unseen"}
    assert set(prov["model"]) >= {"id", "weights_sha256"}
    assert results["limited"] is True
    assert results["protocol"] == {"max_steps": 12, "max_invalid_actions": 10, "limit": 2,
                                   "splits": ["test_seen", "test_unseen"],
                                   "env": {"level": "medium"}, "source_pool": "train", "eval_salt": "public"}
    assert "continued_from" not in results["learn"]
    assert results["record"]["episodes"] == 4 and len(results["record"]["head"]) == 64


def test_null_max_steps_is_the_environments_own_limit(plugins, fast, tmp_path):
    overrides = [o for o in fast if not o.startswith("eval.max_steps=")]
    path, results = protocol.run("base", overrides=overrides + ["eval.limit=1", "eval.max_steps=null"],
                                 out=tmp_path / "n", plugins=plugins)
    assert results.protocol.max_steps == 30  # the household world's own limit
    steps = [json.loads(line)["steps"] for line in (path / "episodes.jsonl").read_text().splitlines()]
    assert max(steps) <= 30


def test_select_tasks_is_stratified_and_stable(plugins):
    env = plugins.envs.get("household").factory({"seed": 0, "n_train": 60, "n_valid": 12, "n_test": 12})
    tasks = env.tasks("test_seen")
    chosen = select_tasks(tasks, 4)
    assert len({t.task_type for t in chosen}) == 4
    assert chosen == select_tasks(tasks, 4)
    assert select_tasks(tasks, None) == tasks


def test_budget_stops_a_method_that_ignores_it(plugins, fast, tmp_path):
    register(plugins, unbounded=UnboundedLearner)
    path, results = protocol.run("unbounded", overrides=fast + ["learn.budget.episodes=null", "learn.budget.env_steps=20", "eval.limit=1"],
                                 out=tmp_path / "u", plugins=plugins)
    learned = [e for e in read_episodes(path) if e["phase"] == "learn"]
    assert sum(e["steps"] for e in learned) >= 20
    assert sum(e["steps"] for e in learned[:-1]) < 20  # no episode started once the budget was used
    assert results.valid is True and results.splits["test_seen"].n_episodes == 1


def test_learning_episodes_played_off_the_record_are_charged(plugins, fast, tmp_path):
    register(plugins, off_record=OffTheRecordLearner, records_later=RecordsLater)
    _, results = protocol.run("off_record", overrides=fast + ["learn.budget.episodes=3", "eval.limit=1"],
                              out=tmp_path / "o", plugins=plugins)
    assert results.learn.used["episodes"] == 3  # stopped at the budget though nothing was recorded
    assert results.valid is True
    path, results = protocol.run("records_later", overrides=fast + ["learn.budget.episodes=2", "eval.limit=1"],
                                 out=tmp_path / "r", plugins=plugins)
    learned = [e for e in read_episodes(path) if e["phase"] == "learn"]
    assert len(learned) == 2
    assert results.learn.used["episodes"] == 2  # charged as played, not again as recorded
    assert results.learn.used["env_steps"] == sum(e["steps"] for e in learned)


def test_a_sampling_that_a_policy_would_ignore_is_refused_in_the_own_episode(plugins, fast, tmp_path):
    register(plugins, own_sampling=OwnEpisodeWithSampling)
    path, _ = protocol.run("own_sampling", overrides=fast + ["eval.limit=1"], out=tmp_path / "s", plugins=plugins)
    evaluated = [e for e in read_episodes(path) if e["phase"] == "evaluate"]
    assert evaluated and all(e["status"] == "error" and "sampling applies to policy='standard'" in e["error"]
                             for e in evaluated)


class WrongTrajectory:
    """Returns a trajectory of another task, claiming success."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        from arena.core.contract.types import Termination, Trajectory

        other = run.tasks("train")[0] if run.phase == "learn" else run.env.tasks("train")[0]
        return Trajectory(task=other, initial_observation="", status=Termination.SUCCESS)


def test_a_trajectory_of_another_task_is_recorded_as_an_error(plugins, fast, tmp_path):
    register(plugins, wrong=WrongTrajectory)
    path, results = protocol.run("wrong", overrides=fast + ["eval.limit=2"], out=tmp_path / "w", plugins=plugins)
    evaluated = [e for e in read_episodes(path) if e["phase"] == "evaluate"]
    assert len(evaluated) == 4 and all(e["status"] == "error" and not e["success"] for e in evaluated)
    assert results.splits["test_seen"].success_rate == 0.0


def test_duplicate_seeds_and_reused_run_dirs_are_refused(plugins, fast, tmp_path):
    with pytest.raises(ValueError, match="run.seeds lists a value twice"):
        protocol.run("base", overrides=fast + ["run.seeds=[0,0]"], out=tmp_path / "d", plugins=plugins)
    started = tmp_path / "started"
    started.mkdir()
    (started / "state.json").write_text('{"learn_done": true}')
    with pytest.raises(RunDirError, match="already holds a run"):
        protocol.prepare("base", overrides=fast, out=started, plugins=plugins)


def test_violations_survive_a_resume(plugins, fast, tmp_path):
    register(plugins, peeker=PeekingMethod)
    path, _ = protocol.run("peeker", overrides=fast + ["eval.limit=1"], out=tmp_path / "p", plugins=plugins)
    (path / "results.json").unlink()
    _, resumed = protocol.run(None, resume=path, plugins=plugins)
    assert resumed.valid is False
    assert any("test split 'test_unseen'" in v for v in resumed.violations)


class PoolReader:
    """Records the task types of the source pool in each phase; in learning it also plays a
    task of the environment's pool, which the harness must refuse."""

    seen: ClassVar[dict[str, set[str]]] = {}

    def __init__(self, run):
        PoolReader.seen = {}

    @arena.hookimpl
    def learn(self, run):
        PoolReader.seen["learn"] = {t.task_type for t in run.source_pool()}
        if run.cfg.method.get("peek_pool"):
            with pytest.raises(ProtocolViolation, match="source pool while learning"):
                run.tasks("pool")
            with pytest.raises(ProtocolViolation, match="source pool while learning"):
                run.env.pool_tasks()
            run.play(arena.EpisodeRequest(run.env._env.pool_tasks()[0], [], 0))  # reached past the view: still refused
        return True

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        PoolReader.seen.setdefault("evaluate", set()).update(t.task_type for t in run.source_pool())
        return None


@pytest.mark.parametrize("pool", ["train", "all_types"])
def test_source_pool_holds_every_type_only_at_test_time_and_only_when_asked(plugins, fast, tmp_path, pool):
    register(plugins, pool_reader=PoolReader)
    _, results = protocol.run("pool_reader", overrides=fast + ["eval.limit=2", f"eval.source_pool={pool}"],
                              out=tmp_path / pool, plugins=plugins)
    assert results.valid is True, results.violations
    seen_types = {"pick_and_place_simple", "pick_clean_then_place_in_recep",
                  "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep"}
    held_out = {"pick_two_obj_and_place", "look_at_obj_in_light"}
    assert PoolReader.seen["learn"] == seen_types  # learning never sees the pool
    assert PoolReader.seen["evaluate"] == (seen_types | held_out if pool == "all_types" else seen_types)
    assert results.protocol.source_pool == pool
    assert ("pool" in results.provenance.split_hashes) is (pool == "all_types")


def test_asking_for_or_playing_the_source_pool_while_learning_is_a_violation(plugins, fast, tmp_path):
    register(plugins, pool_reader=PoolReader)
    _, results = protocol.run("pool_reader", overrides=fast + ["eval.limit=1", "method.peek_pool=true"],
                              out=tmp_path / "p", plugins=plugins)
    assert results.valid is False
    assert any("asked for the test-time source pool" in v for v in results.violations)
    assert any("played source-pool task" in v for v in results.violations)


@pytest.mark.parametrize("override", ["eval.source_pool=all", "run.track=bogus"])
def test_a_choice_key_outside_its_choices_is_refused_before_the_run_exists(plugins, fast, tmp_path, override):
    with pytest.raises(ValueError, match=f"{override.split('=')[0]}=.* is not one of"):
        protocol.prepare("base", overrides=fast + [override], out=tmp_path / "r", plugins=plugins)
    assert not (tmp_path / "r").exists()


class HelperPlayer:
    """Plays two helper episodes of each test task before its own, as Evolving-RL does."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def evaluation_variants(self, run):
        return ["source", "without_skill"]

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        if run.phase == "evaluate":
            for helper in ("source", "without_skill"):
                run.play(arena.EpisodeRequest(task, [], run.current_seed(), helper, policy="standard"))
        return None


def expected_spot_checks(plugins, fast, tmp_path, method, monkeypatch) -> tuple[float, int]:
    """The checks a frozen evaluation expects (the sum of the check chance over its decisions),
    and the decisions it made."""
    from arena.core.execution.episodes import EpisodeRunner

    chances: list[float] = []
    rate = EpisodeRunner.spot_rate

    def recorded(self):
        chances.append(rate(self))
        return chances[-1]

    monkeypatch.setattr(EpisodeRunner, "spot_rate", recorded)
    protocol.run(method, overrides=fast + ["eval.limit=2", "eval.concurrency=1"], out=tmp_path / method,
                 plugins=plugins)
    return sum(chances), len(chances)


def test_spot_checks_count_the_episodes_a_method_plays_not_only_the_planned_tasks(
        plugins, fast, tmp_path, monkeypatch):
    """Issue 43: the rate assumed one episode per planned task, so a method that plays three per
    task (Evolving-RL) got three times the checks planned, and paid for them in time. Now about
    the same number of checks either way; the chance of each stays a fresh draw from `secrets`."""
    register(plugins, helpers=HelperPlayer)
    single, single_steps = expected_spot_checks(plugins, fast, tmp_path, "base", monkeypatch)
    helped, helped_steps = expected_spot_checks(plugins, fast, tmp_path, "helpers", monkeypatch)
    assert helped_steps == 3 * single_steps  # the same episode played three times (greedy)
    assert single > 0  # about SPOT_CHECKS where episodes take half their step limit, as planned
    assert helped < 1.5 * single, (helped, single)  # was 3 x: a rate per planned decision


def test_a_method_cannot_dilute_the_spot_checks_with_endless_helper_episodes():
    from arena.core.execution.episodes import MAX_EPISODES_PER_TASK, EpisodePace

    pace = EpisodePace()
    for _ in range(3):
        pace.task_begun()
        for _ in range(50):
            pace.episode_begun()
        pace.task_finished()
    assert pace.episodes_per_task() == 50
    assert MAX_EPISODES_PER_TASK == 4  # the rate's divisor stops there (EpisodeRunner.spot_rate)


def test_results_record_each_phases_commit_and_machine(plugins, fast, tmp_path, monkeypatch):
    """Issue 55: a row's learning can span commits and machines (float32 kernels differ by
    instruction set); results.json says which, phase by phase."""
    from arena.core.host import provenance

    sessions = iter([{"git_sha": "aaa", "cpu": {"model": "X", "isa": ["avx2"]}},
                     {"git_sha": "bbb", "cpu": {"model": "Y", "isa": ["avx512f"]}}])
    monkeypatch.setattr(provenance, "session", lambda: next(sessions))
    _, results = protocol.run("base", overrides=fast + ["eval.limit=1"], out=tmp_path / "r", plugins=plugins)
    assert results.provenance.phases == {
        "learn": [{"git_sha": "aaa", "cpu": {"model": "X", "isa": ["avx2"]}}],
        "evaluate": [{"git_sha": "bbb", "cpu": {"model": "Y", "isa": ["avx512f"]}}]}
    monkeypatch.undo()
    cpu = provenance.cpu()
    assert cpu["model"] and isinstance(cpu["isa"], list)
    assert set(cpu["isa"]) <= set(provenance.ISA_FLAGS)
