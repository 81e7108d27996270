"""`arena run` under torchrun on 2 gloo CPU ranks: rank 0 runs the harness, rank 1 trains its
shard; the results are the protocol's, as in one process; a killed rank ends the run with a
clear message and `--resume` under torchrun finishes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from arena.core import protocol

pytestmark = pytest.mark.slow

MICRO = ["llm.model=tiny", "embedder.name=hashing", "eval.limit=1"]


def torchrun(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ARENA_PROGRESS_INTERVAL_S": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "-m", "arena.cli", "run", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_two_ranks_finish_with_the_protocol_of_one_process(plugins, tmp_path) -> None:
    process = torchrun("--method", "evolving_rl", "--preset", "micro", *MICRO, "--out", str(tmp_path / "two"))
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-3000:]
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    _, one = protocol.run("evolving_rl", preset="micro", overrides=MICRO, out=tmp_path / "one",
                          plugins=plugins)
    assert two["valid"] is True and one.valid is True, two["violations"]
    assert two["protocol"] == one.to_json()["protocol"]
    assert two["learn"]["used"] == one.learn.used
    assert two["learn"]["used"]["gradient_steps"] == 1
    tiny = plugins.backends.get("transformers").factory({"model": "tiny"}).weights_digest()
    assert two["provenance"]["model"]["weights_sha256"] != tiny  # the trained weights reached rank 0


def test_a_killed_rank_ends_the_run_clearly_and_resume_finishes_it(tmp_path) -> None:
    import psutil

    run_dir = tmp_path / "run"
    learn = ["method.iterations=4", "learn.budget.gradient_steps=4"]
    process = torchrun("--method", "evolving_rl", "--preset", "micro", *MICRO, *learn, "--out", str(run_dir))
    deadline = time.time() + 600
    while not (run_dir / "method" / "checkpoint-00001").exists():
        assert process.poll() is None and time.time() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.05)
    rank_1 = [child for child in psutil.Process(process.pid).children(recursive=True)
              if child.environ().get("RANK") == "1"]
    assert len(rank_1) == 1
    rank_1[0].send_signal(signal.SIGKILL)
    output, _ = process.communicate(timeout=600)
    assert process.returncode != 0
    assert "--resume RUN_DIR" in output and ("torchrun stops every rank" in output or "A training rank stopped" in output), output[-3000:]
    assert not (run_dir / "results.json").exists()

    resumed = torchrun("--resume", str(run_dir))
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True, results["violations"]
    assert results["learn"]["used"]["gradient_steps"] == 4
    assert json.loads((run_dir / "method" / "state.json").read_text())["iterations_done"] == 4


def test_a_following_rank_exits_0_once_rank_0_says_stop(monkeypatch) -> None:
    """A rank other than 0 leaves through os._exit(0) once it has followed to the end: the
    interpreter's teardown once aborted such a rank after the run had written its results."""
    from click.testing import CliRunner

    from arena import cli as cli_module
    from arena.core.rl import ranks

    calls: list[str] = []

    class Exited(Exception):
        pass

    def exit_now(code: int) -> None:
        calls.append(f"exit {code}")
        raise Exited()

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(ranks, "join", lambda: type("World", (), {"rank": 1})())
    monkeypatch.setattr(ranks, "follow", lambda: calls.append("follow"))
    monkeypatch.setattr(cli_module.os, "_exit", exit_now)
    result = CliRunner().invoke(cli_module.cli, ["run", "--method", "base"])
    assert isinstance(result.exception, Exited)
    assert calls == ["follow", "exit 0"]
