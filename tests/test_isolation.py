"""``run.isolation=process``: the method's hooks in a worker process (arena.core.isolation.isolated).

An isolated run must play what an in-process run plays; the worker must get nothing of the
harness but the plugin API; a worker that dies or overruns ends its episode, not the run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import arena
from arena.core import protocol
from arena.core.isolation.isolated import IsolationError, harness_export
from arena.core.isolation.rpc import SafeUnpickler
from arena.testing import fresh_plugins
from tests.helpers.overrides import EVOLVING_RL_TINY, SKILLRL_TINY
from tests.helpers.runs import killed_run, register

pytestmark = pytest.mark.slow  # each run starts a Python process for its method

ISOLATED = ["run.isolation=process"]


def records(path: Path) -> dict[tuple[str, int, str, str], dict]:
    """Each recorded episode by (phase, task, seed, variant): its outcome and every action."""
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    trajectories = [json.loads(line) for line in (path / "trajectories.jsonl").read_text().splitlines()]
    assert len(episodes) == len(trajectories)
    played = {}
    for episode, trajectory in zip(episodes, trajectories, strict=True):
        key = (episode["phase"], episode["task_id"], episode["seed"], episode.get("variant", "default"))
        assert key not in played
        played[key] = {"status": episode["status"], "steps": episode["steps"], "error": episode["error"],
                       "experiences": episode["experience_ids"],
                       "actions": [step["action"] for step in trajectory["steps"]]}
    return played


@pytest.mark.parametrize("method", ["base", "memrl", "rag", "expel"])
def test_an_isolated_run_plays_what_an_in_process_run_plays(plugins, fast, tmp_path, method):
    extra = ["eval.limit=3", "learn.budget.episodes=4", "learn.max_steps=4", "eval.salt=public"]
    if method == "expel":
        extra = ["eval.limit=3", "method.train_tasks=2", "learn.max_steps=4", "eval.salt=public"]
    here, here_results = protocol.run(method, overrides=fast + extra, out=tmp_path / "here", plugins=plugins)
    away, away_results = protocol.run(method, overrides=fast + extra + ISOLATED, out=tmp_path / "away",
                                      plugins=plugins)
    assert away_results.valid is True, away_results.violations
    assert records(Path(away)) == records(Path(here))
    assert away_results.state.digest_after_eval == here_results.state.digest_after_eval
    assert [away_results.splits[s].success_rate for s in ("test_seen", "test_unseen")] == \
        [here_results.splits[s].success_rate for s in ("test_seen", "test_unseen")]


@pytest.mark.parametrize("method", ["base", "memrl"])
def test_with_the_embedded_model_an_isolated_run_plays_the_same_episodes(plugins, tmp_path, method):
    """The served model stays with the harness: the same greedy choices, step for step."""
    settings = ["embedder.name=hashing", "eval.limit=1", "eval.max_steps=6", "learn.budget.episodes=2",
                "learn.max_steps=4", "llm.dtype=float32", "eval.salt=public", "env.n_train=60",
                "env.n_valid=12", "env.n_test=12"]
    here, _ = protocol.run(method, overrides=settings, out=tmp_path / "here", plugins=plugins)
    away, results = protocol.run(method, overrides=settings + ISOLATED, out=tmp_path / "away", plugins=plugins)
    assert results.valid is True and results.provenance.isolation["mode"] == "process"
    assert records(Path(away)) == records(Path(here))


# -- what the worker gets of the harness ---------------------------------------------------------


class Reacher:
    """Reaches past the plugin API for the harness's parts, one name per run."""

    target = ""

    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        found = None
        for name in self.target.split("."):
            found = getattr(found if found is not None else run, name)
        return None


#: The names a :class:`Reacher` reaches for, one class each: the worker imports the class by name
#: and inherits no environment variable a test could set.
TARGETS = ["_env", "gate", "episodes", "services", "env._env", "violations_log", "hook", "trainable_backend",
           "store._store", "llm.inner"]
for _index, _target in enumerate(TARGETS):
    globals()[f"Reacher{_index}"] = type(f"Reacher{_index}", (Reacher,), {"target": _target, "__module__": __name__})


@pytest.mark.parametrize("target", TARGETS)
def test_names_outside_the_plugin_api_are_refused_and_recorded(plugins, fast, tmp_path, target):
    register(plugins, reacher=globals()[f"Reacher{TARGETS.index(target)}"])
    _, results = protocol.run("reacher", overrides=fast + ["eval.limit=1"] + ISOLATED, out=tmp_path / "r",
                              plugins=plugins)
    assert results.valid is False
    assert any("not part of the plugin API" in v for v in results.violations)
    assert all(results.splits[s].success_rate == 0.0 for s in ("test_seen", "test_unseen"))


class Smuggler:
    """Returns an object whose unpickling would run code where it is built."""

    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def retrieve(self, run, task):
        return [Payload()]


class Payload:
    def __reduce__(self):
        return (os.system, ("touch smuggled",))


def test_what_the_worker_sends_cannot_run_code_in_the_harness(plugins, fast, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    register(plugins, smuggler=Smuggler)
    path, _ = protocol.run("smuggler", overrides=fast + ["eval.limit=1"] + ISOLATED, out=tmp_path / "s",
                                 plugins=plugins)
    assert not (tmp_path / "smuggled").exists()  # nothing ran in the harness's folder
    errors = {e["error"] for e in records(Path(path)).values()}
    assert errors and all(e and "retrieve" in e for e in errors), errors


def test_the_safe_unpickler_builds_data_and_refuses_code():
    import io
    import pickle

    from arena.core.contract.types import Experience, Provenance

    experience = Experience(kind="insight", text="t", provenance=Provenance(("x",), "train"))
    data = pickle.dumps([experience, {"a": (1, 2.0)}, {3}])
    built = SafeUnpickler(io.BytesIO(data), ["arena.core.contract.types"], lambda pid: pid).load()
    assert built[0] == experience and built[1] == {"a": (1, 2.0)} and built[2] == {3}
    for evil in (Payload(), os.getcwd, Path):
        with pytest.raises(pickle.UnpicklingError, match="may not be sent"):
            SafeUnpickler(io.BytesIO(pickle.dumps(evil)), ["arena.core.contract.types"], lambda pid: pid).load()


def test_the_harness_hands_over_only_the_api_and_plain_data(plugins, fast, tmp_path):
    from arena.testing import learning_context

    run = learning_context("base", out=tmp_path / "ctx", plugins=plugins)
    try:
        assert "play" in harness_export(run) and "_env" not in harness_export(run)
        assert "trainable_backend" not in harness_export(run)
        assert {"trainer", "fine_tune"} <= harness_export(run)  # the harness trains the model it keeps
        assert {"choose", "enter", "leave"} <= harness_export(run.llm)  # a method's threads join its batches
        assert harness_export(run.env) >= {"tasks", "instructions", "open"}
        assert harness_export({"a": [1]}) is None and harness_export(run.cfg) is None
        with pytest.raises(TypeError, match="not handed to an isolated method"):
            harness_export(run.env._env)
    finally:
        run.env.close()


# -- a worker that dies or overruns --------------------------------------------------------------


class Misbehaving:
    """Misbehaves (``misbehave``) in the first test episode it solves, then plays honestly. The
    mark goes in the method's folder: the only one of the run its sandbox may write."""

    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        marker = run.method_state.folder / "mark"
        if not marker.exists():
            marker.write_text(task.task_id)
            return self.misbehave()
        return None

    def misbehave(self):
        raise NotImplementedError


class Crasher(Misbehaving):
    """Its worker dies (the replaced one carries on)."""

    def misbehave(self):
        os._exit(3)


class Sleeper(Misbehaving):
    """Hangs past the hook's time limit."""

    def misbehave(self):
        time.sleep(120)


class Hog(Misbehaving):
    """Asks for 4 GB under a 1,500 MB limit on its worker."""

    def misbehave(self):
        return bytearray(4 << 30)


@pytest.mark.parametrize("method", ["crasher", "sleeper"])
def test_a_worker_that_dies_or_hangs_ends_its_episode_not_the_run(plugins, fast, tmp_path, method):
    marker = tmp_path / "w" / "method" / "mark"
    register(plugins, crasher=Crasher, sleeper=Sleeper)
    started = time.monotonic()
    path, results = protocol.run(method, overrides=fast + ["eval.limit=2", "eval.concurrency=1",
                                                          "run.isolation_limits.hook_seconds=5"] + ISOLATED,
                                 out=tmp_path / "w", plugins=plugins)
    assert time.monotonic() - started < 100
    played = records(Path(path))
    failed = {key[1]: value["error"] for key, value in played.items() if value["status"] == "error"}
    assert list(failed) == [marker.read_text()], failed
    reason = "ChannelClosed" if method == "crasher" else "CallTimeout"
    assert reason in next(iter(failed.values())) and "worker was replaced" in next(iter(failed.values()))
    assert sum(1 for value in played.values() if value["status"] != "error") == len(played) - 1
    assert results.provenance.isolation["worker_restarts"] == 1


def test_a_worker_over_its_memory_limit_fails_its_episode_not_the_run(plugins, fast, tmp_path):
    register(plugins, hog=Hog)
    path, results = protocol.run("hog", overrides=fast + ["eval.limit=2", "eval.concurrency=1",
                                                          "run.isolation_limits.memory_mb=1500"] + ISOLATED,
                                 out=tmp_path / "h", plugins=plugins)
    failed = {key[1]: value["error"] for key, value in records(Path(path)).items() if value["status"] == "error"}
    assert list(failed) == [(tmp_path / "h" / "method" / "mark").read_text()]
    assert "MemoryError" in next(iter(failed.values()))
    assert results.provenance.isolation["worker_restarts"] == 0  # the worker lived on


def test_a_factory_the_worker_cannot_import_is_named(plugins, fast, tmp_path):
    class Local:
        def __init__(self, run):
            self.run = run

    register(plugins, local=Local)
    with pytest.raises(IsolationError, match="not importable by name"):
        protocol.run("local", overrides=fast + ["eval.limit=1"] + ISOLATED, out=tmp_path / "l", plugins=plugins)


def test_an_isolated_run_on_a_secret_draw_verifies(tmp_path):
    """The replay runs isolated too, on the run's own salt (its eval_salt file goes with it)."""
    from arena.report.verify import verify_run
    from arena.testing import run_method

    run = run_method("memrl", ["eval.limit=2", "learn.budget.episodes=3", "learn.max_steps=4", *ISOLATED],
                     out=tmp_path / "memrl")
    assert run.results.protocol.eval_salt.startswith("secret:")
    outcome = verify_run(run.path)
    assert outcome.status == "verified", outcome.reason


def test_a_board_evaluates_a_submitted_learned_state_on_its_own_draw(plugins, fast, tmp_path):
    """``arena evaluate --state``: the submitter's learned state, the board's salt and isolation."""
    from click.testing import CliRunner

    from arena.cli import cli
    from arena.report.evaluate_state import EvaluateError, evaluate_state

    submitted, results = protocol.run("memrl", overrides=fast + ["eval.limit=2", "learn.budget.episodes=3",
                                                                 "learn.max_steps=4"], out=tmp_path / "sub",
                                      plugins=plugins)
    path, board = evaluate_state(submitted, tmp_path / "board", ["eval.salt=secret", "run.isolation=process"],
                                 plugins=plugins)
    assert board.valid is True, board.violations
    assert board.state.digest_before_eval == results.state.digest_before_eval
    assert board.state.memory_items == results.state.memory_items
    assert board.protocol.eval_salt.startswith("secret:") and results.protocol.eval_salt == "public"
    assert board.provenance.isolation["mode"] == "process"
    assert board.provenance.evaluated_from["digest_before_eval"] == results.state.digest_before_eval
    assert board.learn.used == results.learn.used  # learning not rerun
    with pytest.raises(EvaluateError, match="not a board's to set"):
        evaluate_state(submitted, tmp_path / "again", ["learn.budget.episodes=50"], plugins=plugins)
    refused = CliRunner().invoke(cli, ["evaluate", "--state", str(submitted), "--out", str(path),
                                       "eval.salt=secret"])
    assert refused.exit_code == 1 and "exists" in refused.output


@pytest.mark.parametrize("method", ["evolving_rl", "grpo"])
def test_a_method_that_trains_the_served_model_runs_isolated_with_the_same_weights(plugins, tmp_path, method):
    """run.trainer keeps the trainer with the harness: an isolated Evolving-RL (or GRPO) run
    trains the same LoRA weights and plays the same episodes as one in Arena's process."""
    settings = [*EVOLVING_RL_TINY, "eval.salt=public"]
    here, here_results = protocol.run(method, overrides=settings, out=tmp_path / "here", plugins=plugins)
    away, away_results = protocol.run(method, overrides=settings + ISOLATED, out=tmp_path / "away",
                                      plugins=plugins)
    assert away_results.valid is True, away_results.violations
    assert away_results.state.digest_before_eval == here_results.state.digest_before_eval
    assert records(Path(away)) == records(Path(here))
    assert any(Path(away, "method").rglob("*checkpoint*"))  # its checkpoints in the method's folder


#: SkillRL's every stage on the tiny model, one step each (cold-start SFT through run.fine_tune,
#: GRPO through run.trainer), the test draws public so two runs play the same worlds.
SKILLRL_SETTINGS = [*SKILLRL_TINY, "eval.salt=public"]


@pytest.fixture(scope="module")
def skillrl_runs(tmp_path_factory):
    """The same SkillRL run in Arena's process and isolated, made once for the tests below."""
    out = tmp_path_factory.mktemp("skillrl")
    here = protocol.run("skillrl", overrides=SKILLRL_SETTINGS, out=out / "here", plugins=fresh_plugins())
    away = protocol.run("skillrl", overrides=SKILLRL_SETTINGS + ISOLATED, out=out / "away",
                        plugins=fresh_plugins())
    return here, away


def test_skillrl_fine_tunes_and_trains_the_served_model_isolated_with_the_same_weights(skillrl_runs):
    """run.fine_tune and run.trainer run in the harness: an isolated SkillRL run (its SFT on the
    expert's demonstrations, which the harness hands the worker's recording policy, then GRPO)
    learns the same state and plays the same episodes as one in Arena's process."""
    (here, here_results), (away, away_results) = skillrl_runs
    assert here_results.valid is True and away_results.valid is True, away_results.violations
    assert away_results.provenance.isolation["mode"] == "process"
    assert json.loads(Path(away, "method", "state.json").read_text())["sft"]["examples"] > 0
    assert away_results.state.digest_before_eval == here_results.state.digest_before_eval
    assert away_results.provenance.model["weights_sha256"] == here_results.provenance.model["weights_sha256"]
    assert records(Path(away)) == records(Path(here))
    assert away_results.learn.used["gradient_steps"] == here_results.learn.used["gradient_steps"] == 1 + 1
    assert [p.name for p in Path(away, "method").glob("fine-tune-*")] == ["fine-tune-00001"]


@pytest.mark.parametrize("killed_at", ["fine_tune.kept:1", "episode.recorded:5"],
                         ids=["after-the-fine-tune-was-kept", "after-the-sft-stage"])
def test_a_resumed_isolated_skillrl_run_serves_its_fine_tuned_weights_again(skillrl_runs, tmp_path, killed_at):
    """Killed once the harness kept the fine-tune (the method's state not saved yet, so SkillRL
    asks for it again) or in the first GRPO rollout after the SFT stage: the harness restores
    the fine-tuned weights before the method is built, trains them once, and the resumed run
    ends with the uninterrupted run's state and episodes."""
    _, (away, away_results) = skillrl_runs
    out = tmp_path / "killed"
    assert killed_run(out, SKILLRL_SETTINGS + ISOLATED, killed_at, method="skillrl") == 137, \
        "the crash point was never reached"
    assert (out / "method" / "fine-tune-00001" / "fine-tune.json").is_file()
    stage = json.loads((out / "method" / "state.json").read_text())["stage"]
    assert stage == ("sft" if killed_at.startswith("fine_tune") else "rl")
    _, resumed = protocol.run(None, resume=out, plugins=fresh_plugins())
    assert resumed.valid is True, resumed.violations
    assert resumed.state.digest_before_eval == away_results.state.digest_before_eval
    assert resumed.provenance.model["weights_sha256"] == away_results.provenance.model["weights_sha256"]
    assert records(out) == records(Path(away))
    assert [p.name for p in (out / "method").glob("fine-tune-*")] == ["fine-tune-00001"]  # trained once
    assert resumed.learn.used["gradient_steps"] == 1 + 1


class BackendTaker:
    """Asks for the served model itself while learning and keeps the answer in its folder."""

    def __init__(self, run):
        pass

    @arena.hookimpl
    def learn(self, run):
        try:
            run.trainable_backend()
        except Exception as exc:
            (run.method_state.folder / "refused").write_text(f"{type(exc).__name__}: {exc}")
        return True


def test_the_served_model_itself_is_refused_to_an_isolated_method_with_the_fix(plugins, fast, tmp_path):
    register(plugins, taker=BackendTaker)
    path, results = protocol.run("taker", overrides=fast + ["eval.limit=1"] + ISOLATED, out=tmp_path / "t",
                                 plugins=plugins)
    refused = Path(path, "method", "refused").read_text()
    assert refused.startswith("Refused: RunContext.trainable_backend is not offered to the method's process")
    assert "run.fine_tune(rows, settings)" in refused and "run.trainer(settings)" in refused
    assert "run.isolation=in_process" in refused
    assert results.valid is False
    assert any("trainable_backend" in v for v in results.violations)


def test_objects_the_other_side_no_longer_refers_to_are_let_go():
    """A policy handed over for each episode is kept while the harness holds a proxy of it, then
    let go: a long isolated run does not keep every closure it ever passed."""
    import gc
    import multiprocessing

    from arena.core.isolation.rpc import ROOT, Channel, Proxy

    class Harness:
        def play(self, policy, steps):
            return [policy(step) for step in range(steps)]

    harness_end, worker_end = multiprocessing.Pipe()
    harness = Channel(harness_end, "h", lambda obj: None, trusted_modules=(),
                      callable_parameters={f"{__name__}.{Harness.__qualname__}.play": frozenset({"policy"})})
    harness.offer_root(Harness(), frozenset({"play"}))
    worker = Channel(worker_end, "w", lambda obj: frozenset({"__call__"}) if callable(obj) else None)
    harness.start(), worker.start()
    root = Proxy(worker, ROOT, "Harness")
    try:
        for episode in range(50):
            assert root.play(lambda step, episode=episode: episode * 10 + step, 3) == \
                [episode * 10, episode * 10 + 1, episode * 10 + 2]
            gc.collect()
        kept = len(worker._objects)
        assert kept <= 2, kept  # the policies of the last one or two calls, not of all 50
    finally:
        harness.close(), worker.close()


def test_an_isolated_command_line_run_imports_arena_wherever_it_is_installed(tmp_path):
    """From a folder outside the project, with Arena installed in editable mode (a finder maps
    its source, which is then not on the import path), the sandboxed worker still imports it."""
    import subprocess
    import sys

    code = ("import sys; from arena.cli import main; sys.argv = ['arena', *sys.argv[1:]]; main()")
    done = subprocess.run([sys.executable, "-c", code, "run", "--method", "memrl", "--env", "household",
                           "llm.backend=fake", "embedder.name=hashing", "env.n_train=60", "env.n_valid=12",
                           "env.n_test=12", "eval.limit=1", "learn.budget.episodes=2", *ISOLATED,
                           "--out", str(tmp_path / "run")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["valid"] is True and results["provenance"]["isolation"]["mode"] == "process"


def test_a_closed_channels_reader_ends_before_its_descriptor_can_be_reused():
    """A connection closed under a reader blocked in recv freed its descriptor while the recv
    still waited on the number; the next pipe opened (a replacement worker's, the next test's)
    could get the number, and the old reader then took that pipe's frames (an answer never
    arrived: a hang). Closing now wakes the reader and waits for it to end first."""
    import multiprocessing

    from arena.core.isolation.rpc import Channel

    ours, theirs = multiprocessing.Pipe()
    channel = Channel(ours, "h", lambda obj: None).start()
    time.sleep(0.05)  # the reader is now blocked in recv
    channel.close()
    assert not channel._reader.is_alive()
    assert channel.closed == "closed"
    theirs.close()


def test_a_signal_while_the_harness_serves_the_worker_stops_the_harness_not_the_workers_call():
    """SIGTERM or Ctrl-C arriving while the harness's main thread serves a call back from an
    isolated method (``learn`` playing an episode) unwinds the harness with that signal's own
    exception, so `arena run` stops cleanly with its resume hint. It was sent to the worker as
    the call's error and came back as a RemoteError, and the run ended with a traceback."""
    import multiprocessing

    from arena.core.isolation.rpc import ROOT, Channel, Proxy

    class Stop(BaseException):  # as arena.cli's Terminated: raised by a signal handler
        pass

    class Harness:
        def play(self):
            raise Stop

    class Method:
        harness: Proxy | None = None

        def learn(self):
            return self.harness.play()

    harness_end, worker_end = multiprocessing.Pipe()
    harness = Channel(harness_end, "h", lambda obj: None, trusted_modules=("arena.core.isolation.rpc",),
                      own_interrupts=True)
    harness.offer_root(Harness(), frozenset({"play"}))
    worker = Channel(worker_end, "w", lambda obj: None)
    method = Method()
    worker.offer_root(method, frozenset({"learn"}))
    harness.start(), worker.start()
    method.harness = Proxy(worker, ROOT, "Harness")
    try:
        with pytest.raises(Stop):
            Proxy(harness, ROOT, "Method").learn()
    finally:
        harness.close(), worker.close()
