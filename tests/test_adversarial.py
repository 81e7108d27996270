"""Hostile methods: each tries one way to get a winning result credited; each must end invalid or
be refused, while the honest methods stay valid (``docs/security.md`` lists the measures).

All run with the fake backend on a small household world (about a second a run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

import arena
from arena.cli import cli
from arena.core import integrity, protocol
from arena.core.context import ProtocolViolation
from arena.core.rpc import RemoteError
from arena.core.rundir import RunDirError
from arena.core.solver import Action
from arena.core.types import Experience, Provenance, Step, Termination, Trajectory
from arena.report import ReportError, build_tables, compare_runs, load_run, load_runs
from tests.test_protocol import register

EVAL = ["eval.limit=2"]


def run(plugins, fast, tmp_path, method, *extra, name="r"):
    return protocol.run(method, overrides=fast + EVAL + list(extra), out=tmp_path / name, plugins=plugins)


def evaluated(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    return [e for e in lines if e["phase"] == "evaluate"]


def successes(results: dict) -> list[float]:
    return [results["splits"][s]["success_rate"] for s in ("test_seen", "test_unseen")]


class Hostile:
    def __init__(self, run):
        self.run = run


# -- 1. a made-up trajectory ----------------------------------------------------------------------


class Forger(Hostile):
    """Returns a won trajectory it never played."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        return Trajectory(task=task, initial_observation="You won.", steps=[Step("win", "You won.", True)],
                          status=Termination.SUCCESS)


class Editor(Hostile):
    """Plays honestly, then marks the lost episode won."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        trajectory = run.standard_solve(task, experiences, seed)
        trajectory.status = Termination.SUCCESS
        return trajectory


@pytest.mark.parametrize("method", ["forger", "editor"])
def test_a_trajectory_the_harness_did_not_play_is_not_credited(plugins, fast, tmp_path, method):
    register(plugins, forger=Forger, editor=Editor)
    path, results = run(plugins, fast, tmp_path, method)
    assert results["valid"] is False
    assert any("does not reproduce" in v for v in results["violations"])
    assert successes(results) == [0.0, 0.0]
    assert all(e["status"] == "error" and "not reproduced" in e["error"] for e in evaluated(path))


# -- 2. a shadow episode with the expert ----------------------------------------------------------


class ShadowExpert(Hostile):
    """At evaluation, opens its own episode of the test task and copies the expert's moves."""

    payloads: ClassVar[list[dict]] = []  # what every instance was shown

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        ShadowExpert.payloads.append(dict(task.payload))
        shadow = run.env.open(task)
        shadow.reset()

        def copy_expert(observation, trajectory):
            action = shadow.expert_action() or "look"
            shadow.step(action)
            return Action(action)

        return run.play_policy(task, copy_expert, experiences)


def test_a_shadow_episode_at_evaluation_is_refused_and_test_payloads_are_hidden(plugins, fast, tmp_path):
    register(plugins, shadow=ShadowExpert)
    ShadowExpert.payloads = []
    _, results = run(plugins, fast, tmp_path, "shadow")
    assert results["valid"] is False
    assert any("opened an episode" in v for v in results["violations"])
    assert successes(results) == [0.0, 0.0]
    assert ShadowExpert.payloads and all(p == {} for p in ShadowExpert.payloads)  # no layout seed


# -- 3. test tasks and the expert while learning --------------------------------------------------


class PeekingLearner(Hostile):
    """While learning, reads test tasks through the environment and plays them with the expert."""

    @arena.hookimpl
    def learn(self, run):
        for task in run.env.tasks("test_seen")[:2]:
            run.env.open(task)
        return True


def test_test_tasks_through_the_environment_while_learning_are_refused(plugins, fast, tmp_path):
    register(plugins, test_learner=PeekingLearner)
    _, results = run(plugins, fast, tmp_path, "test_learner")
    assert results["valid"] is False
    assert any("test split 'test_seen' while learning" in v for v in results["violations"])


class Opener(Hostile):
    @arena.hookimpl
    def learn(self, run):
        test_task = run.env._env.tasks("test_seen")[0]  # reached past the view
        with pytest.raises(ProtocolViolation):
            run.env.open(test_task)
        return True


def test_an_episode_of_a_test_task_while_learning_is_refused(plugins, fast, tmp_path):
    register(plugins, opener=Opener)
    _, results = run(plugins, fast, tmp_path, "opener")
    assert results["valid"] is False and any("opened an episode of test_seen" in v for v in results["violations"])


# -- 4. test-time memory, deleted before the end digest ------------------------------------------


class HiddenMemory(Hostile):
    """Writes a memory to the raw store at evaluation, shows it, deletes it at the last episode."""

    @arena.hookimpl
    def learn(self, run):
        run.store.add([Experience("note", "learned honestly", Provenance(("t",), "train"))])
        return True

    @arena.hookimpl
    def retrieve(self, run, task):
        if run.phase != "evaluate":
            return []
        raw = run.store._store  # past the frozen view
        memory = Experience("note", f"answer for {task.goal}", Provenance(("train-0",), "train"))
        raw.add([memory])
        return [memory]

    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate" and trajectory.experience_ids:
            run.store._store.delete(trajectory.experience_ids)


def test_memory_written_at_evaluation_and_deleted_is_caught(plugins, fast, tmp_path):
    register(plugins, hidden=HiddenMemory)
    _, results = run(plugins, fast, tmp_path, "hidden")
    assert results["state"]["digest_before_eval"] == results["state"]["digest_after_eval"]  # evaded
    assert results["valid"] is False
    assert any("not in the frozen store" in v for v in results["violations"])


class ProvenanceForger(Hostile):
    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        note = Experience("note", "seen it", Provenance((task.task_id,), task.split))
        return run.standard_solve(task, [note], seed)


def test_an_experience_of_test_provenance_is_refused(plugins, fast, tmp_path):
    register(plugins, test_notes=ProvenanceForger)
    _, results = run(plugins, fast, tmp_path, "test_notes")
    assert results["valid"] is False and any("not in the frozen store" in v for v in results["violations"])


# -- 5. weights changed for the test, put back inside state_digest --------------------------------


class WeightSwapper(Hostile):
    """Changes the served weights for every test episode; restores them in its state_digest."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        self.original = getattr(self, "original", run.llm.inner.weights)
        run.llm.inner.weights = "tuned on the test"  # then the standard solver plays

    @arena.hookimpl
    def state_digest(self, run):
        run.llm.inner.weights = self.original
        return ""


def test_weights_restored_inside_state_digest_are_caught(plugins, fast, tmp_path):
    register(plugins, swapper=WeightSwapper)
    _, results = run(plugins, fast, tmp_path, "swapper")
    assert results["valid"] is False
    assert any("changed during frozen evaluation" in v or "random check" in v for v in results["violations"])


class EpisodeSwapper(Hostile):
    """Changes the weights while an episode plays and puts them back before it ends, so the end
    digest sees nothing: only the random checks inside episodes can."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        self.original = getattr(self, "original", run.llm.inner.weights)
        run.llm.inner.weights = "tuned on the test"
        try:
            return run.standard_solve(task, experiences, seed)
        finally:
            run.llm.inner.weights = self.original


def test_weights_changed_within_each_episode_are_caught_by_random_checks(plugins, fast, tmp_path):
    register(plugins, episode_swapper=EpisodeSwapper)
    # every check made (12 per 12 steps): a test that could only pass by luck would test nothing
    monkey = pytest.MonkeyPatch()
    monkey.setattr(protocol, "SPOT_CHECKS", 10_000)
    try:
        _, results = run(plugins, fast, tmp_path, "episode_swapper")
    finally:
        monkey.undo()
    assert results["state"]["digest_before_eval"] == results["state"]["digest_after_eval"]
    assert results["valid"] is False and any("random check" in v for v in results["violations"])


# -- 6 and 7. a forged record ---------------------------------------------------------------------


def forge_successes(path: Path, recompute: bool) -> None:
    """Mark every test episode of ``path`` won (recomputing the chain's hashes and results.json's
    record of them if asked, as a forger who read integrity.py would; the MAC needs the key,
    which the forger lacks)."""
    lines = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    prev = integrity.GENESIS
    for line in lines:
        if line["phase"] == "evaluate":
            line.update(success=True, status="success")
        if recompute:
            line["chain"]["prev"] = prev
            line["chain"]["hash"] = integrity.line_hash(prev, line)
            prev = line["chain"]["hash"]
    (path / "episodes.jsonl").write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    results = path / "results.json"
    if recompute and results.exists():
        data = json.loads(results.read_text())
        data["record"]["head"] = prev
        results.write_text(json.dumps(data))


@pytest.mark.parametrize("recompute", [False, True])
def test_a_forged_record_is_refused_on_resume(plugins, fast, tmp_path, recompute):
    path, _ = run(plugins, fast, tmp_path, "base")
    (path / "results.json").unlink()  # "the run crashed once"
    forge_successes(path, recompute)
    with pytest.raises(RunDirError, match=r"episodes.jsonl, line \d+") as refused:
        protocol.run(None, resume=path, plugins=plugins)
    assert ("MAC" in str(refused.value)) is recompute


@pytest.mark.parametrize("recompute", [False, True])
def test_a_forged_record_is_refused_by_compare_leaderboard_and_show(plugins, fast, tmp_path, recompute):
    honest, _ = run(plugins, fast, tmp_path, "base", name="honest")
    forged, _ = run(plugins, fast, tmp_path, "base", "run.seeds=[1]", name="forged")
    forge_successes(forged, recompute)
    for read in (lambda: compare_runs(load_run(honest), load_run(forged)),
                 lambda: build_tables(load_runs([honest, forged]))):
        with pytest.raises(ReportError, match=r"forged/episodes.jsonl, line \d+"):
            read()
    shown = CliRunner().invoke(cli, ["show", str(forged)])
    assert shown.exit_code != 0 and "episodes.jsonl, line" in shown.output


def test_a_record_cut_short_or_replaced_is_refused(plugins, fast, tmp_path):
    path, _ = run(plugins, fast, tmp_path, "base")
    lines = (path / "episodes.jsonl").read_text().splitlines(keepends=True)
    (path / "episodes.jsonl").write_text("".join(lines[:-1]))  # the last (lost) episode dropped
    with pytest.raises(ReportError, match="does not end where"):
        load_run(path)
    (path / "episodes.jsonl").write_text("".join(lines))
    load_run(path)  # restored: accepted


def test_the_mac_is_checked_where_the_key_is(plugins, fast, tmp_path, monkeypatch):
    path, results = run(plugins, fast, tmp_path, "base")
    assert results["record"]["key_id"] == integrity.key_id(integrity.record_key())
    forge_successes(path, recompute=True)
    monkeypatch.setenv("ARENA_RECORD_KEY_FILE", str(tmp_path / "elsewhere.key"))  # another machine
    load_run(path)  # without the key the recomputed hashes pass: the MAC is this machine's check
    monkeypatch.undo()
    with pytest.raises(ReportError, match="MAC"):
        load_run(path)


# -- phase, track, config and store ---------------------------------------------------------------


class PhaseFlipper(Hostile):
    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        run.phase = "learn"  # so that store writes are allowed again


class TrackSetter(Hostile):
    @arena.hookimpl
    def learn(self, run):
        run.track = "online"
        return True


@pytest.mark.parametrize("method, field", [("flipper", "run.phase"), ("track_setter", "run.track")])
def test_phase_and_track_are_read_only_for_methods(plugins, fast, tmp_path, method, field):
    register(plugins, flipper=PhaseFlipper, track_setter=TrackSetter)
    _, results = run(plugins, fast, tmp_path, method)
    assert results["valid"] is False and results["track"] == "frozen"
    assert any(f"tried to set {field}" in v for v in results["violations"])


class ConfigEditor(Hostile):
    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate":
            config = run._run_dir.path / "config.yaml"  # reached past the context
            config.write_text(config.read_text().replace("max_steps: 12", "max_steps: 99"))


class StoreDeleter(Hostile):
    @arena.hookimpl
    def learn(self, run):
        run.store.add([Experience("note", "learned", Provenance(("t",), "train"))])
        return True

    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate":
            shutil.rmtree(run._run_dir.path / "store", ignore_errors=True)  # reached past


@pytest.mark.parametrize("method, message", [("config_editor", "config.yaml was changed"),
                                             ("store_deleter", "store/ folder was deleted")])
def test_config_edits_and_store_deletion_during_evaluation_are_caught(plugins, fast, tmp_path, method, message):
    register(plugins, config_editor=ConfigEditor, store_deleter=StoreDeleter)
    _, results = run(plugins, fast, tmp_path, method)
    assert results["valid"] is False and any(message in v for v in results["violations"])


def test_a_config_edited_before_resume_is_refused(plugins, fast, tmp_path):
    path, _ = run(plugins, fast, tmp_path, "base")
    (path / "results.json").unlink()
    config = path / "config.yaml"
    config.write_text(config.read_text().replace("max_steps: 12", "max_steps: 5"))
    with pytest.raises(RunDirError, match="config.yaml was edited after the run started"):
        protocol.run(None, resume=path, plugins=plugins)


# -- failures keep the work -----------------------------------------------------------------------


class BrokenDigest(Hostile):
    @arena.hookimpl
    def state_digest(self, run):
        raise RuntimeError("cannot hash")


class BrokenSize(Hostile):
    @arena.hookimpl
    def state_size(self, run):
        raise RuntimeError("cannot count")


@pytest.mark.parametrize("method, hook", [("broken_digest", "state_digest"), ("broken_size", "state_size")])
def test_a_failing_state_hook_keeps_the_evaluation(plugins, fast, tmp_path, method, hook):
    register(plugins, broken_digest=BrokenDigest, broken_size=BrokenSize)
    path, results = run(plugins, fast, tmp_path, method)
    assert (path / "results.json").is_file() and results["cost"]["evaluate"]["episodes"] == 4
    assert results["valid"] is False and any(f"{hook} of method '{method}' raised" in v for v in results["violations"])


class WrongTypes(Hostile):
    @arena.hookimpl
    def retrieve(self, run, task):
        return "a string, not experiences"


def test_a_hook_returning_the_wrong_type_is_named(plugins, fast, tmp_path):
    register(plugins, wrong_types=WrongTypes)
    path, _ = run(plugins, fast, tmp_path, "wrong_types", "learn.budget.episodes=0")
    errors = {e["error"] for e in evaluated(path)}
    assert errors == {("retrieve failed: HookReturnError: retrieve of method 'wrong_types' returned str; "
                       "expected a list of arena.core.types.Experience (or None).")}
    row, = build_tables(load_runs([path]))[0].rows
    assert any(flag.startswith("every test episode errored") for flag in row.flags)


# -- the honest methods ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["base", "random", "rag", "memrl", "expel"])
def test_honest_methods_stay_valid(plugins, fast, tmp_path, method):
    extra = ["learn.budget.episodes=2", "learn.max_steps=3"] if method != "base" else []
    if method == "expel":
        extra = ["method.train_tasks=2", "learn.max_steps=3"]
    path, results = run(plugins, fast, tmp_path, method, *extra)
    assert results["valid"] is True, results["violations"]
    assert load_run(path).chained


# -- the run context's parts: only the harness advances the phase or keeps the record ------------


class PhaseAdvancer(Hostile):
    """Tries the harness's own calls: the phase's advance, and a new evaluation without checks."""

    @arena.hookimpl
    def learn(self, run):
        for attempt in (lambda: run.phases.advance("evaluate", key=object()),
                        lambda: run.episodes.begin_evaluation(object(), [])):
            with pytest.raises(ProtocolViolation, match="only the harness may"):
                attempt()
        return True

    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate":
            with pytest.raises(ProtocolViolation):
                run.episodes.begin_evaluation(object(), [], spot_check=None)


def test_only_the_harness_advances_the_phase(plugins, fast, tmp_path):
    register(plugins, advancer=PhaseAdvancer)
    _, results = run(plugins, fast, tmp_path, "advancer")
    assert results["valid"] is False
    assert any("tried to set the run's phase to 'evaluate'" in v for v in results["violations"])
    assert any("tried to start the evaluation" in v for v in results["violations"])


class ViolationEraser(Hostile):
    """Breaks the protocol, then empties the violations list of state.json."""

    @arena.hookimpl
    def learn(self, run):
        with pytest.raises(ProtocolViolation):
            run.tasks("test_seen")
        with pytest.raises(AttributeError, match="run.method_state"):
            run.run_dir  # noqa: B018 - the harness's, not the method's
        run._run_dir.update_state(violations=[])  # reached past the context
        return True


def test_erasing_violations_from_state_json_does_not_validate_a_run(plugins, fast, tmp_path):
    register(plugins, eraser=ViolationEraser)
    _, results = run(plugins, fast, tmp_path, "eraser")
    assert results["valid"] is False
    assert any("asked for test split 'test_seen'" in v for v in results["violations"])


def test_a_store_that_cannot_be_read_is_a_violation_not_a_crash(plugins, fast, tmp_path, monkeypatch):
    # chromadb sometimes raises (code 14, unable to open database file) once a plugin has deleted
    # the store's folder under it: the harness must still write its results, flagged.
    from arena.core.store import ExperienceStore

    def unreadable(self):
        raise RuntimeError("unable to open database file")

    register(plugins, store_deleter=StoreDeleter)
    monkeypatch.setattr(ExperienceStore, "size", unreadable)
    _, results = run(plugins, fast, tmp_path, "store_deleter")
    assert results["valid"] is False
    assert any("could not be read for its size" in v for v in results["violations"])


# -- 7b. documented calls only: pre-filling the record, picking the best of several attempts -----


class PreFiller(Hostile):
    """Records a won episode for the task before the harness plays it (run.record is public)."""

    @arena.hookimpl
    def retrieve(self, run, task):
        forged = Trajectory(task=task, initial_observation="You won.", steps=[Step("win", "You won.", True)],
                            status=Termination.SUCCESS)
        run.record(forged, seed=int(run.cfg.run.seeds[0]))
        return []


class BestOfThree(Hostile):
    """Plays the test task three times as helper variants (sampling), returns the best one."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        tries = [run.play(task, experiences, seed=run.current_seed(), variant=f"try{i}", policy="standard",
                          sampling={"temperature": 1.0, "top_p": 1.0}) for i in range(3)]
        best = max(tries, key=lambda t: (t.success, -len(t.steps)))
        best.copy_of = f"try{tries.index(best)}"
        return best


def test_only_the_harness_records_an_evaluation_episode(plugins, fast, tmp_path):
    register(plugins, pre_filler=PreFiller)
    path, results = run(plugins, fast, tmp_path, "pre_filler")
    assert results["valid"] is False
    assert any("called run.record at evaluation" in v for v in results["violations"])
    assert successes(results) == [0.0, 0.0]
    assert len(evaluated(path)) == 4  # each planned task once, by the harness


def test_a_helper_episode_is_never_the_result_unless_it_is_the_only_one(plugins, fast, tmp_path):
    register(plugins, best_of_three=BestOfThree)
    path, results = run(plugins, fast, tmp_path, "best_of_three")
    assert results["valid"] is False
    assert any("one of 3 helper episodes" in v for v in results["violations"])
    primary = [e for e in evaluated(path) if e["variant"] == "default"]
    assert len(primary) == 4 and all(e["status"] == "error" for e in primary)


class Squatter(Hostile):
    """Plays, as a result, a test task the harness did not plan (outside eval.limit)."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        others = [t for t in run.tasks(task.split) if t.task_id != task.task_id]
        run.play(others[-1], [], seed=run.current_seed(), policy="standard")
        return None


def test_a_result_for_a_task_the_harness_did_not_plan_is_caught(plugins, fast, tmp_path):
    register(plugins, squatter=Squatter)
    _, results = run(plugins, fast, tmp_path, "squatter")
    assert results["valid"] is False
    assert any("was not planned but has a result" in v for v in results["violations"])


# -- 8. what only a process boundary stops: files, other processes, the harness's code ------------


class RunDirReader(Hostile):
    """Reads what the run directory holds (the test salt, the record, the config), from its own
    process and from a child it starts, and signals the harness. Writes what it got into its
    own folder, the one place of the run it may write."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        import os
        import subprocess

        run_path = run.method_state.folder.parent
        got = {}
        for name in ("eval_salt", "episodes.jsonl", "config.yaml", "state.json"):
            try:
                got[name] = len((run_path / name).read_bytes()) > 0
            except OSError:
                got[name] = False
        child = subprocess.run(["cat", str(run_path / "config.yaml")], capture_output=True)
        got["child"] = child.returncode == 0 and bool(child.stdout)
        try:
            os.kill(os.getppid(), 0)  # may it signal the harness?
            got["signal"] = True
        except OSError:
            got["signal"] = False
        (run.method_state.folder / "got.json").write_text(json.dumps(got))
        return None


def test_the_run_directory_and_the_harness_are_out_of_an_isolated_methods_reach(plugins, fast, tmp_path):
    register(plugins, reader=RunDirReader)
    here, _ = run(plugins, fast, tmp_path, "reader", "eval.salt=secret", name="here")
    got_here = json.loads((Path(here) / "method" / "got.json").read_text())
    assert all(got_here.values()), got_here  # in one process nothing stops it
    away, results = run(plugins, fast, tmp_path, "reader", "run.isolation=process", name="away")
    if not results["provenance"]["isolation"]["sandbox"].startswith("landlock"):
        pytest.skip(f"no Landlock here: {results['provenance']['isolation']['sandbox']}")
    got_away = json.loads((Path(away) / "method" / "got.json").read_text())
    assert not any(got_away.values()), got_away


class HarnessPatcher(Hostile):
    """Patches the harness's replay check away, then returns a won episode it never played."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        from arena.core import episodes

        episodes.EpisodeRunner._replay_problem = lambda self, trajectory: None
        return Trajectory(task=task, initial_observation="You won.", steps=[Step("win", "You won.", True)],
                          status=Termination.SUCCESS)


def test_patching_the_harness_from_a_hook_patches_only_the_methods_process(plugins, fast, tmp_path, monkeypatch):
    from arena.core import episodes

    monkeypatch.setattr(episodes.EpisodeRunner, "_replay_problem", episodes.EpisodeRunner._replay_problem)
    register(plugins, patcher=HarnessPatcher)
    _, here = run(plugins, fast, tmp_path, "patcher", name="here")
    assert here["valid"] is True and successes(here) == [1.0, 1.0]  # in one process the patch works
    monkeypatch.undo()
    _, away = run(plugins, fast, tmp_path, "patcher", "run.isolation=process", name="away")
    assert away["valid"] is False and successes(away) == [0.0, 0.0]


class WorldRebuilder(Hostile):
    """Builds its own household world from the public config and task ids, and plays each test
    task by its expert: what an honest-looking policy can do where test draws are public."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        from arena.envs.household.environment import HouseholdEnvironment as Rebuilt

        settings = {k: run.cfg.env[k] for k in ("n_train", "n_valid", "n_test", "seed", "level")}
        copy = {t.task_id: t for t in Rebuilt(**settings).tasks(task.split)}[task.task_id]
        shadow = Rebuilt(**settings).open(copy)
        shadow.reset()

        def follow_expert(observation, trajectory):
            action = shadow.expert_action() or "look"
            shadow.step(action)
            return Action(action)

        return run.play_policy(task, follow_expert, experiences)


# -- every hostile method above, its hooks in a worker process (run.isolation=process) ----------

HOSTILE = {name: klass for name, klass in dict(globals()).items()
           if isinstance(klass, type) and issubclass(klass, Hostile) and klass is not Hostile}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_hostile_method_ends_invalid_or_refused_when_isolated(plugins, fast, tmp_path, name):
    """Isolated, each attack is refused (a name outside the plugin API is a violation, a file
    outside its folder is denied), caught by the same checks as in one process, or plays a world
    that is not the run's: none gets a valid run with a win (the fake backend alone never wins)."""
    register(plugins, **{name.lower(): HOSTILE[name]})
    try:
        path, results = run(plugins, fast, tmp_path, name.lower(), "run.isolation=process")
    except (AttributeError, AssertionError, ProtocolViolation, RemoteError) as refused:  # stopped: refused
        assert "not offered" in str(refused) or "cannot be set" in str(refused) or \
            "only the harness" in str(refused), refused
        return
    won = [e["task_id"] for e in evaluated(path) if e["success"]]
    assert results["valid"] is False or not won, (results["violations"], won)
