"""Reports over finished runs: leaderboards (Markdown, HTML, JSON, plots), paired comparisons,
the viewer (``viewer``), the SQLite and Hugging Face dataset exports (``export``, ``dataset``)
and ``arena verify`` (``verify``: replays a run's frozen evaluation in a fresh process and writes
the run's verification.json, the one file a report writes into a run).

Reads only what runs wrote (results.json, episodes.jsonl, state.json, metrics.jsonl, and for the
viewer and the export trajectories.jsonl and the store); arena.core never imports this package.
"""

from arena.report.aggregate import Row, Table, build_tables, check_compatible
from arena.report.compare import compare_runs
from arena.report.render import write_board
from arena.report.runs import ReportError, Run, load_run, load_runs

__all__ = ["ReportError", "Row", "Run", "Table", "build_tables", "check_compatible", "compare_runs",
           "load_run", "load_runs", "write_board"]
