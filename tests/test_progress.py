"""Progress a user can follow: plain timestamped lines when output is not a terminal (a job log),
a line for every phase and every step a method reports, and a fast, readable CLI."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

import arena
from arena.cli import cli
from arena.console import LineReporter
from arena.core import protocol
from arena.core.contract.types import EpisodeResult
from arena.core.services.progress import ProgressTask, format_duration
from tests.helpers.overrides import EVOLVING_RL_TINY, FAST
from tests.helpers.runs import harness_of

STAMP = r"^\d\d:\d\d:\d\d "


def episode(phase: str, success: bool) -> EpisodeResult:
    return EpisodeResult(phase=phase, track="frozen", task_id="t", split="test_seen", task_type="x",
                         seed=0, success=success, reward=float(success), progress=float(success),
                         steps=3, valid_actions=3, status="success" if success else "step_limit",
                         tokens_in=30, tokens_out=3, llm_calls=3, wall_s=0.1, experience_ids=[])


def test_line_reporter_writes_a_line_per_phase_step_and_rate_limits_the_rest() -> None:
    stream = io.StringIO()
    reporter = LineReporter(stream, interval_s=3600.0)
    reporter.phase("evaluate", 4, 0)
    for k in range(4):
        reporter.episode(episode("evaluate", success=k == 0))
    with ProgressTask(reporter, "it0: skill extraction", total=8) as task:
        for _ in range(8):
            task.advance()  # within the interval: no line until the end
    lines = stream.getvalue().splitlines()
    assert all(re.match(STAMP, line) for line in lines), lines
    assert lines[0].endswith("evaluate started: 0/4 tasks done")
    assert "evaluate 4/4 (100%) tasks" in lines[1] and "success 25.0%" in lines[1]
    assert lines[2].endswith("it0: skill extraction started (8 to do)")
    assert re.search(r"it0: skill extraction done in \d+s$", lines[3])
    assert len(lines) == 4

    chatty = io.StringIO()
    reporter = LineReporter(chatty, interval_s=0.0)
    with ProgressTask(reporter, "update", total=3) as task:
        task.update(1)
        task.update(2, note="loss 0.5")
    body = chatty.getvalue().splitlines()
    assert "update 1/3 (33%)" in body[1] and "eta" in body[1]
    assert body[2].endswith("loss 0.5") and "done in" in body[3]


def test_an_interrupted_step_says_so() -> None:
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt), ProgressTask(LineReporter(stream), "downstream episodes", total=5):
        raise KeyboardInterrupt
    assert stream.getvalue().splitlines()[-1].endswith("done in 0s: interrupted")


def test_durations_read_as_a_person_would() -> None:
    assert [format_duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]


class HelperEpisodes:
    """Plays two helper episodes before each test episode, as Evolving-RL plays a source episode
    and a without-skill one: a count of tasks alone stands still while they play. Each step takes
    a while, as a model's does."""

    def __init__(self, run) -> None:
        pass

    @arena.hookimpl
    def evaluation_variants(self, run):
        return ["source", "without_skill"]

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        standard = harness_of(run).standard_policy(task, experiences, seed)

        def slow(observation, trajectory):
            time.sleep(0.03)
            return standard(observation, trajectory)

        if run.phase == "evaluate":
            for helper in ("source", "without_skill"):
                run.play(arena.EpisodeRequest(task, [], run.current_seed(), helper, policy=slow))
        return run.play(arena.EpisodeRequest(task, experiences, policy=slow))


class Timed(io.StringIO):
    """A log that keeps when each of its lines was written."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def write(self, text: str) -> int:
        self.times.extend(time.monotonic() for _ in range(text.count("\n")))
        return super().write(text)


def test_a_logged_run_moves_every_interval_with_helper_episodes_and_ended_phases_stay_quiet(
        plugins, fast, tmp_path: Path) -> None:
    """Issue 43: `evaluate 0/8 (0%)` for 8 minutes while each task played three long episodes,
    and the finished learning phase printing `(running)` until the end. The log now counts every
    episode played and the step each has reached, gives an ETA from the episodes done, and a phase
    writes nothing after its `done` line."""
    module = types.SimpleNamespace(__name__="progress_test_plugin")

    @arena.hookimpl
    def register_methods(register):
        register("helper_episodes", HelperEpisodes)

    module.register_methods = register_methods
    plugins.register_plugin(module, name="progress_test_plugin")
    log, interval = Timed(), 0.2
    protocol.run("helper_episodes", overrides=[*fast, "eval.limit=2", "eval.max_steps=8",
                                               "learn.budget.episodes=3"],
                 out=tmp_path / "run", plugins=plugins, reporter=LineReporter(log, interval_s=interval))
    lines = log.getvalue().splitlines()
    assert all(re.match(STAMP, line) for line in lines), lines
    text = [line[9:] for line in lines]
    for phase in ("learn", "evaluate"):
        ended = [k for k, line in enumerate(text) if line.startswith(f"{phase} done in ")]
        assert len(ended) == 1, text
        after = [line for line in text[ended[0] + 1:] if line.startswith(phase + " ")]
        assert not after, f"{phase} wrote after it ended: {after}"
    assert text.index("evaluate started: 0/4 tasks done") > next(
        k for k, line in enumerate(text) if line.startswith("learn done in "))

    start = text.index("evaluate started: 0/4 tasks done")
    end = next(k for k, line in enumerate(text) if line.startswith("evaluate done in "))
    shown = [k for k in range(start + 1, end) if text[k].startswith("evaluate ")]
    states = [re.match(r"evaluate (\d+)/4 \(\d+%\) tasks; (?:(\d+) episodes? played)?(?:; playing step ([\d/, ]+))?",
                       text[k]) for k in shown]
    assert all(states), [text[k] for k in shown]
    tasks_done = [int(m.group(1)) for m in states]
    played = [int(m.group(2) or 0) for m in states]
    assert tasks_done == sorted(tasks_done) and played == sorted(played)
    # progress moves while no task has ended yet: episodes and steps, not only tasks
    before_first_task = [m.group(2, 3) for m in states if m.group(1) == "0"]
    assert len(set(before_first_task)) >= 3, [text[k] for k in shown]
    assert max(played) >= 8  # 4 tasks x 3 episodes: the helpers count
    assert "4/4 (100%) tasks; 12 episodes played" in text[end], text[end]
    assert any(" eta " in text[k] for k in shown), [text[k] for k in shown]
    # a line at least once per interval while steps are played (rate-limited to one per
    # interval); a second of silence at most (the heartbeat's), with slack for a busy machine
    gaps = [b - a for a, b in zip([log.times[start], *[log.times[k] for k in shown]],
                                  [*[log.times[k] for k in shown], log.times[end]])]
    assert max(gaps) < max(interval, 1.0) + 0.5, gaps
    assert len(shown) >= 4, [text[k] for k in shown]


@pytest.mark.slow
def test_evolving_rl_to_a_file_writes_progress_lines_for_every_phase(tmp_path: Path) -> None:
    """What a cluster job's log shows for `arena run --method evolving_rl` (tiny model; the
    random model writes no parseable card, so extraction and the update still run)."""
    log = tmp_path / "run.log"
    env = {**os.environ, "ARENA_PROGRESS_INTERVAL_S": "0"}
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "arena.cli", "run", "--method", "evolving_rl",
                               "--out", str(tmp_path / "run"), *EVOLVING_RL_TINY, "method.extractor_max_tokens=24"],
                              stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=600)
    text = log.read_text()
    assert done.returncode == 0, text
    for expected in ("learn started", "evolving_rl iterations started (1 to do)",
                     "it0: source episodes started (2 to do)", "it0: skill extraction (4 cards, one batch)",
                     "it0: downstream episodes", "evaluate started", "evolving_rl iterations done in"):
        assert expected in text, f"no '{expected}' line in:\n{text}"
    assert re.search(STAMP + r"evaluate \d+/\d+ \(100%\)", text, re.M), text
    # The test-time cards are one long generate call: its tokens move the evaluate line meanwhile.
    assert re.search(STAMP + r"evaluate .*generating (8|16)/24 tokens of \d+ repl", text, re.M), text
    assert json.loads((tmp_path / "run" / "results.json").read_text())["valid"]


def test_arena_evaluate_to_a_file_writes_progress_lines_as_arena_run_does(plugins, tmp_path: Path) -> None:
    """A board's evaluation of a submitted state (a memory reset plays every test task for hours)
    shows in a job's log as a run does, not only its summary at the end."""
    submitted, _ = protocol.run("rag", overrides=[*FAST, "learn.budget.episodes=3"], out=tmp_path / "sub",
                                plugins=plugins)
    done = subprocess.run([sys.executable, "-m", "arena.cli", "evaluate", "--state", str(submitted),
                           "--out", str(tmp_path / "reset"), "eval.experience.source=none"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "ARENA_PROGRESS_INTERVAL_S": "0"})
    assert done.returncode == 0, done.stderr
    assert re.search(STAMP + r"evaluate started: 0/24 tasks done$", done.stderr, re.M), done.stderr
    assert re.search(STAMP + r"evaluate done in .*: 24/24 \(100%\) tasks", done.stderr, re.M), done.stderr
    assert "learn started" not in done.stderr  # its learning is the submitted one, not rerun


def test_plugins_lists_presets_and_keeps_install_hints_intact() -> None:
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 0, result.output
    assert "presets" in result.output and "micro" in result.output
    assert "pip install 'arena[alfworld]'" in result.output.replace("\n", " ") or \
        "arena[alfworld]" in result.output


def test_piped_tables_are_not_squeezed_to_80_columns() -> None:
    done = subprocess.run([sys.executable, "-m", "arena.cli", "plugins"], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) > 100


def test_a_long_silent_step_still_writes_a_line_every_interval() -> None:
    """One long call (a batched generate, a trainer update) advances nothing for minutes; the log
    must not look hung meanwhile."""
    import time

    stream = io.StringIO()
    with ProgressTask(LineReporter(stream, interval_s=1.0), "it0: skill extraction", total=8):
        time.sleep(2.3)
    beats = [line for line in stream.getvalue().splitlines() if line.endswith("(running)")]
    assert 1 <= len(beats) <= 3 and all("it0: skill extraction 0/8 (0%)" in b for b in beats), beats


def test_a_long_generation_moves_the_phase_line_and_leaves_it_when_done() -> None:
    """A batch of test-time cards took two minutes on 2 cores while no episode took a step: the
    evaluate line said `playing step 2/30, 1/30` all along. The tokens generated now show."""
    stream = io.StringIO()
    reporter = LineReporter(stream, interval_s=0.0)
    reporter.phase("evaluate", 8, 0)
    reporter.play_start("evaluate", 30)
    for tokens in (8, 16):
        reporter.generation(tokens, 256, 8)
    reporter.generation(256, 256, 8)
    reporter.play_step("evaluate", 2)
    lines = [line[9:] for line in stream.getvalue().splitlines()]
    assert [line for line in lines if "generating" in line] == [
        "evaluate 0/8 (0%) tasks; 0 episodes played; playing step 0/30; generating 8/256 tokens of 8 replies; 0s",
        "evaluate 0/8 (0%) tasks; 0 episodes played; playing step 0/30; generating 16/256 tokens of 8 replies; 0s",
    ], lines
    assert lines[-1].startswith("evaluate 0/8 (0%) tasks; 0 episodes played; playing step 2/30; 0s"), lines
    reporter.phase_end("evaluate")
    reporter.generation(8, 256, 1)  # no phase running: nothing to show, nothing raised
    assert stream.getvalue().splitlines()[-1][9:].startswith("evaluate stopped after")  # 0 of 8 done


def test_a_phase_that_ends_short_of_its_total_says_it_stopped() -> None:
    """A board row stopped with SIGTERM at 25 of 240 tasks logged `evaluate done in 20m10s`."""
    stream = io.StringIO()
    reporter = LineReporter(stream, interval_s=3600.0)
    reporter.phase("evaluate", 4, 1)  # resumed with one task done
    reporter.episode(episode("evaluate", success=True))
    reporter.phase_end("evaluate")
    reporter.phase("learn", None, 0)  # no budget: whenever it ends, it is done
    reporter.phase_end("learn")
    reporter.phase("evaluate", 2, 0)
    for _ in range(2):
        reporter.episode(episode("evaluate", success=False))
    reporter.phase_end("evaluate")
    ends = [line[9:] for line in stream.getvalue().splitlines() if " started" not in line
            and re.match(r"\S+ (done in|stopped after) ", line[9:])]
    assert [re.sub(r" \d+s:.*", "", line) for line in ends] == [
        "evaluate stopped after", "learn done in", "evaluate done in"], ends
    assert re.search(r"stopped after \d+s: 2/4 \(50%\) tasks", ends[0]), ends


def test_a_phase_without_a_total_that_is_interrupted_says_it_stopped() -> None:
    """Evolving-RL's learning (a budget of iterations, no episode total) stopped with SIGTERM
    logged `learn done in 1h11m`: a phase without a total cannot tell stopped from done by its
    count, so the harness says which."""
    stream = io.StringIO()
    reporter = LineReporter(stream, interval_s=3600.0)
    for stopped in (True, False):
        reporter.phase("learn", None, 0)
        reporter.phase_end("learn", stopped=stopped)
    reporter.phase("evaluate", 2, 2)  # resumed with every task done, then interrupted at its end
    reporter.phase_end("evaluate", stopped=True)
    ends = [re.sub(r" \d+s:.*", "", line[9:]) for line in stream.getvalue().splitlines()
            if " started" not in line[9:]]
    assert ends == ["learn stopped after", "learn done in", "evaluate stopped after"], ends


class InterruptedLearner:
    """Learns until a Ctrl-C arrives in the middle of its ``learn`` hook."""

    def __init__(self, run) -> None:
        pass

    @arena.hookimpl
    def learn(self, run):
        raise KeyboardInterrupt


class PhaseEnds:
    """A reporter that keeps how each phase ended."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, bool]] = []

    def phase(self, name, total, done): ...

    def episode(self, result): ...

    def phase_end(self, name, *, stopped=False):
        self.ends.append((name, stopped))


def test_the_harness_tells_the_reporter_a_learning_phase_was_interrupted(plugins, fast, tmp_path: Path) -> None:
    from tests.helpers.runs import register

    register(plugins, interrupted_learner=InterruptedLearner)
    reporter = PhaseEnds()
    with pytest.raises(KeyboardInterrupt):
        protocol.run("interrupted_learner", overrides=[*fast, "eval.limit=1", "learn.budget.episodes=null",
                                                        "learn.budget.env_steps=20"],
                     out=tmp_path / "run", plugins=plugins, reporter=reporter)
    assert reporter.ends == [("learn", True)]
    reporter.ends.clear()
    protocol.run("base", overrides=[*fast, "eval.limit=1"], out=tmp_path / "base", plugins=plugins,
                 reporter=reporter)
    assert reporter.ends and all(not stopped for _, stopped in reporter.ends), reporter.ends


def test_a_reporter_written_before_stopped_existed_is_told_its_phase_ended() -> None:
    from arena.core.services.progress import complete

    class Old:
        def __init__(self) -> None:
            self.ended: list[str] = []

        def phase(self, name, total, done): ...

        def episode(self, result): ...

        def phase_end(self, name):
            self.ended.append(name)

    old = Old()
    complete(old).phase_end("learn", stopped=True)
    assert old.ended == ["learn"]


def test_the_backend_tells_its_generation_as_it_goes() -> None:
    from arena.backends.transformers_backend import TransformersBackend
    from arena.core.contract.llm import SamplingParams

    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    told: list[tuple[int, int, int]] = []
    llm.on_generated = lambda *args: told.append(args)
    llm.generate([[{"role": "user", "content": "hello"}]] * 2, SamplingParams(max_new_tokens=20, temperature=1.0, seed=0))
    assert told[-1] == (20, 20, 2), told  # the end, whenever the replies stopped
    assert told[:-1] and all(tokens % 8 == 0 and tokens < 20 and rest == [20, 2] for tokens, *rest in told[:-1]), told


def test_a_reporter_with_only_phase_and_episode_callbacks_still_works() -> None:
    class Old:
        def phase(self, name, total, done): ...

        def episode(self, result): ...

    with ProgressTask(Old(), "update", total=2) as task:  # type: ignore[arg-type]
        task.advance()
    assert task.done == 1


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code", "word"), [(2, 130, "Interrupted."), (15, 143, "Terminated.")])
def test_ctrl_c_and_sigterm_stop_cleanly_and_say_how_to_resume(tmp_path: Path, signum: int, code: int,
                                                               word: str) -> None:
    import signal
    import time

    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "arena.cli", "run", "--method", "base", "--out", str(out), "llm.model=tiny",
         "embedder.name=hashing", "eval.limit=null", "eval.concurrency=2"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "ARENA_PROGRESS_INTERVAL_S": "0"},
        # Ctrl-C as a terminal delivers it, whatever this suite was started with (a job started
        # in the background of a script inherits SIGINT ignored, and its children with it).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    for line in process.stderr:  # wait until episodes are being played
        if re.search(r"evaluate [1-9]\d*/", line) or time.monotonic() > deadline:
            break
    process.send_signal(signal.Signals(signum))
    rest = process.stderr.read()
    assert process.wait(timeout=120) == code, rest
    assert word in rest and "Traceback" not in rest
    assert f"continue with `arena run --resume {out.resolve()}`." in rest  # the run named, on one line
    assert not (out / "results.json").exists() and (out / "episodes.jsonl").exists()
    shown = CliRunner().invoke(cli, ["show", str(out)])
    assert "was interrupted" in shown.output  # the lock went with the process


@pytest.mark.slow
def test_sigterm_while_an_isolated_method_learns_stops_cleanly(tmp_path: Path) -> None:
    """The signal comes while the harness plays an episode for the worker's ``learn`` hook: it
    ended the run with a traceback (``RemoteError: Terminated``), the worker having been sent
    the harness's own signal as its call's error."""
    import signal
    import time

    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "arena.cli", "run", "--method", "memrl", "--out", str(out), "llm.model=tiny",
         "embedder.name=hashing", "learn.budget.episodes=40", "eval.limit=1", "run.isolation=process"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "ARENA_PROGRESS_INTERVAL_S": "0"})
    assert process.stderr is not None
    deadline = time.monotonic() + 180
    for line in process.stderr:  # wait until learning episodes are being played
        if re.search(r"learn [1-9]\d*/", line) or time.monotonic() > deadline:
            break
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read()
    assert process.wait(timeout=120) == 143, rest
    assert "Terminated." in rest and f"arena run --resume {out.resolve()}`" in rest and "Traceback" not in rest, rest


def test_the_terminal_bars_show_episodes_played_and_stop_when_their_phase_ends() -> None:
    """The rich display shows what the log does: the episodes played and the step reached, an
    ETA from the episodes done; a phase's bar stops at its end and takes no more updates."""
    from rich.console import Console

    from arena.console import RichReporter, bars

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with bars(console) as progress:
        reporter = RichReporter(progress)
        reporter.phase("learn", 2, 0)
        reporter.phase_end("learn")
        (learn,) = progress.tasks
        assert learn.stop_time is not None
        reporter.episode(episode("learn", success=True))  # a straggler: ignored
        assert learn.completed == 0
        reporter.phase("evaluate", 2, 0)
        reporter.plan_task_start("evaluate")
        for _ in range(2):  # a helper episode, then the task's own
            reporter.play_start("evaluate", 30)
            reporter.play_step("evaluate", 14)
            reporter.play_end("evaluate")
        evaluate = progress.tasks[1]
        assert evaluate.fields["success"] == "2 episodes played"
        reporter.plan_task_start("evaluate")
        reporter.play_start("evaluate", 30)
        reporter.play_step("evaluate", 3)
        assert evaluate.fields["success"] == "2 episodes played; playing step 3/30"
        assert evaluate.fields["eta"]  # 2 episodes per task, 2 done, 2 to go
        reporter.play_end("evaluate")
        reporter.phase_end("evaluate")
        assert evaluate.stop_time is not None and evaluate.fields["eta"] == ""


def test_the_stop_hint_names_the_run_or_says_where_to_find_it(tmp_path: Path) -> None:
    from arena import cli as cli_module

    try:
        cli_module._name_run_dir(str(tmp_path / "run"))
        assert cli_module._resume_hint().endswith(f"`arena run --resume {(tmp_path / 'run').resolve()}`.")
        cli_module._name_run_dir(None)  # a run whose directory Arena chose
        hint = cli_module._resume_hint()
        assert "`arena run --resume RUN_DIR` (the run directory `arena run` printed" in hint, hint
    finally:
        cli_module._name_run_dir(None)
