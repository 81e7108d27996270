"""`arena compare`: the paired test and interval on constructed pairs, refusal of unmatched pairs,
and comparisons of real runs (two runs, and a run's variant against its primary result)."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core.contract.types import EpisodeResult
from arena.report import ReportError, Run, compare_runs, load_run
from arena.report.compare import bootstrap_ci, compare_split, sign_flip_p_value
from tests.helpers.reports import make_run, report_plugins, scripted_success
from tests.helpers.results import made_up_results


def exact_mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar by its textbook formula: 2 * P(X <= min(b, c)), X ~ Bin(b + c, 1/2)."""
    n = b + c
    return min(1.0, 2 * sum(comb(n, k) for k in range(min(b, c) + 1)) / 2**n) if n else 1.0


def test_sign_flip_is_exact_mcnemar_with_one_seed():
    # b = 5, c = 0: 2 / 32 = 0.0625; b = 6, c = 1: 2 * (1 + 7) / 128 = 0.125; b = c: 1
    assert sign_flip_p_value([1] * 5) == pytest.approx(0.0625)
    assert sign_flip_p_value([1] * 6 + [-1] + [0] * 20) == pytest.approx(0.125)
    assert sign_flip_p_value([1, 1, -1, -1, 0]) == 1.0
    for b, c in ((9, 2), (14, 5), (3, 11), (30, 18)):
        assert sign_flip_p_value([1] * b + [-1] * c + [0] * 7) == pytest.approx(exact_mcnemar(b, c))


def test_sign_flip_over_tasks_with_several_seeds_by_hand():
    # per-task summed differences (2 seeds): [2, 1, 0] -> T = 3; flips give +-2 +-1 = {3, 1, -1, -3}
    assert sign_flip_p_value([2, 1, 0]) == pytest.approx(0.5)
    # [2, -1, 1] -> T = 2; +-2 +-1 +-1 = {4, 2, 2, 0, 0, -2, -2, -4}: six of eight reach |2|
    assert sign_flip_p_value([2, -1, 1]) == pytest.approx(0.75)
    assert sign_flip_p_value([0, 0]) == 1.0


def test_bootstrap_interval():
    differences, weights = np.array([1, 1, 1, 1]), np.array([1, 1, 1, 1])
    assert bootstrap_ci(differences, weights) == (1.0, 1.0)  # A wins every pair
    mixed = np.array([1, 0, 0, -1, 1, 1, 0, 0, 1, 0])
    low, high = bootstrap_ci(mixed, np.ones(10, dtype=int))
    assert low < 0.3 < high and (low, high) == bootstrap_ci(mixed, np.ones(10, dtype=int))  # seeded
    wide = bootstrap_ci(mixed[:5], np.ones(5, dtype=int))
    assert wide[1] - wide[0] > high - low  # fewer tasks, wider interval


def test_compare_split_on_constructed_pairs():
    # 8 tasks, one seed: A wins 4 alone, B 1 alone, 3 ties -> difference (4 - 1) / 8 = 0.375
    pairs = [(f"t{i}", 0, a, b) for i, (a, b) in enumerate(
        [(True, False)] * 4 + [(False, True)] + [(True, True)] * 2 + [(False, False)])]
    result = compare_split("test_seen", pairs)
    assert (result.pairs, result.tasks, result.a_only, result.b_only) == (8, 8, 4, 1)
    assert (result.success_a, result.success_b, result.difference) == (0.75, 0.375, 0.375)
    assert result.p_value == pytest.approx(exact_mcnemar(4, 1)) == pytest.approx(0.375)
    assert result.ci95[0] <= 0.375 <= result.ci95[1]
    tie = compare_split("test_seen", [(f"t{i}", 0, True, True) for i in range(3)])
    assert tie.difference == 0.0 and tie.p_value == 1.0 and tie.ci95 == (0.0, 0.0) and "no discordant" in tie.note
    # a very small p keeps its significant digits (28 tasks won by A alone: p = 2 / 2**28)
    decisive = compare_split("test_seen", [(f"t{i}", 0, True, False) for i in range(28)])
    assert decisive.p_value == pytest.approx(exact_mcnemar(28, 0), rel=1e-3) and decisive.p_value > 0


def _run(label: str, keys: list[tuple[str, int]], success: bool) -> Run:
    records = [EpisodeResult(phase="evaluate", track="frozen", task_id=task, split="test_seen", task_type="t",
                             seed=seed, success=success, reward=0.0, progress=0.0, steps=1, valid_actions=1,
                             status="x", tokens_in=0, tokens_out=0, llm_calls=0, wall_s=0.0, experience_ids=[])
               for task, seed in keys]
    return Run(path=Path(label), results=made_up_results(), episodes=records)


def test_refuses_unmatched_pairs_counting_them():
    keys = [(f"t{i}", s) for i in range(3) for s in (0, 1)]
    with pytest.raises(ReportError, match=r"test_seen: b lacks 2 of the 6 \(task, seed\) pairs of a \(e.g. t2 seed 0\)"):
        compare_runs(_run("a", keys, True), _run("b", keys[:4], False))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    plugins = report_plugins()
    return {
        "a": make_run(plugins, root, "scripted-a", seeds=(0, 1)),
        "b": make_run(plugins, root, "scripted-b", seeds=(0, 1), extra=("method.salt=1",)),
        "one_seed": make_run(plugins, root, "scripted-one-seed", seeds=(0,)),
        "steps8": make_run(plugins, root, "scripted-steps8", seeds=(0, 1), extra=("eval.max_steps=8",)),
        "seen_only": make_run(plugins, root, "scripted-b-seen", seeds=(0, 1),
                              extra=("method.salt=1", "eval.splits=[test_seen]")),
    }


def test_compare_two_real_runs(runs):
    run_a, run_b = load_run(runs["a"]), load_run(runs["b"])
    comparison = compare_runs(run_a, run_b)
    for split in comparison["splits"]:
        a = {(r.task_id, r.seed): r.success for r in run_a.evaluated() if r.split == split["split"]}
        b = {(r.task_id, r.seed): r.success for r in run_b.evaluated() if r.split == split["split"]}
        assert split["pairs"] == len(a) == 2 * split["tasks"]
        assert split["a_only"] == sum(a[k] and not b[k] for k in a)
        assert split["b_only"] == sum(b[k] and not a[k] for k in a)
        assert split["difference"] == pytest.approx((split["a_only"] - split["b_only"]) / len(a), abs=1e-4)
        # the scripted rule decides every outcome
        assert all(a[(task, seed)] == scripted_success(task, seed, 0) for task, seed in a)
        assert split["ci95"][0] <= split["difference"] <= split["ci95"][1]
        assert 0.0 < split["p_value"] <= 1.0


def test_compare_variant_within_one_run(runs):
    run = load_run(runs["one_seed"])
    comparison = compare_runs(run, variant_b="without_skill")
    assert comparison["b"] == "scripted-one-seed[without_skill]"
    for split in comparison["splits"]:
        # without_skill is the standard solver, which the fake LLM never wins with
        assert split["success_b"] == 0.0 and split["b_only"] == 0
        assert split["a_only"] == round(split["success_a"] * split["pairs"])
        assert split["p_value"] == float(f"{exact_mcnemar(split['a_only'], 0):.4g}")  # reported to 4 digits
    with pytest.raises(ReportError, match="no test episodes of variant 'with_skil'.*without_skill"):
        compare_runs(run, variant_b="with_skil")


def test_compare_refuses_other_protocols_and_missing_seeds(runs):
    with pytest.raises(ReportError, match="eval.max_steps differs"):
        compare_runs(load_run(runs["a"]), load_run(runs["steps8"]))
    with pytest.raises(ReportError, match=r"scripted-one-seed lacks 12 of the 24 \(task, seed\) pairs of scripted-a"):
        compare_runs(load_run(runs["a"]), load_run(runs["one_seed"]))


def test_compare_cli(runs):
    result = CliRunner().invoke(cli, ["compare", str(runs["one_seed"]), "--variant", "without_skill", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [s["split"] for s in data["splits"]] == ["test_seen", "test_unseen"]
    assert data["test"].startswith("exact McNemar")
    variant = CliRunner().invoke(cli, ["compare", str(runs["one_seed"]), "--variant", "without_skill"])
    assert variant.exit_code == 0 and "scripted-one-seed[without_skill]" in variant.output
    table = CliRunner().invoke(cli, ["compare", str(runs["a"]), str(runs["b"])])
    assert table.exit_code == 0 and "test_unseen" in table.output and "A - B" in table.output
    refused = CliRunner().invoke(cli, ["compare", str(runs["a"]), str(runs["one_seed"])])
    assert refused.exit_code != 0 and "lacks 12 of the 24" in refused.output
    alone = CliRunner().invoke(cli, ["compare", str(runs["a"])])
    assert alone.exit_code != 0 and "--variant" in alone.output


def test_compare_says_when_the_two_models_ran_in_different_dtypes(runs):
    run_a, run_b = load_run(runs["a"]), load_run(runs["b"])
    assert compare_runs(run_a, run_b)["dtype_note"] is None
    for run, dtype in ((run_a, "bfloat16"), (run_b, "float32")):
        run.results.provenance.model["dtype"] = dtype
    note = compare_runs(run_a, run_b)["dtype_note"]
    assert note is not None and note.startswith("the model ran in bfloat16 and float32")
    assert "docs/numerics.md" in note


def test_compare_on_one_split_pairs_a_run_of_that_split_alone(runs):
    run_a, both, seen_only = load_run(runs["a"]), load_run(runs["b"]), load_run(runs["seen_only"])
    # without --split the runs differ in the splits they played, and test_unseen has no pairs
    with pytest.raises(ReportError, match="eval.splits differs"):
        compare_runs(run_a, seen_only)
    restricted = compare_runs(run_a, seen_only, splits=["test_seen"])
    assert [s["split"] for s in restricted["splits"]] == ["test_seen"]
    # the same tasks, seeds and outcomes as B's run of both splits: the same comparison
    full = {s["split"]: s for s in compare_runs(run_a, both)["splits"]}
    assert restricted["splits"][0] == full["test_seen"]
    with pytest.raises(ReportError, match=r"scripted-b-seen has no test episodes of split test_unseen \(it played test_seen\)"):
        compare_runs(run_a, seen_only, splits=["test_seen", "test_unseen"])
    # every other protocol field must still agree
    with pytest.raises(ReportError, match="eval.max_steps differs"):
        compare_runs(run_a, load_run(runs["steps8"]), splits=["test_seen"])
    result = CliRunner().invoke(cli, ["compare", str(runs["a"]), str(runs["seen_only"]), "--split", "test_seen", "--json"])
    assert result.exit_code == 0, result.output
    assert [s["split"] for s in json.loads(result.output)["splits"]] == ["test_seen"]
