"""Progress a user can follow: plain timestamped lines when output is not a terminal (a job log),
a line for every phase and every step a method reports, and a fast, readable CLI."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.console import LineReporter
from arena.core.progress import ProgressTask, format_duration
from arena.core.types import EpisodeResult

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
    assert lines[0].endswith("evaluate started: 0/4 episodes done")
    assert "evaluate 4/4 (100%)" in lines[1] and "success 25.0%" in lines[1]
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


@pytest.mark.slow
def test_evolving_rl_to_a_file_writes_progress_lines_for_every_phase(tmp_path: Path) -> None:
    """What a cluster job's log shows for `arena run --method evolving_rl` (tiny model; the
    random model writes no parseable card, so extraction and the update still run)."""
    from tests.test_evolving_rl import TINY

    log = tmp_path / "run.log"
    env = {**os.environ, "ARENA_PROGRESS_INTERVAL_S": "0"}
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "arena.cli", "run", "--method", "evolving_rl",
                               "--out", str(tmp_path / "run"), *TINY], stdout=sink,
                              stderr=subprocess.STDOUT, env=env, timeout=600)
    text = log.read_text()
    assert done.returncode == 0, text
    for expected in ("learn started", "evolving_rl iterations started (1 to do)",
                     "it0: source episodes started (2 to do)", "it0: skill extraction (4 cards, one batch)",
                     "it0: downstream episodes", "evaluate started", "evolving_rl iterations done in"):
        assert expected in text, f"no '{expected}' line in:\n{text}"
    assert re.search(STAMP + r"evaluate \d+/\d+ \(100%\)", text, re.M), text
    assert json.loads((tmp_path / "run" / "results.json").read_text())["valid"]


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
        env={**os.environ, "ARENA_PROGRESS_INTERVAL_S": "0"})
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    for line in process.stderr:  # wait until episodes are being played
        if re.search(r"evaluate [1-9]\d*/", line) or time.monotonic() > deadline:
            break
    process.send_signal(signal.Signals(signum))
    rest = process.stderr.read()
    assert process.wait(timeout=120) == code, rest
    assert word in rest and "arena run --resume" in rest and "Traceback" not in rest
    assert not (out / "results.json").exists() and (out / "episodes.jsonl").exists()
    shown = CliRunner().invoke(cli, ["show", str(out)])
    assert "was interrupted" in shown.output  # the lock went with the process
