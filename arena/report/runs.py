"""Reading finished runs for reports, strictly read-only.

``RunDir.load_episodes`` repairs a torn file (it is the resume path); a report must never change a
run it reads, so episode lines are parsed here without touching the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arena.core import integrity
from arena.core.metrics import read_metrics
from arena.core.results import ResultsError
from arena.core.results import validate as validate_results
from arena.core.rundir import (
    CONFIG,
    EPISODES,
    RESULTS,
    STATE,
    TRAJECTORIES,
    RunDirError,
    read_json,
    read_jsonl,
    unfinished_message,
)
from arena.core.types import EpisodeResult

PRIMARY_VARIANT = "default"  # the protocol's primary variant (arena.core.protocol.PRIMARY_VARIANT)
EVALUATE = "evaluate"
LEARN = "learn"


class ReportError(ValueError):
    """Runs that cannot be reported as asked; the message names the runs and the fix."""


@dataclass
class Run:
    """One finished run: its results plus, where recorded, its episodes and state."""

    path: Path
    results: dict[str, Any]
    episodes: list[EpisodeResult] | None = None  # None: no episodes.jsonl beside results.json
    state: dict[str, Any] = field(default_factory=dict)
    #: The run's logged curves (``metrics.jsonl``: ``run.log_metrics``), merged per step.
    metrics: list[dict[str, Any]] = field(default_factory=list)
    #: episodes.jsonl's lines are chained and end where results.json says (False: a run made
    #: before Arena chained its records, shown as such on a board).
    chained: bool = True
    #: The run's verification.json (``arena verify``) where it has one of this very record.
    verification: dict[str, Any] | None = None

    @property
    def verification_status(self) -> str:
        """``verified`` or ``unverified`` as ``arena verify`` last found (a run it could not
        verify, or never checked, is ``not verified``)."""
        status = (self.verification or {}).get("status")
        return str(status) if status in ("verified", "unverified") else "not verified"

    @property
    def label(self) -> str:
        return self.path.name

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.results.get("provenance", {}).get("config", {}))

    @property
    def method(self) -> str:
        return str(self.results["method"])

    @property
    def env(self) -> str:
        return str(self.results["env"])

    @property
    def preset(self) -> str | None:
        preset = self.config.get("method", {}).get("preset")
        return None if preset is None else str(preset)

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.results.get("provenance", {}).get("model", {}))

    @property
    def model_id(self) -> str:
        return str(self.model.get("id", "unknown"))

    @property
    def called_model(self) -> bool:
        """Whether any prompt reached the model (the random policy sends none)."""
        cost = self.results.get("cost", {})
        return any(cost.get(phase, {}).get("tokens_in") for phase in (LEARN, EVALUATE))

    @property
    def model_dtype(self) -> str | None:
        """The dtype the model actually ran in (``llm.dtype=auto`` resolves per machine); None
        where the run records none or never called the model."""
        dtype = self.model.get("dtype")
        return str(dtype) if self.called_model and dtype is not None else None

    @property
    def seeds(self) -> list[int]:
        return [int(s) for s in self.results.get("seeds", [])]

    @property
    def eval_splits(self) -> list[str]:
        return list(self.results.get("splits", {}))

    def evaluated(self, variant: str = PRIMARY_VARIANT) -> list[EpisodeResult]:
        """Test episodes of one variant, as results.json counts them (evaluated splits only)."""
        if self.episodes is None:
            raise ReportError(
                f"{self.path} has no {EPISODES}: per-task data is needed here. Keep episodes.jsonl "
                "beside results.json (the leaderboard stores both)."
            )
        splits = set(self.eval_splits)
        return [r for r in self.episodes
                if r.phase == EVALUATE and r.split in splits and r.variant == variant]

    def learn_episodes(self) -> list[EpisodeResult]:
        return [r for r in self.episodes or [] if r.phase == LEARN]

    def variants(self) -> list[str]:
        """Variants evaluated on the test splits besides the primary (e.g. ``without_skill``)."""
        names: set[str] = set()
        for summary in self.results.get("splits", {}).values():
            names.update(summary.get("variants", {}))
        return sorted(names)


def read_episode_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file; a torn last line is ignored, the file left as is."""
    return read_jsonl(path, repair=False)


def load_run(path: Path | str, verification: bool = True) -> Run:
    """A run directory (or its results.json). Refuses unfinished runs, naming the fix.
    ``verification``: read its verification.json too (``arena verify`` itself does not)."""
    path = Path(path)
    if path.is_file() and path.name == RESULTS:
        path = path.parent
    results_file = path / RESULTS
    if not results_file.is_file():
        if (path / CONFIG).exists():
            raise ReportError(unfinished_message(path))
        raise ReportError(f"{path} has no {RESULTS}: pass a folder that `arena run` wrote "
                          "(it holds results.json).")
    try:
        results = read_json(results_file, "its results")
        lines = read_episode_lines(path / EPISODES) if (path / EPISODES).is_file() else None
        state = read_json(path / STATE, "its state") if (path / STATE).is_file() else {}
        metrics = read_metrics(path)
    except RunDirError as exc:
        raise ReportError(str(exc)) from exc
    try:
        validate_results(results, str(results_file))
    except ResultsError as exc:
        raise ReportError(str(exc)) from exc
    episodes = None
    chained = False
    if lines is not None:
        chained = check_record(path, lines, results.get("record"))
        episodes = [EpisodeResult.from_dict(r) for r in lines]
    from arena.report.verify import VerifyError, read_verification

    try:
        verified = read_verification(path, (results.get("record") or {}).get("head")) if verification else None
    except VerifyError as exc:
        raise ReportError(str(exc)) from exc
    return Run(path=path, results=results, episodes=episodes, state=state, metrics=metrics,
               chained=chained, verification=verified)


def check_record(path: Path, lines: list[dict[str, Any]], record: dict[str, Any] | None) -> bool:
    """Check episodes.jsonl's chain (and its trajectories and MACs where they can be checked)
    against results.json's ``record``; True if chained, False for a run from before chaining.
    A broken chain, or one that does not end where results.json says, is a ReportError."""
    episodes_file = path / EPISODES
    trajectories_file = path / TRAJECTORIES
    trajectories = trajectories_file.read_bytes().splitlines() if trajectories_file.is_file() else None
    try:
        report = integrity.verify(lines, episodes_file, trajectories=trajectories,
                                  key=integrity.record_key(create=False),
                                  expected_key_id=(record or {}).get("key_id"),
                                  breaks=set((record or {}).get("breaks", [])))
    except integrity.RecordError as exc:
        raise ReportError(str(exc)) from exc
    if record is None:
        if report.chained:
            raise ReportError(f"{path / RESULTS} has no record of its episodes' chain while "
                              f"{EPISODES} is chained: results.json was replaced.")
        return False
    if not report.chained or report.head != record.get("head") or report.lines != record.get("episodes"):
        raise ReportError(f"{episodes_file} does not end where {path / RESULTS} says it does "
                          f"({record.get('episodes')} lines): lines were added, dropped or the file "
                          "was replaced. The run cannot be trusted.")
    return True


def load_runs(paths: list[Path | str]) -> list[Run]:
    runs = [load_run(p) for p in paths]
    seen: dict[Path, Path] = {}
    for run in runs:
        resolved = run.path.resolve()
        if resolved in seen:
            raise ReportError(f"{run.path} is given twice; each run counts once.")
        seen[resolved] = run.path
    return runs
