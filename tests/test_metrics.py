"""metrics.jsonl: what run.log_metrics accepts, and how readers merge a step logged twice."""

from __future__ import annotations

import pytest

from arena.core.storage.metrics import METRICS, MetricsLog, read_metrics


def test_steps_merge_and_a_later_figure_wins(tmp_path) -> None:
    log = MetricsLog(tmp_path)
    log.log("learn", 1, {"success": 0.25, "loss": 2.0})
    log.log("learn", 2, {"success": 0.5})
    log.log("learn", 1, {"success": 0.3, "valid_success": 0.1})  # step 1 done again after a resume
    log.log("evaluate", 0, {"cards_usable": True})
    (tmp_path / METRICS).open("a").write('{"phase": "learn", "step": 3, "metr')  # torn by a kill
    assert read_metrics(tmp_path) == [
        {"phase": "evaluate", "step": 0, "metrics": {"cards_usable": True}},
        {"phase": "learn", "step": 1, "metrics": {"success": 0.3, "loss": 2.0, "valid_success": 0.1}},
        {"phase": "learn", "step": 2, "metrics": {"success": 0.5}},
    ]


def test_small_figures_keep_six_significant_digits(tmp_path) -> None:
    """An lr of 1e-6 and a tiny gradient norm stay what they are; long decimals are shortened."""
    MetricsLog(tmp_path).log("learn", 1, {"lr": 1e-6, "grad_norm": 3.14159265e-7, "loss": 0.123456789,
                                          "samples": 12})
    (entry,) = read_metrics(tmp_path)
    assert entry["metrics"] == {"lr": 1e-6, "grad_norm": 3.14159e-7, "loss": 0.123457, "samples": 12}


@pytest.mark.parametrize(("step", "metrics", "message"), [
    (-1, {"x": 1}, "step must be an int >= 0"),
    (1.5, {"x": 1}, "step must be an int >= 0"),
    (1, {"x": "high"}, "metric 'x' must be a finite number or a flag"),
    (1, {"x": float("nan")}, "metric 'x' must be a finite number"),
    (1, {"": 1}, "metric names are non-empty strings"),
])
def test_what_is_not_a_figure_is_refused_naming_it(tmp_path, step, metrics, message) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        MetricsLog(tmp_path).log("learn", step, metrics)
    assert read_metrics(tmp_path) == []
