"""``arena export``: runs as one SQLite database, every row of every run's files in it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core import protocol
from arena.core.services.store import stored_experiences
from arena.core.storage.metrics import read_metrics

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


def test_a_dataset_folder_is_kept_unless_forced_and_one_export_is_chosen(two_runs, tmp_path) -> None:
    out = tmp_path / "dataset"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), "--dataset", str(out)])
    assert result.exit_code != 0 and "exists; choose another --dataset folder, or pass --force" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    result = CliRunner().invoke(cli, ["export", str(two_runs[1]), "--dataset", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["README.md", "episodes.parquet"]  # base learns nothing
    both = CliRunner().invoke(cli, ["export", str(two_runs[1]), "--dataset", str(out), "--sqlite", str(tmp_path / "x")])
    assert both.exit_code != 0 and "Choose one export: --sqlite FILE or --dataset DIR" in both.output
