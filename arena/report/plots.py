"""The board's figures as PNG bytes (matplotlib's Agg canvas: no display, no pyplot state)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from arena.report.aggregate import Row, Table, trailing_mean

SPLIT_MARKERS = {"test_seen": "o", "test_unseen": "s"}


@dataclass
class Plot:
    name: str  # file stem, e.g. "household-success-vs-cost"
    title: str
    png: bytes


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    # No "Software" entry: the same board rebuilt with another matplotlib gives the same bytes.
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return buffer.getvalue()


def _label(row: Row) -> str:
    return f"{row.name} / {row.model}"


def _error(summary: dict) -> tuple[float, float]:
    low, high = summary["ci95"]
    rate = float(summary["success_rate"])
    return (max(0.0, rate - low), max(0.0, high - rate))


def _annotate_apart(axes: Any, points: list[tuple[str, float, float]], fontsize: int = 7) -> None:
    """Label points without overlapping labels: left to right, each label goes to the first
    height above its point where it clears the labels placed so far (a leader line joins a
    lifted label to its point). Rows of equal cost and success are common (every method at 0 %)."""
    figure = axes.get_figure()
    if not hasattr(figure.canvas, "get_renderer"):
        FigureCanvasAgg(figure)  # measure text as the PNG will draw it
    renderer = figure.canvas.get_renderer()
    axes.autoscale_view()
    gap = 4.0
    placed: list[Any] = []
    for text, x, y in sorted(points, key=lambda p: (p[1], p[2], p[0])):
        lift = gap
        while True:
            label = axes.annotate(text, (x, y), xytext=(gap, lift), textcoords="offset pixels",
                                  fontsize=fontsize, va="bottom")
            box = label.get_window_extent(renderer).expanded(1.0, 1.1)
            if not any(box.overlaps(other) for other in placed):
                break
            label.remove()
            lift += box.height
        if lift > gap:  # redraw with a leader line to its point
            label.remove()
            label = axes.annotate(text, (x, y), xytext=(gap, lift), textcoords="offset pixels",
                                  fontsize=fontsize, va="bottom",
                                  arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"})
        placed.append(box)


def success_vs_cost(table: Table) -> Plot:
    figure = Figure(figsize=(7.5, 4.2))
    axes = figure.add_subplot()
    for split in table.splits:
        xs, ys, low, high = [], [], [], []
        for row in table.rows:
            summary = row.splits.get(split)
            if summary is None:
                continue
            xs.append(float(row.cost["learn_tokens"]))
            ys.append(float(summary["success_rate"]))
            below, above = _error(summary)
            low.append(below)
            high.append(above)
        axes.errorbar(xs, ys, yerr=[low, high], fmt=SPLIT_MARKERS.get(split, "^"), capsize=3,
                      label=split, alpha=0.85)
    axes.set_xscale("symlog", linthresh=1000)  # base methods learn with 0 tokens
    axes.set_ylim(-0.02, 1.02)
    models = {row.model for row in table.rows}
    _annotate_apart(axes, [(row.name if len(models) == 1 else _label(row), float(row.cost["learn_tokens"]),
                            row.mean_over_splits("success_rate")) for row in table.rows])
    axes.set_xlabel("learning tokens per run (symlog)")
    axes.set_ylabel("test success (95 % CI)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    model = f" ({next(iter(models))})" if len(models) == 1 else ""
    axes.set_title(f"{table.env}: success vs learning cost{model}", fontsize=10)
    return Plot(f"{table.env}-success-vs-cost", "Success vs learning cost", _png(figure))


def task_type_bars(table: Table) -> Plot:
    types = table.task_types
    splits = [s for s in table.splits if types.get(s)]
    figure = Figure(figsize=(max(6.0, 1.6 * sum(len(types[s]) for s in splits)), 4.2))
    widths = [max(1, len(types[s])) for s in splits]
    grid = figure.add_gridspec(1, max(1, len(splits)), width_ratios=widths or [1])
    n_rows = max(1, len(table.rows))
    width = 0.8 / n_rows
    for index, split in enumerate(splits):
        axes = figure.add_subplot(grid[0, index])
        for r, row in enumerate(table.rows):
            by_type = row.splits.get(split, {}).get("by_task_type", {})
            positions, heights, low, high = [], [], [], []
            for t, name in enumerate(types[split]):
                if name not in by_type:
                    continue
                positions.append(t - 0.4 + width * (r + 0.5))
                heights.append(float(by_type[name]["success_rate"]))
                below, above = _error(by_type[name])
                low.append(below)
                high.append(above)
            axes.bar(positions, heights, width=width * 0.95, yerr=[low, high], capsize=2,
                     label=_label(row) if index == 0 else None)
        axes.set_xticks(range(len(types[split])))
        axes.set_xticklabels([name.replace("_", " ") for name in types[split]], rotation=25,
                             ha="right", fontsize=7)
        axes.set_ylim(0, 1.05)
        axes.set_title(split, fontsize=9)
        axes.grid(axis="y", alpha=0.3)
        if index == 0:
            axes.set_ylabel("success (95 % CI)")
    if table.rows:
        figure.legend(fontsize=7, loc="upper center", ncol=min(3, len(table.rows)),
                      bbox_to_anchor=(0.5, 1.08))
    return Plot(f"{table.env}-task-types", "Success per task type", _png(figure))


#: A per-episode outcome curve longer than this is drawn as its rolling mean: 0/1 spikes say
#: nothing about a trend.
OUTCOME_POINTS_SMOOTHED = 20


def curve_to_draw(name: str, points: list[list[float]]) -> tuple[str, list[float], list[float]]:
    """(label, xs, ys) of one logged curve: a long curve of 0/1 outcomes (a memory method's
    per-episode success) becomes its trailing rolling mean over a tenth of its points."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if len(ys) <= OUTCOME_POINTS_SMOOTHED or any(y not in (0.0, 1.0) for y in ys):
        return name, xs, ys
    window = max(2, len(ys) // 10)
    return f"{name} (rolling mean of {window})", xs, trailing_mean(ys, window)


def learning_curve_plot(table: Table) -> Plot | None:
    """One panel per row that recorded its learning; None when no row did."""
    rows = [row for row in table.rows if row.learning_curves]
    if not rows:
        return None
    figure = Figure(figsize=(6.5, 3.0 * len(rows)))
    for index, row in enumerate(rows):
        axes = figure.add_subplot(len(rows), 1, index + 1)
        for run_label, curves in row.learning_curves.items():
            for name, points in curves.items():
                label, xs, ys = curve_to_draw(name, points)
                axes.plot(xs, ys, marker="." if len(points) < 30 else None,
                          label=f"{label} [{run_label}]" if len(row.learning_curves) > 1 else label)
        axes.set_title(_label(row), fontsize=9)
        axes.set_xlabel("iteration / learning episode")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.tight_layout()
    return Plot(f"{table.env}-learning-curves", "Learning curves", _png(figure))


def table_plots(table: Table) -> list[Plot]:
    plots = [success_vs_cost(table), task_type_bars(table)]
    curves = learning_curve_plot(table)
    if curves is not None:
        plots.append(curves)
    return plots
