"""``arena export``: runs as one SQLite database (every row of every run's files in it), a Hugging
Face dataset, or Inspect evaluation logs."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core import protocol
from arena.core.services.store import stored_experiences
from arena.core.storage.metrics import read_metrics
from tests.helpers.browser import evaluate, find_chromium, headless_page, until

FAKE = ["llm.backend=fake", "embedder.name=hashing", "env.n_train=20", "env.n_valid=4", "env.n_test=4",
        "eval.max_steps=6", "eval.limit=2", "learn.budget.episodes=3"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    return [protocol.run(method, overrides=FAKE, out=root / method)[0] for method in ("memrl", "base")]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_database_holds_every_episode_step_experience_and_metric(two_runs, tmp_path) -> None:
    out = tmp_path / "runs.sqlite"
    result = CliRunner().invoke(cli, ["export", *map(str, two_runs), "--sqlite", str(out)])
    assert result.exit_code == 0, result.output
    db = sqlite3.connect(out)
    count = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
             for t in ("runs", "splits", "episodes", "steps", "experiences", "metrics")}
    assert count["runs"] == 2 and count["splits"] == 4
    assert count["episodes"] == sum(len(lines(p / "episodes.jsonl")) for p in two_runs)
    assert count["steps"] == sum(len(t["steps"]) for p in two_runs for t in lines(p / "trajectories.jsonl"))
    memrl = two_runs[0]
    assert count["experiences"] == len(stored_experiences(memrl / "store")) > 0
    assert count["metrics"] == sum(len(e["metrics"]) for e in read_metrics(memrl)) > 0
    # A question a researcher asks: success per method and split, from the episodes themselves.
    rows = db.execute("""SELECT r.method, e.split, AVG(e.success) FROM episodes e JOIN runs r USING (run_id)
                         WHERE e.phase = 'evaluate' GROUP BY r.method, e.split ORDER BY r.method, e.split""").fetchall()
    results = {p.name: json.loads((p / "results.json").read_text()) for p in two_runs}
    for method, split, rate in rows:
        assert rate == pytest.approx(results[method]["splits"][split]["success_rate"], abs=1e-4)
    assert f"Wrote {out}" in result.output.replace("\n", "")


def test_an_existing_file_is_kept_unless_forced(two_runs, tmp_path) -> None:
    out = tmp_path / "runs.sqlite"
    out.write_text("my notes")
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), "--sqlite", str(out)])
    assert result.exit_code != 0 and "exists; choose another --sqlite file, or pass --force" in result.output
    assert out.read_text() == "my notes"
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), "--sqlite", str(out), "--force"])
    assert result.exit_code == 0 and sqlite3.connect(out).execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)


def test_an_unfinished_or_foreign_folder_is_refused_and_nothing_written(tmp_path) -> None:
    out = tmp_path / "runs.sqlite"
    (tmp_path / "notarun").mkdir()
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "notarun"), "--sqlite", str(out)])
    assert result.exit_code != 0 and "has no results.json" in result.output and "Traceback" not in result.output
    assert not out.exists()


# -- --dataset: a Hugging Face dataset of the episodes and learned items ----------------------------


def test_the_dataset_loads_offline_with_every_episode_its_steps_and_the_learned_items(two_runs, tmp_path,
                                                                                       monkeypatch) -> None:
    import datasets
    import yaml

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # nothing may be fetched
    out = tmp_path / "dataset"
    result = CliRunner().invoke(cli, ["export", *map(str, two_runs), "--dataset", str(out)])
    assert result.exit_code == 0, result.output
    loaded = datasets.load_dataset("parquet", data_files=str(out / "data" / "episodes.parquet"),
                                   cache_dir=str(tmp_path / "cache"))["train"]
    recorded = {(p.name, *(e[k] for k in ("phase", "split", "task_id", "seed", "variant"))): e
                for p in two_runs for e in lines(p / "episodes.jsonl")}
    assert len(loaded) == len(recorded) > 0
    played = {(p.name, *t["key"]): len(t["steps"]) for p in two_runs for t in lines(p / "trajectories.jsonl")}
    for row in loaded:
        key = (row["run"], row["phase"], row["split"], row["task_id"], row["seed"], row["variant"])
        episode = recorded.pop(key)
        assert (row["success"], row["progress"], row["steps"]) == (episode["success"], episode["progress"], episode["steps"])
        assert len(row["trajectory"]) == played[key] and row["method"] == key[0]
        assert all(isinstance(step["action"], str) for step in row["trajectory"])
    assert recorded == {}  # every episode, once
    items = datasets.load_dataset("parquet", data_files=str(out / "data" / "learned_items.parquet"),
                                  cache_dir=str(tmp_path / "cache"))["train"]
    memrl = two_runs[0]
    assert sorted(items["experience_id"]) == sorted(e.experience_id for e in stored_experiences(memrl / "store"))
    assert len(items) > 0 and set(items["run"]) == {memrl.name}
    # The card: its YAML header names both configurations; its body states each run's protocol.
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert [c["config_name"] for c in header["configs"]] == ["episodes", "learned_items"]
    for path in two_runs:
        results = json.loads((path / "results.json").read_text())
        row = next(line for line in card.splitlines() if line.startswith(f"| {path.name} |"))
        assert f"eval.max_steps {results['protocol']['max_steps']}" in row
        assert all(digest in row for digest in results["provenance"]["split_hashes"].values())
    assert f"{len(loaded)} episodes" in result.output.replace("\n", "")


@pytest.mark.parametrize(("option", "library", "written"), [
    ("--dataset", "datasets", ["README.md", "episodes.parquet"]),  # base learns nothing: no learned items
    ("--inspect", "inspect_ai", ["base-learn.eval", "base.eval"]),  # nor plays a helper variant
])
def test_a_folder_is_kept_unless_forced_and_one_export_is_chosen(two_runs, tmp_path, option, library,
                                                                 written) -> None:
    pytest.importorskip(library, reason=f"{library} is not installed (pip install -e '.[export]')")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), option, str(out)])
    assert result.exit_code != 0 and f"exists; choose another {option} folder, or pass --force" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), option, str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == written
    both = CliRunner().invoke(cli, ["export", str(two_runs[1]), option, str(out), "--sqlite", str(tmp_path / "x")])
    assert both.exit_code != 0 and "Choose one export: --sqlite FILE, --dataset DIR or --inspect DIR" in both.output


# -- --inspect: Inspect evaluation logs, read back by inspect_ai and shown by `inspect view` --------


KEY = ("phase", "split", "task_id", "seed", "variant")


@pytest.fixture(scope="module")
def exported(two_runs, tmp_path_factory) -> tuple[Path, str]:
    """The two runs exported by the CLI: the folder and what the command printed."""
    pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install -e '.[export]')")
    out = tmp_path_factory.mktemp("inspect") / "logs"
    result = CliRunner().invoke(cli, ["export", *map(str, two_runs), "--inspect", str(out)])
    assert result.exit_code == 0, result.output
    return out, " ".join(result.output.split())  # rich wraps at a space, which depends on the path's length


def test_inspect_reads_back_every_episode_its_steps_scores_and_the_protocol(two_runs, exported) -> None:
    from inspect_ai.log import read_eval_log

    out, printed = exported
    read = 0
    for path in two_runs:
        recorded = {tuple(e[k] for k in KEY): e for e in lines(path / "episodes.jsonl")}
        played = {tuple(t["key"]): t for t in lines(path / "trajectories.jsonl")}
        results = json.loads((path / "results.json").read_text())
        logs = {log: read_eval_log(str(out / f"{path.name}{suffix}.eval"))
                for log, suffix in (("result", ""), ("learn", "-learn"))}
        assert not (out / f"{path.name}-helpers.eval").exists()  # memrl and base play no helper variant
        for log, eval_log in logs.items():
            assert eval_log.status == "success" and eval_log.samples
            for sample in eval_log.samples:
                episode = recorded.pop(tuple(sample.metadata[k] for k in KEY))
                assert (episode["phase"] == "learn") == (log == "learn")
                assert sample.scores["success"].value == float(episode["success"])
                assert sample.scores["progress"].value == pytest.approx(episode["progress"])
                steps = played[tuple(sample.metadata[k] for k in KEY)]["steps"]
                chat = sample.messages
                assert len(chat) == 1 + 2 * len(steps) and chat[0].role == "user"
                assert [m.text for m in chat[1::2]] == [s["action"] for s in steps]
                assert [m.role for m in chat[1::2]] == ["assistant"] * len(steps)
                assert [m.text for m in chat[2::2]] == [s["observation"] for s in steps]
                read += 1
            assert eval_log.results.total_samples == len(eval_log.samples)
        assert recorded == {}  # every episode, once
        # The result log's figures per split are results.json's; the protocol and provenance are its metadata.
        scores = {score.name: score.metrics for score in logs["result"].results.scores}
        for split, summary in results["splits"].items():
            assert scores["success"][split].value == pytest.approx(summary["success_rate"], abs=1e-4)
            assert scores["progress"][split].value == pytest.approx(summary["progress_rate"], abs=1e-4)
        arena = logs["result"].eval.metadata["arena"]
        assert arena["protocol"]["eval.max_steps"] == results["protocol"]["max_steps"]
        assert arena["protocol"]["eval.splits"] == list(results["splits"])
        assert arena["provenance"]["split_hashes"] == results["provenance"]["split_hashes"]
        assert arena["valid"] is results["valid"] and arena["method"] == results["method"]
        assert logs["result"].eval.model == results["provenance"]["model"]["id"]
        assert logs["result"].eval.task == f"arena/{results['method']}"
    total = sum(len(lines(p / "episodes.jsonl")) for p in two_runs)
    assert read == total and f"2 runs, 4 logs, {total} samples" in printed


def test_a_missing_inspect_ai_names_the_install(two_runs, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "inspect_ai.log", None)  # as if inspect_ai were not installed
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), "--inspect", str(tmp_path / "logs")])
    assert result.exit_code != 0 and "needs inspect_ai: pip install -e '.[export]'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "logs").exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_inspect_view_shows_the_samples_and_an_episode_step_by_step(two_runs, exported, tmp_path) -> None:
    browser = find_chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed (CI set-up: apt-get install -y chromium)")
    out, _ = exported
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = subprocess.Popen([sys.executable, "-m", "inspect_ai", "view", "start", "--log-dir", str(out),
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with ExitStack() as stack:
        stack.callback(server.wait, timeout=10)
        stack.callback(server.terminate)
        deadline = time.monotonic() + 60
        while True:  # the server answers once it has started
            try:
                with urllib.request.urlopen(url, timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    said = server.stdout.read()[-2000:] if server.stdout else ""  # type: ignore[union-attr]
                    pytest.skip(f"`inspect view start` did not serve {url} within 60 s: {said}")
                time.sleep(0.5)
        devtools, session = stack.enter_context(headless_page(browser, tmp_path / "profile"))
        memrl = two_runs[0]
        devtools.call("Page.navigate", {"url": f"{url}#/logs/{memrl.name}.eval"}, session=session)
        devtools.wait_for("Page.loadEventFired")
        evaluated = [e for e in lines(memrl / "episodes.jsonl") if e["phase"] == "evaluate"]
        ids = [f"{e['split']}:{e['task_id']}" for e in evaluated]
        shown = until(devtools, session, f"(() => {{ const text = document.body.innerText; const ids = {json.dumps(ids)};"
                                         " return ids.every(id => text.includes(id)) && text; })()", timeout=60)
        # One sample, step by step: its first action shows as the assistant's message.
        href = evaluate(devtools, session, "(() => { const row = document.querySelector("
                                           "'[role=row][href*=\"/samples/sample/\"]'); row.click(); return row.href; })()")
        split, task_id = urllib.parse.unquote(href.split("/samples/sample/")[1].split("/")[0]).split(":", 1)
        first = next(t for t in lines(memrl / "trajectories.jsonl")
                     if t["key"][:3] == ["evaluate", split, task_id] and t["key"][4] == "default")
        transcript = until(devtools, session, "(() => { const text = document.body.innerText;"
                                              " return text.includes('ASSISTANT') && text; })()", timeout=60)
        devtools.call("Runtime.evaluate", {"expression": "1"}, session=session)  # drain late events
    errors = [e["params"] for e in devtools.events if e.get("method") == "Runtime.exceptionThrown"]
    assert errors == [], errors
    assert f"{len(ids)} Samples" in shown and "success" in shown and "progress" in shown
    assert first["steps"][0]["action"] in transcript and first["steps"][0]["observation"] in transcript
