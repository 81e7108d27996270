"""``arena export RUN_DIR... --sqlite FILE``: finished runs as one SQLite database.

Tables (``run_id`` joins them): ``runs`` (one row a run: method, environment, track, validity,
seeds, model, versions, the whole results.json), ``splits`` (success with its interval per run and
split), ``episodes`` (every line of episodes.jsonl), ``steps`` (every step of every recorded
trajectory: action, observation, validity, reward, log-prob, thought), ``experiences`` (the
store's contents at the end of the run) and ``metrics`` (metrics.jsonl, one row a figure). Query
many runs with SQL or pandas (``pd.read_sql``), or open the file in datasette.

Written with the standard library's sqlite3: one file, no server, and every reader has it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from arena.core.contract.settings import Settings
from arena.core.services.store import stored_experiences
from arena.core.storage.metrics import read_metrics
from arena.core.storage.rundir import TRAJECTORIES
from arena.report.runs import ReportError, Run, load_run

SCHEMA = """
CREATE TABLE runs (run_id INTEGER PRIMARY KEY, path TEXT, label TEXT, method TEXT, preset TEXT,
    env TEXT, track TEXT, valid INTEGER, limited INTEGER, seeds TEXT, model TEXT, arena_version TEXT,
    git_sha TEXT, started TEXT, finished TEXT, results TEXT);
CREATE TABLE splits (run_id INTEGER REFERENCES runs, split TEXT, n_tasks INTEGER, n_episodes INTEGER,
    success_rate REAL, ci95_low REAL, ci95_high REAL, progress_rate REAL, valid_action_rate REAL,
    mean_steps REAL);
CREATE TABLE episodes (run_id INTEGER REFERENCES runs, phase TEXT, track TEXT, split TEXT, task_id TEXT,
    task_type TEXT, seed INTEGER, variant TEXT, success INTEGER, status TEXT, reward REAL,
    progress REAL, steps INTEGER, valid_actions INTEGER, llm_calls INTEGER, tokens_in INTEGER,
    tokens_out INTEGER, wall_s REAL, error TEXT, copy_of TEXT, experience_ids TEXT,
    derived_experience_ids TEXT);
CREATE TABLE steps (run_id INTEGER REFERENCES runs, phase TEXT, split TEXT, task_id TEXT, seed INTEGER,
    variant TEXT, step INTEGER, action TEXT, observation TEXT, valid INTEGER, reward REAL,
    progress REAL, thought TEXT, logprob REAL, tokens_in INTEGER, tokens_out INTEGER);
CREATE TABLE experiences (run_id INTEGER REFERENCES runs, experience_id TEXT, kind TEXT, text TEXT,
    source_split TEXT, source_task_ids TEXT, metadata TEXT);
CREATE TABLE metrics (run_id INTEGER REFERENCES runs, phase TEXT, step INTEGER, name TEXT, value REAL);
CREATE INDEX episodes_by_task ON episodes (task_id, seed, variant);
CREATE INDEX steps_by_episode ON steps (run_id, task_id, seed, variant);
"""
EPISODE_COLUMNS = ("phase", "track", "split", "task_id", "task_type", "seed", "variant", "success",
                   "status", "reward", "progress", "steps", "valid_actions", "llm_calls", "tokens_in",
                   "tokens_out", "wall_s", "error", "copy_of")
STEP_COLUMNS = ("action", "observation", "valid", "reward", "progress", "thought", "logprob",
                "tokens_in", "tokens_out")


def trajectories(path: Path) -> list[tuple[list[Any], dict[str, Any]]]:
    """(key, trajectory) of every line of trajectories.jsonl (absent on committed boards)."""
    file = path / TRAJECTORIES
    if not file.is_file():
        return []
    found = []
    for line in file.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            found.append((data.pop("key"), data))
    return found


def store_collection(run: Run) -> str:
    """The store collection the run's method wrote its learned items to."""
    return Settings.of(run.config).store.collection


def _insert_run(db: sqlite3.Connection, run_id: int, run: Run) -> dict[str, int]:
    results, provenance = run.results, run.results.provenance
    db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (
        run_id, str(run.path.resolve()), run.label, run.method, run.preset, run.env,
        results.track, int(results.valid), int(results.limited),
        json.dumps(results.seeds), run.model_id, provenance.arena_version,
        provenance.git_sha, results.started, results.finished,
        json.dumps(results.to_json(), sort_keys=True)))
    for split, summary in results.splits.items():
        low, high = summary.ci95
        db.execute("INSERT INTO splits VALUES (?,?,?,?,?,?,?,?,?,?)", (
            run_id, split, summary.n_tasks, summary.n_episodes, summary.success_rate, low, high,
            summary.progress_rate, summary.valid_action_rate, summary.mean_steps))
    episodes = [record.to_dict() for record in run.episodes or []]
    db.executemany(f"INSERT INTO episodes VALUES ({','.join('?' * (len(EPISODE_COLUMNS) + 3))})", [
        (run_id, *(e.get(c) for c in EPISODE_COLUMNS), json.dumps(e.get("experience_ids", [])),
         json.dumps(e.get("derived_experience_ids", []))) for e in episodes])
    steps = []
    for key, trajectory in trajectories(run.path):
        phase, split, task_id, seed, variant = key
        for number, step in enumerate(trajectory.get("steps", []), start=1):
            steps.append((run_id, phase, split, task_id, seed, variant, number,
                          *(step.get(c) for c in STEP_COLUMNS)))
    db.executemany(f"INSERT INTO steps VALUES ({','.join('?' * (7 + len(STEP_COLUMNS)))})", steps)
    experiences = stored_experiences(run.path / "store", store_collection(run))
    db.executemany("INSERT INTO experiences VALUES (?,?,?,?,?,?,?)", [
        (run_id, e.experience_id, e.kind, e.text, e.provenance.source_split,
         json.dumps(list(e.provenance.source_task_ids)), json.dumps(e.metadata, sort_keys=True, default=str))
        for e in experiences])
    metrics = [(run_id, entry["phase"], entry["step"], name, float(value))
               for entry in read_metrics(run.path) for name, value in sorted(entry["metrics"].items())]
    db.executemany("INSERT INTO metrics VALUES (?,?,?,?,?)", metrics)
    return {"episodes": len(episodes), "steps": len(steps), "experiences": len(experiences),
            "metrics": len(metrics)}


def export_sqlite(run_dirs: list[Path | str], out: Path | str, *, force: bool = False) -> dict[str, int]:
    """Write ``out``, a new SQLite file of ``run_dirs`` (each checked as ``arena leaderboard``
    checks it); the number of rows of each table. An existing ``out`` is kept unless ``force``."""
    if not run_dirs:
        raise ReportError("No runs given: pass one or more run directories.")
    target = Path(out)
    if target.exists() and not force:
        raise ReportError(f"{target} exists; choose another --sqlite file, or pass --force to replace it.")
    runs = [load_run(Path(path)) for path in run_dirs]
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    totals = {"runs": len(runs), "episodes": 0, "steps": 0, "experiences": 0, "metrics": 0}
    db = sqlite3.connect(partial)
    try:
        db.executescript(SCHEMA)
        for run_id, run in enumerate(runs, start=1):
            for table, count in _insert_run(db, run_id, run).items():
                totals[table] += count
        db.commit()
    finally:
        db.close()
    partial.replace(target)  # whole or not at all
    return totals
