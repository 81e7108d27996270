"""Hostile methods: each tries one way to get a winning result credited; each must end invalid or
be refused, while the honest methods stay valid (``docs/security.md`` lists the measures).

All run with the fake backend on a small household world (about a second a run).
"""

from __future__ import annotations

import gc
import io
import json
import multiprocessing
import os
import pickle
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

import arena
from arena.cli import cli
from arena.core import protocol
from arena.core.contract.results import Results
from arena.core.contract.run_api import EpisodeRequest
from arena.core.contract.types import Experience, Provenance, Step, Task, Termination, Trajectory
from arena.core.execution.context import ProtocolViolation
from arena.core.execution.solver import Action
from arena.core.isolation import isolated as isolation
from arena.core.isolation import rpc
from arena.core.isolation.rpc import RemoteError
from arena.core.protocol import evaluation
from arena.core.storage import integrity
from arena.core.storage.method_state import Checkpoints, OutsideFolder
from arena.core.storage.rundir import VIOLATIONS, RunDir, RunDirError
from arena.report import ReportError, build_tables, compare_runs, load_run, load_runs
from arena.report.verification import UNVERIFIED
from arena.report.verify import verify_run
from tests.helpers.methods import Hostile, WorldRebuilder, following  # noqa: F401 (WorldRebuilder: one of HOSTILE)
from tests.helpers.runs import harness_of, register

#: The attacks play household's `hard` level, where the fake backend and a guessed room never win:
#: a win is then the attack's. (On the default `medium`, chance wins a task now and then.)
EVAL = ["eval.limit=2", "env.level=hard"]


def run(plugins, fast, tmp_path, method, *extra, name="r"):
    return protocol.run(method, overrides=fast + EVAL + list(extra), out=tmp_path / name, plugins=plugins)


def evaluated(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    return [e for e in lines if e["phase"] == "evaluate"]


def successes(results: Results) -> list[float]:
    return [results.splits[s].success_rate for s in ("test_seen", "test_unseen")]


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
        trajectory = run.play(EpisodeRequest(task, experiences, seed, policy=arena.STANDARD))
        trajectory.status = Termination.SUCCESS
        return trajectory


@pytest.mark.parametrize("method", ["forger", "editor"])
def test_a_trajectory_the_harness_did_not_play_is_not_credited(plugins, fast, tmp_path, method):
    register(plugins, forger=Forger, editor=Editor)
    path, results = run(plugins, fast, tmp_path, method)
    assert results.valid is False
    assert any("does not reproduce" in v for v in results.violations)
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
        return run.play(EpisodeRequest(task, experiences, policy=following(shadow)))


def test_a_shadow_episode_at_evaluation_is_refused_and_test_payloads_are_hidden(plugins, fast, tmp_path):
    register(plugins, shadow=ShadowExpert)
    ShadowExpert.payloads = []
    _, results = run(plugins, fast, tmp_path, "shadow")
    assert results.valid is False
    assert any("opened an episode" in v for v in results.violations)
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
    assert results.valid is False
    assert any("test split 'test_seen' while learning" in v for v in results.violations)


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
    assert results.valid is False and any("opened an episode of test_seen" in v for v in results.violations)


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
    assert results.state.digest_before_eval == results.state.digest_after_eval  # evaded
    assert results.valid is False
    assert any("not in the frozen store" in v for v in results.violations)


class ProvenanceForger(Hostile):
    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        note = Experience("note", "seen it", Provenance((task.task_id,), task.split))
        return run.play(EpisodeRequest(task, [note], seed, policy=arena.STANDARD))


def test_an_experience_of_test_provenance_is_refused(plugins, fast, tmp_path):
    register(plugins, test_notes=ProvenanceForger)
    _, results = run(plugins, fast, tmp_path, "test_notes")
    assert results.valid is False and any("not in the frozen store" in v for v in results.violations)


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
    assert results.valid is False
    assert any("changed during frozen evaluation" in v or "random check" in v for v in results.violations)


class EpisodeSwapper(Hostile):
    """Changes the weights while an episode plays and puts them back before it ends, so the end
    digest sees nothing: only the random checks inside episodes can."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        self.original = getattr(self, "original", run.llm.inner.weights)
        run.llm.inner.weights = "tuned on the test"
        try:
            return run.play(EpisodeRequest(task, experiences, seed, policy=arena.STANDARD))
        finally:
            run.llm.inner.weights = self.original


def test_weights_changed_within_each_episode_are_caught_by_random_checks(plugins, fast, tmp_path):
    register(plugins, episode_swapper=EpisodeSwapper)
    # every check made (12 per 12 steps): a test that could only pass by luck would test nothing
    monkey = pytest.MonkeyPatch()
    monkey.setattr(evaluation, "SPOT_CHECKS", 10_000)
    try:
        _, results = run(plugins, fast, tmp_path, "episode_swapper")
    finally:
        monkey.undo()
    assert results.state.digest_before_eval == results.state.digest_after_eval
    assert results.valid is False and any("random check" in v for v in results.violations)


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
    assert results.record.key_id == integrity.key_id(integrity.record_key())
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
    assert results.valid is False and results.track == "frozen"
    assert any(f"tried to set {field}" in v for v in results.violations)


class ConfigEditor(Hostile):
    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate":
            config = run.method_state.folder.parent / "config.yaml"  # reached past the method folder
            config.write_text(config.read_text().replace("max_steps: 12", "max_steps: 99"))


class StoreDeleter(Hostile):
    @arena.hookimpl
    def learn(self, run):
        run.store.add([Experience("note", "learned", Provenance(("t",), "train"))])
        return True

    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate":
            shutil.rmtree(run.method_state.folder.parent / "store", ignore_errors=True)  # reached past


@pytest.mark.parametrize("method, message", [("config_editor", "config.yaml was changed"),
                                             ("store_deleter", "store/ folder was deleted")])
def test_config_edits_and_store_deletion_during_evaluation_are_caught(plugins, fast, tmp_path, method, message):
    register(plugins, config_editor=ConfigEditor, store_deleter=StoreDeleter)
    _, results = run(plugins, fast, tmp_path, method)
    assert results.valid is False and any(message in v for v in results.violations)


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
    assert (path / "results.json").is_file() and results.cost.evaluate.episodes == 4
    assert results.valid is False and any(f"{hook} of method '{method}' raised" in v for v in results.violations)


class WrongTypes(Hostile):
    @arena.hookimpl
    def retrieve(self, run, task):
        return "a string, not experiences"


def test_a_hook_returning_the_wrong_type_is_named(plugins, fast, tmp_path):
    register(plugins, wrong_types=WrongTypes)
    path, _ = run(plugins, fast, tmp_path, "wrong_types", "learn.budget.episodes=0")
    errors = {e["error"] for e in evaluated(path)}
    assert errors == {("retrieve failed: HookReturnError: retrieve of method 'wrong_types' returned str; "
                       "expected a list of arena.core.contract.types.Experience (or None).")}
    row, = build_tables(load_runs([path]))[0].rows
    assert any(flag.startswith("every test episode errored") for flag in row.flags)


# -- the honest methods ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["base", "random", "rag", "memrl", "expel"])
def test_honest_methods_stay_valid(plugins, fast, tmp_path, method):
    extra = ["learn.budget.episodes=2", "learn.max_steps=3"] if method != "base" else []
    if method == "expel":
        extra = ["method.train_tasks=2", "learn.max_steps=3"]
    path, results = run(plugins, fast, tmp_path, method, *extra)
    assert results.valid is True, results.violations
    assert load_run(path).chained


# -- the run context's parts: only the harness advances the phase or keeps the record ------------


class PhaseAdvancer(Hostile):
    """Tries the harness's own calls: the phase's advance, and a new evaluation without checks."""

    @arena.hookimpl
    def learn(self, run):
        context = harness_of(run)  # past the plugin API, as in-process code can reach
        for attempt in (lambda: context.phases.advance("evaluate", key=object()),
                        lambda: context.episodes.begin_evaluation(object(), [])):
            with pytest.raises(ProtocolViolation, match="only the harness may"):
                attempt()
        return True

    @arena.hookimpl
    def episode_end(self, run, result, trajectory):
        if run.phase == "evaluate":
            with pytest.raises(ProtocolViolation):
                harness_of(run).episodes.begin_evaluation(object(), [], spot_check=None)


def test_only_the_harness_advances_the_phase(plugins, fast, tmp_path):
    register(plugins, advancer=PhaseAdvancer)
    _, results = run(plugins, fast, tmp_path, "advancer")
    assert results.valid is False
    assert any("tried to set the run's phase to 'evaluate'" in v for v in results.violations)
    assert any("tried to start the evaluation" in v for v in results.violations)


class ViolationEraser(Hostile):
    """Breaks the protocol, then empties the violations list of state.json."""

    @arena.hookimpl
    def learn(self, run):
        with pytest.raises(ProtocolViolation):
            run.tasks("test_seen")
        with pytest.raises(ProtocolViolation, match="not part of the plugin API"):
            run.run_dir  # noqa: B018 - the harness's, not the method's
        state_file = run.method_state.folder.parent / "state.json"  # reached past the method's folder
        state = json.loads(state_file.read_text())
        state["violations"] = []
        state_file.write_text(json.dumps(state))
        return True


def test_erasing_violations_from_state_json_does_not_validate_a_run(plugins, fast, tmp_path):
    register(plugins, eraser=ViolationEraser)
    _, results = run(plugins, fast, tmp_path, "eraser")
    assert results.valid is False
    assert any("asked for test split 'test_seen'" in v for v in results.violations)


def test_a_store_that_cannot_be_read_is_a_violation_not_a_crash(plugins, fast, tmp_path, monkeypatch):
    # chromadb sometimes raises (code 14, unable to open database file) once a plugin has deleted
    # the store's folder under it: the harness must still write its results, flagged.
    from arena.core.services.store import ExperienceStore

    def unreadable(self):
        raise RuntimeError("unable to open database file")

    register(plugins, store_deleter=StoreDeleter)
    monkeypatch.setattr(ExperienceStore, "size", unreadable)
    _, results = run(plugins, fast, tmp_path, "store_deleter")
    assert results.valid is False
    assert any("could not be read for its size" in v for v in results.violations)


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
        tries = [run.play(EpisodeRequest(task, experiences, run.current_seed(), f"try{i}", policy="standard",
                                         sampling={"temperature": 1.0, "top_p": 1.0})) for i in range(3)]
        best = max(tries, key=lambda t: (t.success, -len(t.steps)))
        best.copy_of = f"try{tries.index(best)}"
        return best


def test_only_the_harness_records_an_evaluation_episode(plugins, fast, tmp_path):
    register(plugins, pre_filler=PreFiller)
    path, results = run(plugins, fast, tmp_path, "pre_filler")
    assert results.valid is False
    assert any("called run.record at evaluation" in v for v in results.violations)
    assert successes(results) == [0.0, 0.0]
    assert len(evaluated(path)) == 4  # each planned task once, by the harness


class DeclaredBestOfThree(BestOfThree):
    """The same, with its three tries declared before play as variants of its own."""

    @arena.hookimpl
    def evaluation_variants(self, run):
        return ["try0", "try1", "try2"]


def test_a_helper_episode_is_never_the_result_unless_it_is_the_only_one(plugins, fast, tmp_path):
    register(plugins, best_of_three=BestOfThree, declared_best_of_three=DeclaredBestOfThree)
    path, results = run(plugins, fast, tmp_path, "best_of_three")
    assert results.valid is False
    assert any("which it did not declare" in v for v in results.violations)  # undeclared: refused
    primary = [e for e in evaluated(path) if e["variant"] == "default"]
    assert len(primary) == 4 and all(e["status"] == "error" for e in primary)
    path, results = run(plugins, fast, tmp_path, "declared_best_of_three", name="declared")
    assert results.valid is False
    assert any("one of 3 helper episodes" in v for v in results.violations)
    primary = [e for e in evaluated(path) if e["variant"] == "default"]
    assert len(primary) == 4 and all(e["status"] == "error" for e in primary)
    helpers = [e for e in evaluated(path) if e["variant"] != "default"]
    assert len(helpers) == 12  # every extra episode on record, and counted
    assert results.cost.evaluate.episodes == 16


class Squatter(Hostile):
    """Plays, as a result, a test task the harness did not plan (outside eval.limit)."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        others = [t for t in run.tasks(task.split) if t.task_id != task.task_id]
        run.play(EpisodeRequest(others[-1], [], run.current_seed(), policy="standard"))
        return None


def test_a_result_for_a_task_the_harness_did_not_plan_is_caught(plugins, fast, tmp_path):
    register(plugins, squatter=Squatter)
    path, results = run(plugins, fast, tmp_path, "squatter")
    assert results.valid is False
    assert any("which the evaluation plan does not hold" in v for v in results.violations)
    assert len(evaluated(path)) == 4  # refused before it was played: only the plan's episodes


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


def test_a_link_to_the_runs_folder_beside_the_import_path_grants_nothing_of_it(tmp_path):
    """Landlock grants what a link points to: a link among the readable entries that leads to the
    run directory or a folder above it (pytest's ``pytest-current``, a ``latest`` link beside the
    runs) would open the whole run to the method. Found with PYTHONPATH=/tmp, under which the test
    below read the salt and the record through ``/tmp/pytest-of-*/pytest-current``."""
    project = tmp_path / "project"
    run_dir = project / "runs" / "r1"
    (run_dir / "method").mkdir(parents=True)
    (project / "code.py").write_text("")
    (project / "latest").symlink_to(project / "runs")  # a link to the folder holding the run
    (project / "runs" / "mine").symlink_to(run_dir)  # a link to the run itself
    (project / "elsewhere").symlink_to(tmp_path)  # a link above the project
    readable = set(isolation.readable_roots(run_dir, [str(project)]))  # the project on the import path
    assert str(project / "code.py") in readable  # the project's other entries stay readable
    leaking = [path for path in readable
               if Path(path).resolve() == run_dir.resolve() or Path(path).resolve() in run_dir.resolve().parents]
    assert not leaking, leaking


def test_the_run_directory_and_the_harness_are_out_of_an_isolated_methods_reach(plugins, fast, tmp_path):
    register(plugins, reader=RunDirReader)
    here, _ = run(plugins, fast, tmp_path, "reader", "eval.salt=secret", name="here")
    got_here = json.loads((Path(here) / "method" / "got.json").read_text())
    assert all(got_here.values()), got_here  # in one process nothing stops it
    away, results = run(plugins, fast, tmp_path, "reader", "run.isolation=process", name="away")
    if not results.provenance.isolation["sandbox"].startswith("landlock"):
        pytest.skip(f"no Landlock here: {results.provenance.isolation['sandbox']}")
    got_away = json.loads((Path(away) / "method" / "got.json").read_text())
    assert not any(got_away.values()), got_away


class HarnessPatcher(Hostile):
    """Patches the harness's replay check away, then returns a won episode it never played."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        from arena.core.execution import episodes

        episodes.EpisodeRunner._replay_problem = lambda self, trajectory, task: None
        return Trajectory(task=task, initial_observation="You won.", steps=[Step("win", "You won.", True)],
                          status=Termination.SUCCESS)


def test_patching_the_harness_from_a_hook_patches_only_the_methods_process(plugins, fast, tmp_path, monkeypatch):
    from arena.core.execution import episodes

    monkeypatch.setattr(episodes.EpisodeRunner, "_replay_problem", episodes.EpisodeRunner._replay_problem)
    register(plugins, patcher=HarnessPatcher)
    _, here = run(plugins, fast, tmp_path, "patcher", name="here")
    assert here.valid is True and successes(here) == [1.0, 1.0]  # in one process the patch works
    monkeypatch.undo()
    _, away = run(plugins, fast, tmp_path, "patcher", "run.isolation=process", name="away")
    assert away.valid is False and successes(away) == [0.0, 0.0]


# -- every hostile method above (and WorldRebuilder, imported: the salt tests play it too), its
# hooks in a worker process (run.isolation=process) ----------------------------------------------

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
    assert results.valid is False or not won, (results.violations, won)


# -- 9. what the method returns is never the result: the harness's plan and its own task -------


class PayloadPeeker(Hostile):
    """Cause 1: its policy reads the task in the trajectory it is handed; with the test task's
    payload (layout seed, objects, target) it opens its own copy of the game and follows its
    expert. Writes what it saw into its own folder (readable in either mode)."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        from arena.envs.household.environment import HouseholdEnvironment

        seen = run.method_state.folder / "payloads.jsonl"
        shadow = {}

        def peek(observation, trajectory):
            with seen.open("a") as out:
                out.write(json.dumps(dict(trajectory.task.payload)) + "\n")
            if "game" not in shadow:
                shadow["game"] = HouseholdEnvironment().open(trajectory.task)  # fails without the payload
                shadow["game"].reset()
            action = shadow["game"].expert_action() or "look"
            shadow["game"].step(action)
            return Action(action)

        return run.play(EpisodeRequest(task, experiences, policy=peek))


@pytest.mark.parametrize("mode", ["in_process", "process"])
def test_a_policy_never_sees_a_test_tasks_payload(plugins, fast, tmp_path, mode):
    register(plugins, peeker=PayloadPeeker)
    path, results = run(plugins, fast, tmp_path, "peeker", f"run.isolation={mode}")
    seen = [json.loads(line) for line in (Path(path) / "method" / "payloads.jsonl").read_text().splitlines()]
    assert seen and all(payload == {} for payload in seen)
    assert successes(results) == [0.0, 0.0]
    assert not [e for e in evaluated(path) if e["success"]]


class TrainGameSubstitute(Hostile):
    """Cause 2: wins a train game with the expert while learning, then returns that episode for
    every test task under the test task's id, its task relabelled ``train`` (so the replay plays
    the train game it names, and the record files the result outside the test splits)."""

    won: ClassVar[dict] = {}

    @arena.hookimpl
    def learn(self, run):
        task = run.tasks("train")[0]
        shadow = run.env.open(task)  # a learning task's episode: open while learning, in either mode
        shadow.reset()
        TrainGameSubstitute.won["episode"] = run.play(EpisodeRequest(task, [], run.learn_seed, policy=following(shadow),
                                                                     record=False))
        return True

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        import dataclasses

        won = TrainGameSubstitute.won["episode"]
        assert won.success
        claimed = dataclasses.replace(won.task, task_id=task.task_id, split="train", task_type="made_up")
        return dataclasses.replace(won, task=claimed)


class Relabeler(Hostile):
    """Cause 2: plays honestly and files each lost test_seen result under test_unseen's other
    type, or outside the test splits, by relabelling the task it returns."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        import dataclasses

        trajectory = run.play(EpisodeRequest(task, experiences, seed, policy=arena.STANDARD))
        trajectory.task = dataclasses.replace(trajectory.task, split="train", task_type="made_up")
        return trajectory


@pytest.mark.parametrize("mode", ["in_process", "process"])
@pytest.mark.parametrize("method", ["substitute", "relabeler"])
def test_a_results_task_split_and_type_come_from_the_plan(plugins, fast, tmp_path, mode, method):
    register(plugins, substitute=TrainGameSubstitute, relabeler=Relabeler)
    # One learning episode: the substitute's won train game (every learning episode is budgeted).
    path, results = run(plugins, fast, tmp_path, method, f"run.isolation={mode}", "learn.budget.episodes=1")
    records = evaluated(path)
    plan = {(t["task_id"], t["split"], t["task_type"]) for t in (json.loads(line) for line in (
        Path(path) / "trajectories.jsonl").read_text().splitlines()) for t in [t["task"]]}
    assert len(records) == 4 and {r["split"] for r in records} == {"test_seen", "test_unseen"}
    assert all(r["task_type"] != "made_up" for r in records)
    assert all((r["task_id"], r["split"], r["task_type"]) in plan for r in records)
    assert [results.splits[s].n_episodes for s in ("test_seen", "test_unseen")] == [2, 2]
    assert successes(results) == [0.0, 0.0]
    if method == "substitute":
        assert results.valid is False
        assert any("does not reproduce" in v for v in results.violations)


class BestOfThreeInOneCall(Hostile):
    """Cause 4: inside one solve, samples the test task three times and returns the best."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        tries = []
        for _ in range(3):
            try:
                tries.append(run.play(EpisodeRequest(task, experiences, policy=arena.STANDARD,
                                                     sampling={"temperature": 1.0, "top_p": 1.0})))
            except ProtocolViolation:
                pass
        return max(tries, key=lambda t: (t.success, -len(t.steps)))


class OneNameThreeTries(Hostile):
    """Cause 4: declares one helper variant, then plays it three times (unrecorded), so a copy
    of the "only helper" could be the best of three."""

    @arena.hookimpl
    def evaluation_variants(self, run):
        return ["try"]

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        tries = []
        for _ in range(3):
            try:
                tries.append(run.play(EpisodeRequest(task, [], run.current_seed(), "try", policy="standard",
                                                     sampling={"temperature": 1.0, "top_p": 1.0}, record=False)))
            except ProtocolViolation:
                pass
        best = max(tries, key=lambda t: (t.success, -len(t.steps)))
        return dataclasses_replace(best, copy_of="try")


def dataclasses_replace(trajectory, **changes):
    import dataclasses

    return dataclasses.replace(trajectory, **changes)


@pytest.mark.parametrize("mode", ["in_process", "process"])
@pytest.mark.parametrize("method, message", [("best_in_one_call", "inside one play at evaluation"),
                                             ("one_name_three_tries", "record=False at evaluation")])
def test_no_result_is_the_best_of_several_episodes(plugins, fast, tmp_path, mode, method, message):
    register(plugins, best_in_one_call=BestOfThreeInOneCall, one_name_three_tries=OneNameThreeTries)
    path, results = run(plugins, fast, tmp_path, method, f"run.isolation={mode}")
    assert results.valid is False
    assert any(message in v for v in results.violations), results.violations
    primary = [e for e in evaluated(path) if e["variant"] == "default"]
    assert len(primary) == 4 and not any(e["success"] for e in primary)
    # every episode it played at evaluation is on record: one result per task, no other test episode
    assert len(evaluated(path)) == 4


class RecorderPastTheApi(Hostile):
    """Cause 8: records a won episode for each test task through the run object's own
    ``episodes`` (a public attribute of the harness's context, no part of the plugin API), which
    records without verifying, then lets the harness play."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        forged = Trajectory(task=task, initial_observation="You won.", steps=[Step("win", "You won.", True)],
                            status=Termination.SUCCESS)
        run.episodes.record(forged, seed=run.current_seed())
        return None


@pytest.mark.parametrize("mode", ["in_process", "process"])
def test_the_run_object_offers_only_the_plugin_api(plugins, fast, tmp_path, mode):
    register(plugins, past_the_api=RecorderPastTheApi)
    path, results = run(plugins, fast, tmp_path, "past_the_api", f"run.isolation={mode}")
    assert results.valid is False
    assert any(".episodes" in v and "not part of the plugin API" in v
               for v in results.violations), results.violations
    assert successes(results) == [0.0, 0.0]
    assert len(evaluated(path)) == 4


# -- 10. nothing secret crosses to an isolated method, nothing live comes back (causes 3, 5, 6) -----
# Hostile methods against ``run.isolation=process`` itself: nothing secret crosses to the method's
# worker, and nothing live crosses back (issue 54, root causes 3, 5 and 6).
#
# 3. What the worker sends is plain data at every depth: a reference to one of its objects (a proxy
#    in the harness, which answers each read as the worker likes) is accepted only as a policy or a
#    callback; nested in data, the call is refused and a violation recorded.
# 5. The worker starts with an allow-listed environment (no credential, no ``eval.salt=env:NAME``),
#    in PID and mount namespaces of its own where the kernel allows, and its sandbox grants ``/proc``
#    of its own process only: the harness's environment and command line are out of its reach.
# 6. Every path a method hands to a harness call (a store snapshot, a checkpoint prefix) stays in the
#    method's own folder, isolated or not.
#
# Each hostile method writes what it got into its own folder (the one place of the run it may
# write), so the test reads what the attack achieved, not only the run's verdict.


ISOLATED = "run.isolation=process"


def got(path: Path | str) -> dict:
    return json.loads((Path(path) / "method" / "got.json").read_text())


# -- 3. a live reference nested in data ---------------------------------------------------------


class Shifty:
    """A worker object that answers each read differently: a train task's provenance while it is
    checked, then the test task's. Callable, so the worker's channel hands it over by reference."""

    def __init__(self, task_id: str):
        self.task_id, self.reads = task_id, 0

    def __call__(self):
        return None

    @property
    def split(self):
        self.reads += 1
        return "train" if self.reads == 1 else "test_seen"

    @property
    def source_task_ids(self):
        return ("train-0",) if self.reads <= 1 else (self.task_id,)


class LiveReference(Hostile):
    """Cause 3: widens what its worker's channel offers of a :class:`Shifty` (the worker is its
    own process: a plugin can change anything in it) and hands the harness experiences, and a
    trajectory, whose fields are that live object."""

    @arena.hookimpl
    def retrieve(self, run, task):
        channel = next(o for o in gc.get_objects() if isinstance(o, rpc.Channel))
        offered = channel._export
        channel._export = lambda obj: (frozenset({"__call__", "split", "source_task_ids"})
                                       if isinstance(obj, Shifty) else offered(obj))
        shifty = Shifty(task.task_id)
        note = Experience("note", f"answer for {task.goal}", Provenance(("train-0",), "train"))
        object.__setattr__(note, "provenance", shifty)
        return [note]

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        played = run.play(EpisodeRequest(task, experiences, seed, policy=arena.STANDARD))
        played.steps.append(Step("win", "You won.", True, thought=Shifty(task.task_id)))
        return played


def test_a_live_reference_nested_in_data_is_refused(plugins, fast, tmp_path):
    register(plugins, live=LiveReference)
    path, results = run(plugins, fast, tmp_path, "live", ISOLATED)
    assert results.valid is False
    refusals = [v for v in results.violations if "reference to an object of its own process" in v]
    assert refusals and "plain data at every depth" in refusals[0], results.violations
    assert any(".provenance" in v for v in refusals), refusals
    assert successes(results) == [0.0, 0.0]
    assert all(e["status"] == "error" and "Refused" in e["error"] for e in evaluated(path))


class Policies(Hostile):
    """Honest: passes its policies on EpisodeRequests (one, a list, and in its solve) and run.play's
    callback: the references the harness accepts."""

    @staticmethod
    def first(observation, trajectory):
        return Action(observation.admissible_actions[0])

    @arena.hookimpl
    def learn(self, run):
        tasks = run.tasks(run.learn_split)[:2]
        done = []
        played = run.play([EpisodeRequest(tasks[0], [], 0, policy=self.first)], on_done=lambda: done.append(1))
        played.append(run.play(EpisodeRequest(tasks[1], [], 0, policy=self.first)))
        (run.method_state.folder / "got.json").write_text(json.dumps(
            {"done": len(done), "statuses": [t.status.value for t in played], "errors": [t.error for t in played]}))
        return True

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        return run.play(EpisodeRequest(task, experiences, policy=self.first))


def test_policies_and_callbacks_still_cross(plugins, fast, tmp_path):
    register(plugins, policies=Policies)
    path, results = run(plugins, fast, tmp_path, "policies", ISOLATED, "eval.limit=1", "learn.budget.episodes=2")
    learned = got(path)
    assert learned["done"] == 1 and learned["errors"] == [None, None], learned
    assert "error" not in learned["statuses"]
    played = evaluated(path)
    assert played and not [e for e in played if e["status"] == "error"], played
    assert results.valid is True, results.violations


# -- the channel itself: what the harness's side accepts -----------------------------------------


class Harness:
    """Stands for the harness's run: one method that takes a policy, one that takes data."""

    def __init__(self):
        self.seen = []

    def play(self, task, policy=None, requests=()):
        self.seen.append((task, policy, list(requests)))
        return [policy("o")] if callable(policy) else [r.policy("o") for r in requests]

    def keep(self, data):
        self.seen.append(data)
        return "kept"


@pytest.fixture
def channels():
    """The harness's and a worker's ends of one pipe, as isolation builds them."""
    harness_end, worker_end = multiprocessing.Pipe()
    refused = []
    harness = Channel(harness_end, "h", lambda obj: None, trusted_modules=isolation.WORKER_DATA_MODULES,
                      on_refused=lambda kind, name, why="": refused.append((kind, name, why)),
                      callable_parameters={f"{__name__}.Harness.play": frozenset({"policy"})},
                      callable_fields=isolation.CALLABLE_FIELDS)
    served = Harness()
    harness.offer_root(served, frozenset({"play", "keep"}))
    worker = Channel(worker_end, "w", isolation.worker_export)
    harness.start(), worker.start()
    yield rpc.Proxy(worker, rpc.ROOT, "Harness"), served, refused, harness, worker
    harness.close(), worker.close()


Channel = rpc.Channel


def test_the_harness_accepts_a_reference_only_where_a_callable_is_expected(channels):
    root, served, refused, _, _ = channels
    task = Task("t", "household", "train", "pick", "goal")

    def policy(observation):
        return f"acted on {observation}"

    assert root.play(task, policy) == ["acted on o"]  # positional, by name: the parameter "policy"
    assert root.play(task, policy=policy) == ["acted on o"]
    request = EpisodeRequest(task, [], 0, policy=policy)
    assert root.play(task, requests=[request]) == ["acted on o"]  # an EpisodeRequest's policy
    assert not refused
    nested = Experience("note", "x", Provenance(("t",), "train"))
    object.__setattr__(nested, "provenance", policy)
    for data, where in ([nested], "[0].provenance"), ({"a": [policy]}, "['a'][0]"), (policy, "argument 1 "):
        with pytest.raises(rpc.RemoteError, match="plain data at every depth"):
            root.keep(data)
        assert where in refused[-1][2], refused[-1]
    with pytest.raises(rpc.RemoteError, match="reference"):  # a reference where a task is expected
        root.play(policy, policy)
    assert all(not callable(s) for s in served.seen if not isinstance(s, tuple))  # none got through


def test_a_reference_memoized_into_data_as_well_is_refused(channels):
    """A hand-made payload may name one reference twice (pickle's memo): once as the policy,
    once inside data. Both places are checked."""
    _, _, refused, harness, _ = channels

    class Twice(pickle._Pickler):
        def __init__(self, buffer, policy):
            super().__init__(buffer, protocol=4)
            self.policy = policy

        def save(self, obj, save_persistent_id=True):
            if obj is self.policy:
                if id(obj) in self.memo:
                    self.write(self.get(self.memo[id(obj)][0]))
                else:
                    self.save_pers(("mine", 7, "function"))
                    self.memoize(obj)
                return
            super().save(obj, save_persistent_id)

    def policy(observation):
        return observation

    buffer = io.BytesIO()
    Twice(buffer, policy).dump((rpc.ROOT, "call", "play", (Task("t", "e", "train", "k", "g"), policy),
                                {"requests": [{"hidden": policy}]}))
    args = harness._payload(buffer.getvalue())
    with pytest.raises(rpc.RemoteError, match="plain data"):
        harness._accept_call(*args)
    assert "argument requests[0]['hidden']" in refused[-1][2]


def test_an_answer_holds_no_reference(channels):
    _, _, refused, harness, worker = channels

    class Method:
        def answer(self):
            return Trajectory(task=Task("t", "e", "train", "k", "g"), initial_observation="",
                              steps=[Step("a", "o", True, thought=lambda: "live")])

    worker.offer_root(Method(), frozenset({"answer"}))
    with pytest.raises(rpc.RemoteError, match="the answer.steps\\[0\\].thought"):
        harness.request(rpc.ROOT, "call", "answer")
    assert refused


def test_a_payload_cannot_change_a_class_or_an_enum_member_of_the_harness():
    """pickle's BUILD sets attributes on whatever is on its stack: with the C unpickler, a class
    the payload was allowed to name (``Trajectory.success = True`` for every trajectory)."""
    modules = ["arena.core.contract.types"]
    on_class = b"carena.core.contract.types\nTrajectory\nN}X\x07\x00\x00\x00success\x88s\x86b."
    on_member = (b"carena.core.contract.types\nTermination\nX\x07\x00\x00\x00success\x85R"
                 b"}X\x07\x00\x00\x00_value_X\x07\x00\x00\x00failuresb.")
    on_function = b"ccopyreg\n_reconstructor\nN}X\x0c\x00\x00\x00__defaults__Ns\x86b."
    for data in (on_class, on_member, on_function):
        with pytest.raises(pickle.UnpicklingError, match="may not change"):
            rpc.SafeUnpickler(io.BytesIO(data), modules, lambda pid: pid).load()
    assert isinstance(Trajectory.__dict__["success"], property) and Termination.SUCCESS.value == "success"
    fine = pickle.dumps(Trajectory(task=Task("t", "e", "train", "k", "g"), initial_observation="o",
                                   status=Termination.SUCCESS))
    assert rpc.SafeUnpickler(io.BytesIO(fine), modules, lambda pid: pid).load().success is True


# -- 5. the harness's environment and /proc ------------------------------------------------------


class SecretSeeker(Hostile):
    """Cause 5: looks for the board's salt (``eval.salt=env:NAME``) where a child of the harness
    finds it: its own environment, then the environment and command line of its parent and of
    every process it can see. With it, rebuilds the test world and follows the world's expert."""

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        name = str(run.cfg.eval.salt).split(":", 1)[1]
        found = {"environment": sorted(os.environ), "own": os.environ.get(name), "read": [], "parent": os.getppid()}
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
        except OSError:
            pids = []
        salt = found["own"]
        for pid in dict.fromkeys([os.getppid(), *pids]):
            for what in ("environ", "cmdline"):
                try:
                    data = Path(f"/proc/{pid}/{what}").read_bytes()
                except OSError:
                    continue
                found["read"].append(f"{pid}/{what}")
                for entry in data.split(b"\0"):
                    if entry.startswith(f"{name}=".encode()):
                        salt = salt or entry.split(b"=", 1)[1].decode()
        found["salt"] = salt
        (run.method_state.folder / "got.json").write_text(json.dumps(found))
        if salt is None:
            return None
        from arena.envs.household.environment import HouseholdEnvironment as Rebuilt

        settings = {k: run.cfg.env[k] for k in ("n_train", "n_valid", "n_test", "seed", "level")}
        world = Rebuilt(**settings)
        world.draw_tests_with(salt)
        shadow = world.open({t.task_id: t for t in world.tasks(task.split)}[task.task_id])
        shadow.reset()
        return run.play(EpisodeRequest(task, experiences, policy=following(shadow)))


@pytest.mark.slow
def test_a_boards_salt_and_the_harness_environment_are_out_of_an_isolated_methods_reach(
        plugins, fast, tmp_path, monkeypatch):
    monkeypatch.setenv("BOARD_SALT", "the board's own draw")
    monkeypatch.setenv("ARENA_TEST_CREDENTIAL", "sk-not-for-methods")
    register(plugins, seeker=SecretSeeker)
    here, in_process = run(plugins, fast, tmp_path, "seeker", "eval.salt=env:BOARD_SALT", name="here")
    assert got(here)["salt"] == "the board's own draw"  # in one process nothing stops it...
    assert min(successes(in_process)) >= 0.5, successes(in_process)  # ...and it wins
    away, isolated = run(plugins, fast, tmp_path, "seeker", "eval.salt=env:BOARD_SALT", ISOLATED, name="away")
    seen = got(away)
    assert seen["salt"] is None and seen["own"] is None, seen
    assert successes(isolated) == [0.0, 0.0]
    assert "BOARD_SALT" not in seen["environment"] and "ARENA_TEST_CREDENTIAL" not in seen["environment"]
    allowed = isolation.WORKER_ENVIRONMENT | {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TMPDIR", "XDG_CACHE_HOME",
                                             "MPLCONFIGDIR",
                                             "ARENA_RECORD_KEY_FILE", "ANONYMIZED_TELEMETRY"}  # tests/conftest.py's,
    # set again in the worker when it imports this module
    assert {v for v in seen["environment"] if not v.startswith("LC_")} <= allowed, seen["environment"]
    sandbox = isolated.provenance.isolation["sandbox"]
    assert "environment allow-listed" in sandbox
    if sandbox.startswith("none") and "no namespaces" in sandbox:
        pytest.skip(f"neither Landlock nor namespaces here: {sandbox}")
    assert seen["read"] == [], (seen["read"], sandbox)  # no other process's environ or cmdline
    if "own " in sandbox:
        assert seen["parent"] == 1  # its namespace's init: the harness is outside the namespace


@pytest.mark.slow
def test_without_namespaces_the_sandbox_still_hides_the_harnesss_proc(plugins, fast, tmp_path, monkeypatch):
    """Where ``unshare`` cannot make namespaces, the worker is a plain child of the harness: its
    Landlock ruleset grants ``/proc`` of the worker (resolved there), not the harness's."""
    monkeypatch.setenv("BOARD_SALT", "the board's own draw")
    monkeypatch.setattr(isolation, "namespace_command", lambda: ((), "no namespaces (switched off by the test)"))
    register(plugins, seeker=SecretSeeker)
    away, isolated = run(plugins, fast, tmp_path, "seeker", "eval.salt=env:BOARD_SALT", ISOLATED)
    sandbox = isolated.provenance.isolation["sandbox"]
    assert "no namespaces (switched off by the test)" in sandbox
    if not sandbox.startswith("landlock"):
        pytest.skip(f"no Landlock here: {sandbox}")
    seen = got(away)
    assert seen["parent"] == os.getpid()  # the harness, in sight...
    assert seen["salt"] is None and seen["read"] == [], seen  # ...and out of reach
    assert successes(isolated) == [0.0, 0.0]


def test_namespaces_degrade_to_a_reason(monkeypatch):
    isolation.namespace_command.cache_clear()
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    try:
        assert isolation.namespace_command() == ((), "no namespaces (util-linux unshare not found)")
    finally:
        isolation.namespace_command.cache_clear()
    assert isolation.describe_namespaces("no namespaces (why)") == "no namespaces (why)"
    assert isolation.describe_namespaces("own pid+mount namespaces (unshare)").startswith("no namespaces (asked")


def test_the_workers_environment_is_allow_listed(monkeypatch):
    monkeypatch.setenv("BOARD_SALT", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    env = isolation.worker_environment("/w", withheld=frozenset({"BOARD_SALT", "OMP_NUM_THREADS"}))
    assert "BOARD_SALT" not in env and "AWS_SECRET_ACCESS_KEY" not in env and "OMP_NUM_THREADS" not in env
    assert env["LC_ALL"] == "C.UTF-8" and env["TMPDIR"] == "/w" and env["HF_HUB_OFFLINE"] == "1"
    from arena.core.config.compose import compose
    from arena.core.config.plugins import get_plugins

    cfg = compose(get_plugins(), "base", overrides=["eval.salt=env:BOARD_SALT", "run.isolation=process"])
    assert isolation.withheld_variables(cfg) == {"BOARD_SALT"}
    assert isolation.withheld_variables(None) == frozenset()
    assert "/proc/self" not in isolation.SYSTEM_READ  # resolved in the harness, it is the harness's


# -- 6. paths a method hands to the harness ------------------------------------------------------


class PathEscaper(Hostile):
    """Cause 6: while learning, asks the harness to write its store snapshot over the run's
    secret salt (by ``..``, by an absolute path, through a link it made in its folder) and to
    prune checkpoints of a prefix that climbs out of the run (``../../victim``)."""

    @arena.hookimpl
    def learn(self, run):
        folder = run.method_state.folder
        (folder / "out").symlink_to(folder.parent)
        outcome = {}
        attempts = {
            "dots": lambda: run.store.snapshot(folder / ".." / "eval_salt"),
            "absolute": lambda: run.store.snapshot(str(folder.parent / "eval_salt")),
            "link": lambda: run.store.snapshot(folder / "out" / "eval_salt"),
            "prefix": lambda: run.method_state.checkpoints("../../victim").prune(10),
        }
        for name, attempt in attempts.items():
            try:
                attempt()
                outcome[name] = "done"
            except Exception as exc:  # what the harness answered is the point
                outcome[name] = f"{type(exc).__name__}: {exc}"
        outcome["inside"] = str(run.store.snapshot(folder / "memory.jsonl"))
        (folder / "got.json").write_text(json.dumps(outcome))
        return True


@pytest.mark.parametrize("isolated", [False, True])
def test_paths_a_method_hands_the_harness_stay_in_its_folder(plugins, fast, tmp_path, isolated):
    victim = tmp_path / "victim-00003"
    victim.mkdir()
    (victim / "keep").write_text("not the method's")
    register(plugins, escaper=PathEscaper)
    extra = [ISOLATED] if isolated else ["eval.salt=secret"]
    path, results = run(plugins, fast, tmp_path, "escaper", *extra)
    salt = (Path(path) / "eval_salt").read_text()
    assert len(salt.strip()) == 32 and "arena-store-snapshot" not in salt  # still the drawn salt
    assert (victim / "keep").read_text() == "not the method's"
    outcome = got(path)
    for name in ("dots", "absolute", "link", "prefix"):
        assert "OutsideFolder" in outcome[name] or "not a plain name" in outcome[name], (name, outcome[name])
    assert "run.method_state.folder" in outcome["dots"] and "run.method_state.checkpoints" in outcome["prefix"]
    assert Path(outcome["inside"]).exists()  # its own folder: allowed
    assert successes(results) == [0.0, 0.0]
    if isolated:  # refused on record: a violation
        assert results.valid is False
        assert sum("outside the method's folder" in v or "not a plain name" in v for v in results.violations) >= 2


def test_checkpoints_stay_in_the_methods_folder(tmp_path):
    folder = tmp_path / "method"
    folder.mkdir()
    for prefix in ("../x", "../../victim", "/abs", "a/b", "..", ".hidden", ""):
        with pytest.raises(OutsideFolder, match="plain name"):
            Checkpoints(folder, prefix)
    checkpoints = Checkpoints(folder, "adapter")
    (folder / "adapter-00002").symlink_to(tmp_path)
    with pytest.raises(OutsideFolder):
        checkpoints.path(2)
    with pytest.raises(ValueError, match="whole number"):
        checkpoints.path(-1)
    for number in (0, 1, 5):
        (folder / f"adapter-{number:05d}").mkdir()
    checkpoints.prune(10**12)  # bounded by what exists, not by the number it is given
    assert sorted(p.name for p in folder.iterdir()) == ["adapter-00002"]  # the link is not followed
    assert tmp_path.exists() and (folder / "adapter-00002").is_symlink()


# -- 11. violations are lines of the signed record: never erased (cause 7) --------------------------
# Hostile cases against the run's record of violations (``docs/security.md``): a violation is a
# line of the signed, chained record (``violations.jsonl``), so emptying state.json's list, before a
# ``--resume`` or after the run, never makes a run valid again.
#
# ``tests/test_adversarial.py``'s ``test_erasing_violations_from_state_json_does_not_validate_a_run``
# passes because results.json is written from the harness's memory in the same process; these make
# the harness read its violations back, from disk, after the list was emptied.


#: Left in the method's own folder by its first session (a worker sees no test variable).
STOPPED = "stopped-once"
ASKED = "asked for test split 'test_seen'"
DISAGREE = "disagree with the run's signed record of violations"
MODES = ["in_process", "process"]


class EraseThenStop(Hostile):
    """While learning, asks for a test split (a violation), empties state.json's violations and
    stops the session, so that the run is resumed from what is on disk. Resumed (its mark in its
    own folder), it learns honestly. Isolated, it cannot reach state.json (Landlock keeps the worker in its folder):
    whoever holds the run directory empties the list instead."""

    @arena.hookimpl
    def learn(self, run):
        mark = run.method_state.folder / STOPPED
        if mark.exists():
            return True
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text("1")
        try:
            run.tasks("test_seen")
        except Exception:
            pass
        try:  # in one process: reached past the method's folder
            state_file = run.method_state.folder.parent / "state.json"
            state = json.loads(state_file.read_text())
            state["violations"] = []
            state_file.write_text(json.dumps(state))
        except Exception:
            pass
        raise RuntimeError("stopped by the method after erasing its violations")


class Violator(Hostile):
    """Asks for a test split while learning, then finishes the run."""

    @arena.hookimpl
    def learn(self, run):
        try:
            run.tasks("test_seen")
        except Exception:
            pass
        return True


def _overrides(fast: list[str], isolation: str) -> list[str]:
    return fast + EVAL + [f"run.isolation={isolation}"]


def _state(path: Path) -> dict:
    return json.loads((path / "state.json").read_text())


def _erase_state_violations(path: Path) -> None:
    state = _state(path)
    state["violations"] = []
    (path / "state.json").write_text(json.dumps(state))


def _on_record(path: Path) -> list[str]:
    lines = (path / VIOLATIONS).read_text().splitlines()
    return [json.loads(line)[integrity.VIOLATION] for line in lines]


@pytest.mark.parametrize("isolation", MODES)
def test_violations_erased_from_state_json_before_resume_stay_on_record(plugins, fast, tmp_path,
                                                                       isolation):
    register(plugins, eraser=EraseThenStop)
    out = tmp_path / "r"
    with pytest.raises(Exception, match="stopped by the method"):
        protocol.run("eraser", overrides=_overrides(fast, isolation), out=out, plugins=plugins)
    assert not (out / "results.json").exists()
    assert any(ASKED in v for v in _on_record(out))  # signed into the chain when it happened
    if isolation == "in_process":
        assert _state(out)["violations"] == []  # the method erased state.json's list itself
    else:
        assert any(ASKED in v for v in _state(out)["violations"])  # out of the worker's reach
        _erase_state_violations(out)  # anyone who holds the run directory can
    _, results = protocol.run(None, resume=out, plugins=plugins)
    # Before violations were on record, the resumed run started from the emptied list: valid.
    assert results.valid is False
    assert any(ASKED in v for v in results.violations), results.violations
    assert any(DISAGREE in v for v in results.violations), results.violations
    assert results.violations == _on_record(out) == _state(out)["violations"]
    assert load_run(out).results.valid is False


@pytest.mark.parametrize("isolation", MODES)
def test_a_finished_runs_violations_cannot_be_erased_by_resuming_it_again(plugins, fast, tmp_path,
                                                                        isolation):
    register(plugins, violator=Violator)
    out = tmp_path / "r"
    protocol.run("violator", overrides=_overrides(fast, isolation), out=out, plugins=plugins)
    (out / "results.json").unlink()  # made resumable again ...
    _erase_state_violations(out)  # ... with its violations gone from state.json
    _, results = protocol.run(None, resume=out, plugins=plugins)
    assert results.valid is False
    assert any(ASKED in v for v in results.violations)
    assert any(DISAGREE in v for v in results.violations)


def test_dropping_the_violations_file_breaks_the_record(plugins, fast, tmp_path):
    register(plugins, violator=Violator)
    out = tmp_path / "r"
    protocol.run("violator", overrides=_overrides(fast, "in_process"), out=out, plugins=plugins)
    (out / VIOLATIONS).unlink()
    with pytest.raises(ReportError, match="does not follow the line before it"):
        load_run(out)  # the first episode after the violation links to it
    (out / "results.json").unlink()
    _erase_state_violations(out)
    with pytest.raises(RunDirError, match="does not follow the line before it"):
        protocol.run(None, resume=out, plugins=plugins)


def test_reports_and_verify_treat_record_and_state_disagreement_as_invalid(plugins, fast, tmp_path):
    register(plugins, violator=Violator)
    out = tmp_path / "r"
    protocol.run("violator", overrides=_overrides(fast, "in_process"), out=out, plugins=plugins)
    assert load_run(out).results.valid is False  # as written: record, state and results agree
    assert not any(DISAGREE in v for v in load_run(out).results.violations)

    _erase_state_violations(out)  # state.json emptied after the run
    run = load_run(out)
    assert run.results.valid is False
    assert any("state.json" in v and DISAGREE in v for v in run.results.violations)
    assert build_tables([run])[0].rows[0].valid is False

    results = json.loads((out / "results.json").read_text())
    results.update(valid=True, violations=[])  # and results.json said valid
    (out / "results.json").write_text(json.dumps(results))
    run = load_run(out)
    assert run.results.valid is False
    assert any("results.json" in v and DISAGREE in v for v in run.results.violations)
    assert any(ASKED in v for v in run.results.violations)  # the record's own, shown again
    table = build_tables([run])[0]
    assert table.rows[0].valid is False and any("INVALID" in f for f in table.rows[0].flags)

    outcome = verify_run(out, plugins=plugins, write=False)
    assert outcome.status == UNVERIFIED and DISAGREE in outcome.reason

    shown = CliRunner().invoke(cli, ["show", str(out)])
    assert "INVALID" in shown.output, shown.output


def test_an_honest_run_has_no_violations_record_and_stays_valid(plugins, fast, tmp_path):
    out = tmp_path / "r"
    _, results = protocol.run("base", overrides=_overrides(fast, "in_process"), out=out, plugins=plugins)
    assert results.valid is True and not (out / VIOLATIONS).exists()
    assert load_run(out).results.valid is True


def test_a_violation_recorded_as_results_were_written_makes_the_run_invalid_not_refused(plugins, fast,
                                                                                      tmp_path):
    # A hook that fails while results.json is assembled (export) records its violation after the
    # record's head was taken: the chain runs one violation line past results.json's head.
    out = tmp_path / "r"
    _, results = protocol.run("base", overrides=_overrides(fast, "in_process"), out=out, plugins=plugins)
    assert results.valid is True
    late = RunDir(out)
    late.load_episodes()
    late.record_violation("export of method 'base' raised RuntimeError: late.", ["export ... late."])
    run = load_run(out)  # not refused: every episode line is where results.json says
    assert run.results.valid is False
    assert any("results.json" in v and DISAGREE in v for v in run.results.violations)
    assert any("late." in v for v in run.results.violations)
    lines = (out / "episodes.jsonl").read_text().splitlines()
    (out / "episodes.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # an episode line dropped: refused
    with pytest.raises(ReportError, match="does not"):
        load_run(out)
