"""The tables of an Evolving-RL ablation page, computed from the arms' committed small files.

    python scripts/evolving_rl_ablation_tables.py COEVOLVE_RUN [SOLVER_ONLY_RUN EXTRACTOR_ONLY_RUN ...]

Prints two Markdown tables, the first arm being the co-evolution arm every other is paired with:

* **per learning iteration** (each arm's ``metrics.jsonl``): source episodes won, the share of
  extracted cards that were usable (parsed into a card the solver is shown), the downstream
  episodes won with them, the extractor's mean reward, the samples trained on and the validation
  success where the run measured it;
* **paired at test** (``arena compare``'s statistics, exact McNemar over the same (task, seed)
  pairs): every arm with its card against its own episode without it (variant
  ``without_skill``), and every other arm against the co-evolution arm.

The ablation pages paste this output between their ``<!-- tables: ... -->`` markers;
``tests/test_boards.py`` runs it again on the committed arms and compares, so a page cannot drift
from its episodes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from arena.report import Run, compare_runs, load_run
from arena.report.render import markdown_table

WITHOUT_CARD = "without_skill"
ITERATION_COLUMNS = ["Arm", "Iteration", "Source episodes won", "Cards usable", "Downstream won",
                     "Extractor reward", "Samples trained", "Valid success"]
PAIRED_COLUMNS = ["Arm", "Against", "Split", "Success A / B", "A only / B only", "p (exact paired)"]


def arm_name(run: Run) -> str:
    """The arm a run is, from the roles it trained (``method.train_extractor`` and
    ``method.train_solver``, which the presets solver_only and extractor_only set), else its mode."""
    method = run.config.get("method", {})
    if method.get("train_extractor", True) is False:
        return "solver_only"
    if method.get("train_solver", True) is False:
        return "extractor_only"
    return str(method.get("mode", "coevolve"))


def _share(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.0f} %"


def _number(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3g}"


def iteration_rows(run: Run) -> list[list[str]]:
    rows = []
    for entry in run.metrics:
        if entry["phase"] != "learn":
            continue
        m = entry["metrics"]
        trained = m.get("samples", 0) - m.get("samples_dropped", 0)
        rows.append([arm_name(run), str(entry["step"]), _share(m.get("source_success")),
                     _share(m.get("skills_usable")), _share(m.get("downstream_success")),
                     _number(m.get("extractor_reward")), str(int(trained)), _share(m.get("valid_success"))])
    return rows


def _paired_row(arm: str, against: str, split: dict[str, Any]) -> list[str]:
    pairs = split["pairs"]
    won_a, won_b = round(split["success_a"] * pairs), round(split["success_b"] * pairs)
    return [arm, against, split["split"], f"{won_a}/{pairs} / {won_b}/{pairs}",
            f"{split['a_only']} / {split['b_only']}", f"{split['p_value']:.3g}"]


def paired_rows(arms: list[Run]) -> list[list[str]]:
    rows = []
    for run in arms:
        for split in compare_runs(run, None, WITHOUT_CARD)["splits"]:
            rows.append(_paired_row(arm_name(run), f"{arm_name(run)} without its card", split))
    first = arms[0]
    for run in arms[1:]:
        for split in compare_runs(run, first)["splits"]:
            rows.append(_paired_row(arm_name(run), arm_name(first), split))
    return rows


def tables(paths: list[Path]) -> str:
    arms = [load_run(path) for path in paths]
    lines = ["Per learning iteration (metrics.jsonl):", ""]
    lines += markdown_table(ITERATION_COLUMNS, [row for run in arms for row in iteration_rows(run)])
    lines += ["", "Paired at test (exact McNemar over the same tasks and seeds):", ""]
    lines += markdown_table(PAIRED_COLUMNS, paired_rows(arms))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="the co-evolution arm first, then the other arms")
    args = parser.parse_args(argv)
    sys.stdout.write(tables(args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
