"""``arena export RUN_DIR... --inspect DIR``: finished runs as Inspect evaluation logs.

Many agent evaluations are read step by step in inspect_ai's log viewer (``inspect view``), so each
run goes out as Inspect logs, written by inspect_ai's own log API (``inspect_ai.log``), not by hand:
the file format is inspect_ai's to change, and a log it writes is one it reads back.

One sample an episode (the rows of ``arena export --dataset``: episodes.jsonl with the steps of
trajectories.jsonl). Its messages are the task (the first observation, the goal where that does not
state it), then per step the action as the assistant's message and the observation as the user's;
its scores are the environment's ``success`` (1 or 0) and ``progress``. A run's seeds are the log's
epochs. Each run gives up to three logs, so that a log's figures are one thing:

- ``<run>.eval``: the result, the primary variant's evaluation episodes on the test splits;
- ``<run>-learn.eval``: the learning episodes (train split), as the method played them;
- ``<run>-helpers.eval``: the other evaluation-phase episodes (helper variants such as
  ``without_skill``, train tasks played as a test-time source), each sample naming its variant.

The protocol (the fields runs must share to be ranked together), whether the run is valid and its
provenance are the eval's metadata (``log.eval.metadata["arena"]``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from arena.core.contract.results import PRIMARY_VARIANT
from arena.report.aggregate import protocol_of
from arena.report.dataset import episode_rows, folder_export
from arena.report.runs import LEARN as LEARN_PHASE
from arena.report.runs import ReportError, Run, load_run

RESULT, LEARN, HELPERS = "result", "learn", "helpers"
SCORES = ("success", "progress")


def _inspect_log() -> Any:
    """inspect_ai's log module; an error that names the install when it is absent."""
    try:
        import inspect_ai.log
    except ImportError as exc:
        raise ReportError("arena export --inspect needs inspect_ai: pip install -e '.[export]' "
                          "(or bash scripts/install.sh --dev).") from exc
    return inspect_ai.log


def log_of(row: dict[str, Any], run: Run) -> str:
    """Which of the run's logs an episode row goes to: the result, learning, or helpers."""
    if row["phase"] == LEARN_PHASE:
        return LEARN
    if row["split"] in run.eval_splits and row["variant"] == PRIMARY_VARIANT:
        return RESULT
    return HELPERS


def messages(row: dict[str, Any]) -> list[Any]:
    """The episode as a chat: the task, then each action (assistant) and what it saw (user)."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, ContentReasoning, ContentText

    goal, first = row.get("goal") or "", row.get("initial_observation") or ""
    task = first if goal in first else "\n\n".join(part for part in (f"Your task is to: {goal}", first) if part)
    chat: list[Any] = [ChatMessageUser(content=task or "(no observation recorded)", source="input")]
    for number, step in enumerate(row["trajectory"], 1):
        action = step.get("action") or ""
        thought = step.get("thought")
        chat.append(ChatMessageAssistant(
            content=[ContentReasoning(reasoning=thought), ContentText(text=action)] if thought else action,
            model=row["model"], source="generate",
            metadata={"step": number, "valid": step.get("valid")}))
        chat.append(ChatMessageUser(
            content=step.get("observation") or "", source="input",
            metadata={"step": number, "reward": step.get("reward"), "progress": step.get("progress")}))
    return chat


def sample(row: dict[str, Any], sample_id: str, epoch: int) -> Any:
    """One episode as an Inspect sample; every field of its episodes.jsonl line is in its metadata."""
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    chat = messages(row)
    last = (row["trajectory"][-1].get("action") or "") if row["trajectory"] else ""
    outcome = f"{row['status']}" + (f": {row['error']}" if row.get("error") else "")
    usage = ModelUsage(input_tokens=row["tokens_in"] or 0, output_tokens=row["tokens_out"] or 0,
                       total_tokens=(row["tokens_in"] or 0) + (row["tokens_out"] or 0))
    return EvalSample(
        id=sample_id, epoch=epoch, input=chat[0].text, target=row.get("goal") or "", messages=chat,
        output=ModelOutput.from_content(model=row["model"], content=last),
        scores={name: Score(value=score_value(row, name), answer=last, explanation=outcome) for name in SCORES},
        metadata={name: value for name, value in row.items() if name != "trajectory"},
        model_usage={row["model"]: usage}, total_time=row.get("wall_s"), turn_count=len(row["trajectory"]))


def samples(rows: list[dict[str, Any]], seeds: list[int], helper: bool) -> list[Any]:
    """The rows as samples, id ``split:task`` (with ``:variant`` for helpers), epoch the seed's
    place among the run's seeds; an id met twice in an epoch (a task learned twice) gets ``#2``."""
    made, seen = [], set()
    for row in rows:
        base = f"{row['split']}:{row['task_id']}" + (f":{row['variant']}" if helper else "")
        epoch = seeds.index(row["seed"]) + 1 if row["seed"] in seeds else 1
        sample_id, n = base, 1
        while (sample_id, epoch) in seen:
            n += 1
            sample_id = f"{base}#{n}"
        seen.add((sample_id, epoch))
        made.append(sample(row, sample_id, epoch))
    return made


def score_value(row: dict[str, Any], name: str) -> float:
    """An episode's ``success`` (1 or 0) or ``progress``, as a sample's score holds it."""
    return (1.0 if row["success"] else 0.0) if name == "success" else float(row["progress"] or 0.0)


def results(rows: list[dict[str, Any]]) -> Any:
    """Mean success and progress over the samples, overall and per split (the per-split means of
    the result log are results.json's success and progress rates)."""
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore

    groups = {"mean": rows} | {split: [row for row in rows if row["split"] == split]
                               for split in sorted({row["split"] for row in rows})}
    scores = [EvalScore(name=name, scorer=name, scored_samples=len(rows),
                        metrics={metric: EvalMetric(name=metric, value=sum(score_value(row, name) for row in group)
                                                    / max(len(group), 1))
                                 for metric, group in groups.items()})
              for name in SCORES]
    return EvalResults(total_samples=len(rows), completed_samples=len(rows), scores=scores)


def arena_metadata(run: Run, log: str) -> dict[str, Any]:
    """What a reader needs to judge the log: the protocol, the run's validity and provenance."""
    results = run.results
    return {"log": log, "run": run.label, "path": str(run.path.resolve()), "method": run.method,
            "preset": run.preset, "env": run.env, "track": results.track, "valid": results.valid,
            "violations": list(results.violations), "seeds": run.seeds, "protocol": protocol_of(run),
            "solver": results.solver.model_dump(mode="json") if results.solver else None,
            "splits": {split: summary.model_dump(mode="json") for split, summary in results.splits.items()},
            "cost": results.cost.model_dump(mode="json"),
            "provenance": results.provenance.model_dump(mode="json")}


def created(run: Run) -> str:
    """When the run started; for a run that did not record it, when its results.json was written."""
    if run.results.started:
        return run.results.started
    written = datetime.fromtimestamp((run.path / "results.json").stat().st_mtime, tz=UTC)
    return written.strftime("%Y-%m-%dT%H:%M:%SZ")


def eval_log(run: Run, log: str, rows: list[dict[str, Any]]) -> Any:
    """One of the run's logs, whole: its spec, samples, results and stats."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalRevision, EvalSpec, EvalStats
    from inspect_ai.model import ModelUsage

    provenance = run.results.provenance
    name = run.method + (f"/{run.preset}" if run.preset else "")
    task = f"arena/{name}" + ("" if log == RESULT else f"/{log}")
    made = samples(rows, sorted(run.seeds), helper=log == HELPERS)
    # Ids derived from the run, so exporting the same run twice gives the same log.
    digest = hashlib.sha256(json.dumps([str(run.path.resolve()), run.results.finished, log]).encode()).hexdigest()
    sha = (provenance.git_sha or "").removesuffix("-dirty")
    phase_cost = run.results.cost.learn if log == LEARN else run.results.cost.evaluate
    spec = EvalSpec(
        eval_id=digest[:22], run_id=digest[22:44], task_id=digest[44:], created=created(run), task=task,
        task_display_name=f"{name} on {run.env}" + ("" if log == RESULT else f" ({log})"),
        task_description=f"Arena run {run.label}: {len(made)} {log} episode(s), exported by arena export --inspect",
        dataset=EvalDataset(name=run.env, samples=len(made), sample_ids=sorted({s.id for s in made})),
        model=run.model_id, config=EvalConfig(epochs=len(run.seeds), limit=run.config.get("eval", {}).get("limit")),
        revision=EvalRevision(type="git", origin="", commit=sha, dirty=(provenance.git_sha or "").endswith("-dirty"))
        if sha else None,
        packages={"arena": provenance.arena_version,
                  **{name: version for name, version in provenance.packages.items() if version}},
        tags=[run.method, run.env, run.results.track] + ([] if run.results.valid else ["invalid"]),
        metadata={"arena": arena_metadata(run, log)})
    usage = ModelUsage(input_tokens=phase_cost.tokens_in, output_tokens=phase_cost.tokens_out,
                       total_tokens=phase_cost.tokens_in + phase_cost.tokens_out)
    return EvalLog(status="success", eval=spec, samples=made, results=results(rows),
                   stats=EvalStats(started_at=run.results.started or "", completed_at=run.results.finished or "",
                                   model_usage={run.model_id: usage}),
                   tags=list(spec.tags or []))


def run_logs(run: Run) -> dict[str, Any]:
    """The run's logs by kind (result, learn, helpers); a kind without episodes has none."""
    if run.episodes is None:
        raise ReportError(f"{run.path} has no episodes.jsonl: an Inspect log is made of the episodes. "
                          "Export a run directory as the harness wrote it.")
    grouped: dict[str, list[dict[str, Any]]] = {RESULT: [], LEARN: [], HELPERS: []}
    for row in episode_rows(run):
        grouped[log_of(row, run)].append(row)
    return {log: eval_log(run, log, rows) for log, rows in grouped.items() if rows or log == RESULT}


def export_inspect(run_dirs: list[Path | str], out: Path | str, *, force: bool = False) -> dict[str, int]:
    """Write ``out``, a folder of Inspect logs of ``run_dirs`` (each checked as ``arena leaderboard``
    checks it); the number of runs, logs and samples. An existing, non-empty ``out`` is kept unless
    ``force``; the folder is written whole beside it, then moved in place."""
    log_api = _inspect_log()
    if not run_dirs:
        raise ReportError("No runs given: pass one or more run directories.")
    counts = {"runs": len(run_dirs), "logs": 0, "samples": 0}
    names: dict[str, int] = {}
    with folder_export(out, "--inspect", force=force) as partial:
        for run in [load_run(Path(path)) for path in run_dirs]:
            names[run.label] = names.get(run.label, 0) + 1
            stem = run.label if names[run.label] == 1 else f"{run.label}-{names[run.label]}"  # two runs, one name
            for log, made in run_logs(run).items():
                log_api.write_eval_log(made, str(partial / f"{stem}{'' if log == RESULT else '-' + log}.eval"))
                counts["logs"] += 1
                counts["samples"] += len(made.samples or [])
    return counts
