"""``arena export RUN_DIR... --dataset DIR``: finished runs as a Hugging Face dataset.

Trajectories are shared and reloaded for training as Hugging Face datasets (verl-agent, AgentGym
and SkillRL publish theirs so), so the episodes go out in that form: parquet files written by the
``datasets`` library itself, with their feature types, and a dataset card (README.md, YAML header)
that names the configurations and states the protocol every run was played under.

- ``data/episodes.parquet`` (config ``episodes``): one row an episode of episodes.jsonl (learning
  and evaluation, every variant), with the run's method, preset and model, and where the run kept
  trajectories.jsonl the task's goal, the first observation and every step.
- ``data/learned_items.parquet`` (config ``learned_items``, only where a run's store holds any):
  the items the method learned (memories, skills, insights) as they were at the end of the run.

Load it offline: ``datasets.load_dataset("parquet", data_files="DIR/data/episodes.parquet")``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arena.core.services.store import stored_experiences
from arena.report.aggregate import protocol_of
from arena.report.export import store_collection, trajectories
from arena.report.render import markdown_table
from arena.report.runs import ReportError, Run, load_run

EPISODES, LEARNED_ITEMS = "episodes", "learned_items"
STEP_FIELDS = {"action": "string", "observation": "string", "valid": "bool", "reward": "float64",
               "progress": "float64", "thought": "string"}
EPISODE_FIELDS = {"run": "string", "method": "string", "preset": "string", "model": "string", "env": "string",
                  "track": "string", "phase": "string", "split": "string", "task_id": "string",
                  "task_type": "string", "seed": "int64", "variant": "string", "success": "bool",
                  "status": "string", "reward": "float64", "progress": "float64", "steps": "int64",
                  "valid_actions": "int64", "llm_calls": "int64", "tokens_in": "int64", "tokens_out": "int64",
                  "wall_s": "float64", "error": "string", "copy_of": "string", "goal": "string",
                  "initial_observation": "string"}
ITEM_FIELDS = {"run": "string", "method": "string", "experience_id": "string", "kind": "string", "text": "string",
               "source_split": "string", "metadata": "string"}


def _features(kind: str) -> Any:
    """The columns' types, so a column that is empty in one export keeps its type."""
    from datasets import Features, List, Value

    if kind == EPISODES:
        return Features({**{name: Value(dtype) for name, dtype in EPISODE_FIELDS.items()},
                         "experience_ids": List(Value("string")),
                         "trajectory": List({name: Value(dtype) for name, dtype in STEP_FIELDS.items()})})
    return Features({**{name: Value(dtype) for name, dtype in ITEM_FIELDS.items()},
                     "source_task_ids": List(Value("string"))})


def episode_rows(run: Run) -> list[dict[str, Any]]:
    """Every episode of ``run`` as a dataset row; its steps where trajectories.jsonl has them."""
    played = {tuple(key): trajectory for key, trajectory in trajectories(run.path)}
    rows = []
    for episode in run.episodes or []:
        record = episode.to_dict()
        trajectory = played.get(episode.key, {})
        rows.append({
            **{name: record.get(name) for name in EPISODE_FIELDS},
            "run": run.label, "method": run.method, "preset": run.preset, "model": run.model_id,
            "env": run.env, "goal": trajectory.get("task", {}).get("goal"),
            "initial_observation": trajectory.get("initial_observation"),
            "experience_ids": list(record.get("experience_ids", [])),
            "trajectory": [{name: step.get(name) for name in STEP_FIELDS} for step in trajectory.get("steps", [])],
        })
    return rows


def item_rows(run: Run) -> list[dict[str, Any]]:
    """The items the run's method learned, as its store holds them at the end of the run."""
    return [{"run": run.label, "method": run.method, "experience_id": item.experience_id, "kind": item.kind,
             "text": item.text, "source_split": item.provenance.source_split,
             "source_task_ids": list(item.provenance.source_task_ids),
             "metadata": json.dumps(item.metadata, sort_keys=True, default=str)}
            for item in stored_experiences(run.path / "store", store_collection(run))]


def card(runs: list[Run], counts: dict[str, int]) -> str:
    """The dataset card: the configurations in its YAML header, the protocol of every run below."""
    from huggingface_hub import DatasetCard, DatasetCardData

    configs: list[dict[str, Any]] = [{"config_name": EPISODES, "data_files": f"data/{EPISODES}.parquet",
                                      "default": True}]
    if counts[LEARNED_ITEMS]:
        configs.append({"config_name": LEARNED_ITEMS, "data_files": f"data/{LEARNED_ITEMS}.parquet"})
    header = DatasetCardData(pretty_name="Arena runs: " + ", ".join(sorted({f"{r.method} on {r.env}" for r in runs})),
                             tags=["arena", "agents", "trajectories"], configs=configs)
    lines = [
        "# Arena runs", "",
        f"{counts[EPISODES]} episodes of {len(runs)} run(s) of Arena, the harness that compares "
        "experience-driven LLM-agent methods under one protocol, exported with `arena export --dataset`"
        + (f", and the {counts[LEARNED_ITEMS]} items their methods learned" if counts[LEARNED_ITEMS] else "") + ".",
        "",
        "## Protocol", "",
        "Every run learned on the train split only (phase `learn`), then was evaluated frozen on the test "
        "splits (phase `evaluate`: nothing is learned from a test episode); `success` and `progress` are the "
        "environment's own. A row's `variant` is `default` for the primary result. Runs with a different "
        "protocol below are not comparable; an invalid run's figures are not a result.", "",
    ]
    rows = []
    for run in runs:
        protocol = "; ".join(f"{key} {json.dumps(value) if isinstance(value, list | dict) else value}"
                             for key, value in protocol_of(run).items())
        provenance = run.results.provenance
        cells = [run.label, run.method + (f" ({run.preset})" if run.preset else ""), run.env, run.results.track,
                 "yes" if run.results.valid else "INVALID: " + "; ".join(run.results.violations),
                 ", ".join(map(str, run.seeds)), run.model_id, protocol, provenance.arena_version,
                 provenance.git_sha or "-"]
        rows.append(cells)
    lines += markdown_table(["run", "method", "env", "track", "valid", "seeds", "model", "protocol", "arena", "git"],
                            rows)
    lines += ["", "## Loading", "", "```python", "from datasets import load_dataset", "",
              f'episodes = load_dataset("parquet", data_files="data/{EPISODES}.parquet")["train"]']
    if counts[LEARNED_ITEMS]:
        lines.append(f'items = load_dataset("parquet", data_files="data/{LEARNED_ITEMS}.parquet")["train"]')
    lines += ["```", ""]
    return str(DatasetCard(f"---\n{header.to_yaml()}\n---\n\n" + "\n".join(lines)))


@contextmanager
def folder_export(out: Path | str, option: str, *, force: bool) -> Iterator[Path]:
    """An empty folder to write an export in, moved in place of ``out`` when the block ends
    without an error, so no half-written export is ever left; an existing, non-empty ``out`` is
    kept unless ``force`` (``option`` names the flag in the error)."""
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not force:
        raise ReportError(f"{target} exists; choose another {option} folder, or pass --force to replace it.")
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        partial.replace(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def export_dataset(run_dirs: list[Path | str], out: Path | str, *, force: bool = False) -> dict[str, int]:
    """Write ``out``, a dataset folder of ``run_dirs`` (each checked as ``arena leaderboard``
    checks it); the number of runs, episodes and learned items. An existing, non-empty ``out``
    is kept unless ``force``; the folder is written whole beside it, then moved in place."""
    from datasets import Dataset
    from datasets.utils import disable_progress_bars, enable_progress_bars, is_progress_bar_enabled

    if not run_dirs:
        raise ReportError("No runs given: pass one or more run directories.")
    with folder_export(out, "--dataset", force=force) as partial:
        runs = [load_run(Path(path)) for path in run_dirs]
        tables = {EPISODES: [row for run in runs for row in episode_rows(run)],
                  LEARNED_ITEMS: [row for run in runs for row in item_rows(run)]}
        counts = {"runs": len(runs), **{kind: len(rows) for kind, rows in tables.items()}}
        (partial / "data").mkdir()
        shown = is_progress_bar_enabled()
        disable_progress_bars()  # a bar per file would bury the one line `arena export` prints
        try:
            for kind, rows in tables.items():
                if rows or kind == EPISODES:
                    Dataset.from_list(rows, features=_features(kind)).to_parquet(
                        str(partial / "data" / f"{kind}.parquet"))
            (partial / "README.md").write_text(card(runs, counts))
        finally:
            if shown:
                enable_progress_bars()
    return counts
