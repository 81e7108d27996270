"""The medium board's one learning budget is written in three places that must agree: the script
that runs its rows (``scripts/board_household_medium_warm.sh``), the page that explains each
row's overrides (``docs/board_budget.md``) and the committed runs' own config.yaml. A row run
with other overrides, or a page that no longer says what the script runs, fails here."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "board_household_medium_warm.sh"
PAGE = ROOT / "docs" / "board_budget.md"
BOARD = ROOT / "leaderboards" / "household-medium-warm"
#: What every row of the board runs with (the script's COMMON and ISOLATED arrays).
COMMON = {"env.level": "medium", "eval.limit": None, "llm.dtype": "float32", "run.isolation": "process",
          "eval.salt": "public"}


def script_rows() -> dict[str, list[str]]:
    """Row name -> its method and overrides, as the script's ``row_args`` echoes them."""
    body = SCRIPT.read_text().split("row_args() {", 1)[1].split("\n}\n", 1)[0]
    rows: dict[str, list[str]] = {}
    for patterns, echoed in re.findall(r'^\s+([\w|]+)\) echo "?([^";]*)"? ;;', body, re.M):
        for name in patterns.split("|"):
            rows[name] = shlex.split(echoed.replace("$1", name))
    return rows


def page_rows() -> dict[str, str]:
    """Row name -> the page's command column, for every row its table names."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([\w]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_the_script_and_the_page_give_every_row_the_same_overrides() -> None:
    script, page = script_rows(), page_rows()
    assert {"rag", "memrl", "mem0", "reflexion", "expel", "grpo", "gigpo", "evolving_rl", "skillrl",
            "evolving_rl_solver_only", "evolving_rl_extractor_only"} <= set(script)
    for name, (_method, *overrides) in script.items():
        if not overrides:  # base and random learn nothing
            continue
        assert name in page, f"docs/board_budget.md has no row for {name}"
        for override in overrides:
            assert override in page[name] or (name.startswith("evolving_rl_") and override in page["evolving_rl"]), \
                (name, override, page[name])


def committed_runs() -> list[Path]:
    return sorted(path.parent for path in (BOARD / "runs").glob("*/config.yaml"))


@pytest.mark.parametrize("run", committed_runs(), ids=lambda path: path.name)
def test_every_committed_run_of_the_board_ran_its_rows_overrides(run: Path) -> None:
    name, seed = run.name.rsplit("-seed", 1)
    method, *overrides = script_rows()[name.removesuffix("-none")]
    results = json.loads((run / "results.json").read_text())
    config = OmegaConf.load(run / "config.yaml")
    preset = overrides[overrides.index("--preset") + 1] if "--preset" in overrides else None
    # the preset is the config's (results.json names the method only): gigpo's row has one
    assert (results["method"], OmegaConf.select(config, "method.preset")) == (method, preset), run.name
    expected: dict[str, Any] = dict(COMMON, **{"run.seeds": [int(seed)], "learn.seed": int(seed)})
    for override in overrides:
        if "=" in override:
            key, value = override.split("=", 1)
            expected[key] = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]
    for key, value in expected.items():
        actual = OmegaConf.select(config, key)
        actual = OmegaConf.to_container(actual) if OmegaConf.is_config(actual) else actual
        assert actual == value, (run.name, key, actual, value)


def test_the_script_lists_the_seeds_a_claim_waits_for(tmp_path: Path) -> None:
    """``--seeds-needed`` names, from a board's verdicts, every run still missing of each row whose
    claims wait for seeds (run: ``bash SCRIPT $(bash SCRIPT --seeds-needed)``): not a run finished
    here or committed beside the board, but again a committed memory row whose reset is missing
    and whose learned state is gone (it listed the committed rows of the board as missing)."""
    import os
    import subprocess

    board, runs = tmp_path / "board", tmp_path / "runs"
    waiting = {"rag": 1, "memrl": 1, "expel": 1, "gigpo (cpu)": 1, "reflexion": 3}
    (board / "unfinished" / "expel-seed0").mkdir(parents=True)  # parked, store and all
    board.joinpath("leaderboard.json").write_text(json.dumps({"verdicts": [
        {"row": row, "seeds": seeds, "seeds_needed": 3 - seeds} for row, seeds in waiting.items()]}))
    for row, where in [("rag-seed0", board / "runs"), ("memrl-seed0", board / "runs"),
                       ("memrl-none-seed0", board / "runs"), ("expel-seed0", board / "runs"),
                       ("gigpo-seed0", board / "runs"), ("gigpo-seed1", runs)]:
        (where / row).mkdir(parents=True)
        (where / row / "results.json").write_text("{}")

    result = subprocess.run(["bash", str(SCRIPT), "--seeds-needed"], capture_output=True, text=True,
                            env={**os.environ, "RUNS": str(runs), "BOARD": str(board)}, check=True)
    assert result.stdout.split() == [
        "rag-seed0", "rag-none-seed0", "rag-seed1", "rag-none-seed1", "rag-seed2", "rag-none-seed2",
        "memrl-seed1", "memrl-none-seed1", "memrl-seed2", "memrl-none-seed2",
        "expel-none-seed0", "expel-seed1", "expel-none-seed1", "expel-seed2", "expel-none-seed2",
        "gigpo-seed2"]  # reflexion has its 3 seeds: nothing waits


def test_park_keeps_each_unfinished_run_whole_and_a_parked_row_resumes_with_move_here(tmp_path: Path) -> None:
    """``--park`` copies every unfinished run whole beside the board (no lock) unless it is over
    PARK_MAX_MB or holds trained weights, drops a parked row once its run finished; the script puts a parked row back and resumes it with
    ``--move-here`` (a fake ``arena`` on PATH records the call)."""
    import os
    import subprocess

    runs, board, bin_dir = tmp_path / "runs", tmp_path / "board", tmp_path / "bin"
    for name, files in (("memrl-seed0", {"config.yaml": "a", "store/db": "b", "run.lock": "1"}),
                        ("rag-seed1", {"config.yaml": "c", "results.json": "{}", "store/db": "d"}),
                        ("base-seed0", {"config.yaml": "e", "results.json": "{}"})):
        for file, text in files.items():
            (runs / name / file).parent.mkdir(parents=True, exist_ok=True)
            (runs / name / file).write_text(text)
    (runs / "grpo-seed0").mkdir()  # over PARK_MAX_MB=1
    (runs / "grpo-seed0" / "checkpoint").write_bytes(b"0" * 2_000_000)
    (runs / "gigpo-seed0" / "method" / "checkpoint-00003").mkdir(parents=True)  # small, but trained weights
    (runs / "gigpo-seed0" / "method" / "checkpoint-00003" / "trainer_state.json").write_text("{}")
    (board / "unfinished" / "base-seed0").mkdir(parents=True)  # parked once, finished since
    bin_dir.mkdir()
    (bin_dir / "arena").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n')
    (bin_dir / "arena").chmod(0o755)
    env = {**os.environ, "RUNS": str(runs), "BOARD": str(board), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PARK_MAX_MB": "1"}

    import fcntl

    with (runs / "memrl-seed0" / "run.lock").open() as lock:  # as a live `arena run` holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused = subprocess.run(["bash", str(SCRIPT), "--park"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "memrl-seed0 is still running" in refused.stderr, refused.stderr
    assert not (board / "unfinished" / "memrl-seed0").exists()
    parking = subprocess.run(["bash", str(SCRIPT), "--park"], env=env, check=True, capture_output=True, text=True)
    assert "grpo-seed0 not parked: 2 MB" in parking.stderr and not (board / "unfinished" / "grpo-seed0").exists()
    # Trained weights never go into the repository: an RL row is not parked, whatever its size.
    assert "gigpo-seed0 not parked: it holds trained weights" in parking.stderr
    assert not (board / "unfinished" / "gigpo-seed0").exists() and (runs / "gigpo-seed0" / "method").is_dir()
    parked = board / "unfinished" / "memrl-seed0"
    assert sorted(p.relative_to(parked).as_posix() for p in parked.rglob("*") if p.is_file()) == \
        ["config.yaml", "store/db"]
    assert not (board / "unfinished" / "base-seed0").exists()
    # A finished memory row stays parked, store and all, until its memory reset has run: the
    # reset evaluates that learned state, which the board's small files do not hold.
    assert (board / "unfinished" / "rag-seed1" / "store" / "db").read_text() == "d"

    import shutil

    shutil.rmtree(runs / "memrl-seed0")  # a new machine: the run is only where it was parked
    subprocess.run(["bash", str(SCRIPT), "memrl-seed0"], env=env, check=True, capture_output=True)
    assert (runs / "memrl-seed0" / "store" / "db").read_text() == "b"
    assert (tmp_path / "calls").read_text().splitlines()[-1].split() == \
        ["run", "--resume", str(runs / "memrl-seed0"), "--move-here"]

    shutil.rmtree(runs / "rag-seed1")  # likewise for the reset's source
    subprocess.run(["bash", str(SCRIPT), "rag-none-seed1"], env=env, check=True, capture_output=True)
    assert (runs / "rag-seed1" / "store" / "db").read_text() == "d"
    assert (tmp_path / "calls").read_text().splitlines()[-1].split()[:4] == \
        ["evaluate", "--state", str(runs / "rag-seed1"), "--out"]
    (board / "unfinished" / "rag-none-seed1").mkdir()  # a reset parked half-way goes on too
    (board / "unfinished" / "rag-none-seed1" / "config.yaml").write_text("f")
    subprocess.run(["bash", str(SCRIPT), "rag-none-seed1"], env=env, check=True, capture_output=True)
    assert (runs / "rag-none-seed1" / "config.yaml").read_text() == "f"
    assert (tmp_path / "calls").read_text().splitlines()[-1].split() == \
        ["run", "--resume", str(runs / "rag-none-seed1"), "--move-here"]
    (runs / "rag-none-seed1" / "results.json").write_text("{}")
    subprocess.run(["bash", str(SCRIPT), "--park"], env=env, check=True, capture_output=True)
    assert not (board / "unfinished" / "rag-seed1").exists()  # its reset is done


def test_a_parked_row_resumes_with_the_commit_that_started_it(tmp_path: Path) -> None:
    """A resume under another commit is refused (a row's phases keep one version), so the script
    resumes a parked run from a worktree of the commit its state.json names, made once; a run
    started by this checkout's HEAD resumes here (a fake ``arena`` records where it ran)."""
    import os
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    try:
        head, before = git("rev-parse", "HEAD"), git("rev-parse", "HEAD~1")
    except subprocess.CalledProcessError:
        pytest.skip("needs a git checkout with at least two commits")
    runs, board, bin_dir, worktrees = tmp_path / "runs", tmp_path / "board", tmp_path / "bin", tmp_path / "wt"
    for row, sha in (("memrl-seed0", before), ("rag-seed0", head)):
        (board / "unfinished" / row).mkdir(parents=True)
        (board / "unfinished" / row / "state.json").write_text(json.dumps({"provenance": {"git_sha": sha}}))
    bin_dir.mkdir()
    (bin_dir / "arena").write_text(f'#!/bin/sh\necho "$PWD|$PYTHONPATH|$*" >> {tmp_path}/calls\n')
    (bin_dir / "arena").chmod(0o755)
    env = {**os.environ, "RUNS": str(runs), "BOARD": str(board), "WORKTREES": str(worktrees),
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": ""}
    worktree = worktrees / before[:12]
    try:
        for _ in range(2):  # the second time the worktree is there already
            subprocess.run(["bash", str(SCRIPT), "memrl-seed0", "rag-seed0"], env=env, check=True, capture_output=True)
        assert git("-C", str(worktree), "rev-parse", "HEAD") == before
    finally:
        if worktree.exists():
            git("worktree", "remove", "--force", str(worktree))
    calls = (tmp_path / "calls").read_text().splitlines()
    resumed = [f"run --resume {runs / row} --move-here" for row in ("memrl-seed0", "rag-seed0")] * 2
    assert [line.split("|")[2] for line in calls] == resumed
    assert [line.split("|")[:2] for line in calls] == [[str(worktree), str(worktree)], [str(ROOT), ""]] * 2


@pytest.mark.parametrize("native_bf16", [True, False])
def test_an_rl_row_learns_only_where_bf16_is_native(tmp_path: Path, native_bf16: bool) -> None:
    """The RL rows train with precision auto, bf16 autocast only on a CPU that computes bf16
    natively: the script starts (or resumes) an RL row's learning only there, so no RL row of
    the board learns in float32 beside rows that learned in bf16; a memory row and an RL row
    whose learning has finished run anywhere. (torch's check is patched at interpreter start.)"""
    import os
    import subprocess
    import sys

    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        f"import torch\ntorch.ops.mkldnn._is_mkldnn_bf16_supported = lambda: {native_bf16}\n")
    runs, bin_dir = tmp_path / "runs", tmp_path / "bin"
    (runs / "grpo-seed0").mkdir(parents=True)  # learned, evaluating: goes on anywhere
    (runs / "grpo-seed0" / "state.json").write_text(json.dumps({"learn_done": True}))
    bin_dir.mkdir()
    (bin_dir / "arena").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    (bin_dir / "arena").chmod(0o755)
    env = {**os.environ, "RUNS": str(runs), "BOARD": str(tmp_path / "board"), "PYTHONPATH": str(patch),
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ran = subprocess.run(["bash", str(SCRIPT), "gigpo-seed0", "memrl-seed0", "grpo-seed0"], env=env,
                         capture_output=True, text=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    started = [line.split("--out ")[1].split()[0] for line in calls if line.startswith("run --method")]
    assert [Path(p).name for p in started] == (["gigpo-seed0", "memrl-seed0"] if native_bf16 else ["memrl-seed0"])
    assert f"run --resume {runs / 'grpo-seed0'} --move-here" in calls
    assert ran.returncode == (0 if native_bf16 else 1), ran.stderr
    assert ("gigpo-seed0 not started: this CPU computes no bf16 natively" in ran.stderr) != native_bf16


def test_every_row_that_trains_a_policy_is_held_to_bf16_learning(plugins) -> None:
    """The script's RL_METHODS (the rows whose learning it starts only where bf16 is native) are
    exactly the rows whose method config has a policy trainer, so a new RL row cannot learn in
    float32 beside rows that learned in bf16 autocast."""
    from omegaconf import OmegaConf

    from arena.core.config.compose import compose

    listed = set(re.search(r"^RL_METHODS=\(([^)]*)\)", SCRIPT.read_text(), re.M).group(1).split())  # type: ignore[union-attr]

    def trains(args: list[str]) -> bool:  # a `trainer` section in the method's config, or one level down
        method, preset = args[0], next((args[i + 1] for i, a in enumerate(args) if a == "--preset"), None)
        cfg: dict[str, Any] = OmegaConf.to_container(compose(plugins, method, preset=preset).method)  # type: ignore[assignment]
        return "trainer" in cfg or any(isinstance(v, dict) and "trainer" in v for v in cfg.values())

    rows = {name: args for name, args in script_rows().items() if name not in ("base", "random")}
    assert {name for name, args in rows.items() if trains(args)} == listed
    assert {"grpo", "gigpo", "evolving_rl", "skillrl"} <= listed  # the check sees the trainers it must
