"""``arena view RUN_DIR...``: browse what agents did, in a local read-only web page.

A small HTTP server on 127.0.0.1 (the standard library's ``http.server``) rather than one
self-contained HTML file: a recorded trajectory of 30 household steps is about 7.7 kB, so a run
of 10,000 episodes holds some 77 MB of trajectories, too much to put in one page. The server keeps
an index of each run's episodes (from episodes.jsonl, chain-checked as every report does) and the
byte offset of each trajectory in trajectories.jsonl, and sends one trajectory when it is opened.

Pages and data: ``/`` the viewer; ``/api/runs``; ``/api/episodes?run=N``; ``/api/trajectory?run=N
&episode=I``; ``/api/pair?a=N&b=M`` (episodes of two runs matched on split, task, seed and variant,
the pairs ``arena compare`` tests); ``/api/metrics?run=N`` (metrics.jsonl, the learning curves).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from arena.core.contract.settings import Settings
from arena.core.services.store import stored_experiences
from arena.core.storage.metrics import read_metrics
from arena.core.storage.rundir import TRAJECTORIES
from arena.report.runs import ReportError, Run, load_run

#: The page (HTML, CSS and script in one file, no network): ``viewer.html`` beside this module.
PAGE = (Path(__file__).with_name("viewer.html")).read_text()

EPISODE_FIELDS = ("phase", "split", "task_id", "task_type", "seed", "variant", "status", "success",
                  "steps", "progress", "valid_actions", "llm_calls", "error")


@dataclass
class ViewedRun:
    """One run as the viewer serves it: its episodes, where their trajectories are, its metrics."""

    run: Run
    episodes: list[dict[str, Any]]
    offsets: dict[tuple, int]
    metrics: list[dict[str, Any]]
    experiences: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, path: Path | str) -> ViewedRun:
        run = load_run(Path(path))
        if run.episodes is None:
            raise ReportError(f"{path} has no episodes.jsonl: nothing to view.")
        offsets: dict[tuple, int] = {}
        file = run.path / TRAJECTORIES
        if file.is_file():
            with file.open("rb") as handle:
                position = 0
                for raw in handle:
                    if raw.strip():
                        offsets[_line_key(raw)] = position
                    position += len(raw)
        episodes = []
        for index, record in enumerate(run.episodes):
            row = {name: getattr(record, name) for name in EPISODE_FIELDS}
            row["index"] = index
            row["has_trajectory"] = record.key in offsets
            episodes.append(row)
        return cls(run=run, episodes=episodes, offsets=offsets, metrics=read_metrics(run.path))

    def summary(self, number: int) -> dict[str, Any]:
        results = self.run.results
        return {"run": number, "label": self.run.label, "path": str(self.run.path), "method": self.run.method,
                "env": self.run.env, "model": self.run.model_id, "track": results.track,
                "valid": results.valid, "seeds": results.seeds,
                "episodes": len(self.episodes),
                "splits": {s: {"success_rate": v.success_rate, "ci95": list(v.ci95), "n_episodes": v.n_episodes}
                           for s, v in results.splits.items()}}

    def trajectory(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self.episodes):
            raise KeyError(f"episode {index} is not in {self.run.label} (0 to {len(self.episodes) - 1})")
        record = self.run.episodes[index]  # type: ignore[index]
        offset = self.offsets.get(record.key)
        if offset is None:
            return {"episode": self.episodes[index], "trajectory": None,
                    "note": "no trajectory recorded (a committed board keeps episodes.jsonl only)"}
        with (self.run.path / TRAJECTORIES).open("rb") as handle:
            handle.seek(offset)
            trajectory = json.loads(handle.readline())
        trajectory.pop("key", None)
        shown = list(trajectory.get("experience_ids", []))
        return {"episode": self.episodes[index], "trajectory": trajectory,
                "experiences": [self._experience(i) for i in shown]}

    def _experience(self, experience_id: str) -> dict[str, Any]:
        """What the prompt carried: the stored experience, or a note that it was made at test time."""
        with self._lock:
            if not self.experiences and (self.run.path / "store").is_dir():
                name = Settings.of(self.run.config).store.collection
                for e in stored_experiences(self.run.path / "store", name):
                    self.experiences[e.experience_id] = {"id": e.experience_id, "kind": e.kind, "text": e.text,
                                                         "source_split": e.provenance.source_split}
        return self.experiences.get(experience_id, {
            "id": experience_id, "kind": "derived", "text": "(not in the store: made at test time, e.g. a skill "
                                                            "card extracted from a train episode)"})


def _line_key(raw: bytes) -> tuple:
    """The ``key`` of one trajectories.jsonl line, parsing only the key where it can (a 30-step
    line is ~7.7 kB, its key ~60 bytes), else the whole line."""
    start = raw.find(b'"key": [')
    if start > 0 and raw[start - 1:start] != b"\\":
        end = raw.find(b"]", start)
        try:
            return tuple(json.loads(raw[start + 7:end + 1]))
        except json.JSONDecodeError:
            pass
    return tuple(json.loads(raw)["key"])


def pairs(a: ViewedRun, b: ViewedRun) -> list[dict[str, Any]]:
    """Evaluation episodes of ``a`` and ``b`` on the same split, task, seed and variant."""
    def keyed(viewed: ViewedRun) -> dict[tuple, dict[str, Any]]:
        return {(e["split"], e["task_id"], e["seed"], e["variant"]): e
                for e in viewed.episodes if e["phase"] == "evaluate"}

    left, right = keyed(a), keyed(b)
    return [{"split": k[0], "task_id": k[1], "seed": k[2], "variant": k[3], "task_type": left[k]["task_type"],
             "a": {"index": left[k]["index"], "success": left[k]["success"], "steps": left[k]["steps"]},
             "b": {"index": right[k]["index"], "success": right[k]["success"], "steps": right[k]["steps"]}}
            for k in sorted(set(left) & set(right))]


class Viewer:
    """The runs being viewed, and the answers to the page's requests."""

    def __init__(self, run_dirs: list[Path | str]) -> None:
        if not run_dirs:
            raise ReportError("No runs given: pass one or more run directories.")
        self.runs = [ViewedRun.load(path) for path in run_dirs]

    def answer(self, url: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``url``."""
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            if parts.path in ("/", "/index.html"):
                return 200, "text/html; charset=utf-8", PAGE.encode()
            if parts.path == "/favicon.ico":  # browsers ask; there is none
                return 204, "image/x-icon", b""
            if parts.path == "/api/runs":
                return self._json([viewed.summary(n) for n, viewed in enumerate(self.runs)])
            if parts.path == "/api/episodes":
                return self._json(self._run(query, "run").episodes)
            if parts.path == "/api/trajectory":
                return self._json(self._run(query, "run").trajectory(int(query.get("episode", "-1"))))
            if parts.path == "/api/pair":
                return self._json(pairs(self._run(query, "a"), self._run(query, "b")))
            if parts.path == "/api/metrics":
                return self._json(self._run(query, "run").metrics)
        except (KeyError, ValueError) as exc:
            return 404, "application/json", json.dumps({"error": str(exc).strip("'\"")}).encode()
        return 404, "application/json", json.dumps({"error": f"no page {parts.path}"}).encode()

    def _run(self, query: dict[str, str], name: str) -> ViewedRun:
        number = int(query.get(name, "-1"))
        if not 0 <= number < len(self.runs):
            raise KeyError(f"run {number} is not being viewed (0 to {len(self.runs) - 1})")
        return self.runs[number]

    @staticmethod
    def _json(data: Any) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(data, default=str).encode()


def make_server(viewer: Viewer, port: int = 0) -> ThreadingHTTPServer:
    """The server on 127.0.0.1 (``port`` 0: a free one); ``server.server_address`` says which."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, kind, body = viewer.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the terminal shows the URL only
            return

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)
