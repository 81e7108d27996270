"""Experiment trackers (``logging.trackers``): each gets the run's metrics through its own library,
offline, and what it stored is read back with that library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.storage.metrics import read_metrics
from arena.core.storage.trackers import INSTALL_HINT, PACKAGES

FAKE = ["llm.backend=fake", "embedder.name=hashing", "env.n_train=20", "env.n_valid=4", "env.n_test=4",
        "eval.max_steps=6", "eval.limit=1", "learn.budget.episodes=3"]


def tracked_run(tmp_path: Path, tracker: str) -> tuple[Path, dict[int, float]]:
    """A MemRL run logged to ``tracker``; the learning success it logged, per step."""
    pytest.importorskip(PACKAGES[tracker], reason=f"{PACKAGES[tracker]} is not installed: {INSTALL_HINT}")
    path, results = protocol.run("memrl", overrides=[*FAKE, f"logging.trackers=[{tracker}]"], out=tmp_path / "run")
    assert results.valid is True
    logged = {e["step"]: e["metrics"]["success"] for e in read_metrics(path) if e["phase"] == "learn"}
    assert sorted(logged) == [1, 2, 3]
    return path, logged


def test_tensorboard_gets_every_step(tmp_path) -> None:
    path, logged = tracked_run(tmp_path, "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path / "trackers" / "tensorboard"))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("learn/success")} == logged
    assert "learn/memories" in events.Tags()["scalars"]


def test_mlflow_gets_every_step_in_a_local_file_store(tmp_path) -> None:
    path, logged = tracked_run(tmp_path, "mlflow")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=(path / "trackers" / "mlflow").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("arena").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "learn.success")} == logged


def wandb_history(record_file: Path) -> list[dict]:
    """The history rows of an offline W&B run, read from its ``.wandb`` file: LevelDB-log framed
    records (a 7-byte file header, 32 KiB blocks, 7-byte record headers) of W&B's own protobuf
    ``Record`` messages; W&B 0.31 ships no reader of the file in Python."""
    from wandb.proto import wandb_internal_pb2

    data = record_file.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending, rows = 7, 32768, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def test_wandb_offline_gets_every_step(tmp_path) -> None:
    path, logged = tracked_run(tmp_path, "wandb")
    (offline,) = (path / "trackers" / "wandb" / "wandb").glob("offline-run-*")
    (record_file,) = offline.glob("run-*.wandb")  # what `wandb sync` would upload
    rows = wandb_history(record_file)
    assert {row["learn/step"]: row["learn/success"] for row in rows} == logged
    assert [row["learn/memories"] for row in rows] == [1, 2, 3]


TRACKIO_RUN = """
import json, sys
from arena.core import protocol
path, _ = protocol.run("memrl", overrides=sys.argv[2:], out=sys.argv[1])
from trackio.sqlite_storage import SQLiteStorage  # imported after the run: its folder is the run's
print(json.dumps(SQLiteStorage.get_logs(project="arena", run="run")))
"""


@pytest.mark.slow
def test_trackio_gets_every_step_in_its_local_database_in_the_run(tmp_path) -> None:
    """trackio fixes its folder when imported, so this run is a process of its own, as ``arena
    run`` is: the database lands in ``<run>/trackers/trackio``, nowhere in the home folder."""
    import os
    import subprocess
    import sys

    pytest.importorskip("trackio", reason=f"trackio is not installed: {INSTALL_HINT}")
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"}
    done = subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(out), *FAKE, "logging.trackers=[trackio]"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    logged = {e["step"]: e["metrics"]["success"] for e in read_metrics(out) if e["phase"] == "learn"}
    assert {int(r["step"]): r["learn/success"] for r in rows} == logged and sorted(logged) == [1, 2, 3]
    assert (out / "trackers" / "trackio" / "arena.db").is_file()


def test_a_tracker_not_installed_is_refused_with_the_install_hint(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb imports
    out = tmp_path / "run"
    with pytest.raises(ImportError, match=r"logging.trackers names wandb, but wandb is not installed: pip install"):
        protocol.run("base", overrides=[*FAKE, "logging.trackers=[wandb]"], out=out)
    assert not out.exists()  # nothing was run: no directory is left


def test_an_unknown_tracker_is_refused_before_a_run_directory_exists(tmp_path) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="tensorbord") as raised:
        protocol.run("base", overrides=[*FAKE, "logging.trackers=[tensorbord]"], out=out)
    assert "tensorboard" in str(raised.value) and not out.exists()
