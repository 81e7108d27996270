"""Golden cases of the verl-agent methods (GiGPO, SkillRL; tests/golden/<method>.yaml): inputs
with what the authors' code returned for them, and the episodes a case describes, built as Arena
trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from arena.core.contract.types import RolloutTokens, Step, Task, Termination, Trajectory

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def cases(method: str) -> dict[str, dict[str, Any]]:
    """The method's cases by name; each names its authors' source and has an expected output."""
    data = yaml.safe_load((GOLDEN / f"{method}.yaml").read_text())
    found = {case["name"]: case for case in data["cases"]}
    for name, case in found.items():
        assert case.get("source") and "expected" in case and "input" in case, f"{method} {name} is incomplete"
    return found


def group_episodes(groups: list[dict[str, Any]]) -> tuple[list[Trajectory], list[str]]:
    """The episodes of a case's groups, in order, with their group ids: each step's observation
    and whether its reply was well formed, every decision with rollout tokens, won or not."""
    episodes, ids = [], []
    for group in groups:
        for episode in group["episodes"]:
            steps = [Step(f"act {i}", text, True, rollout=RolloutTokens([1, 2], [3 + i], [-0.1]),
                          well_formed=bool(formed))
                     for i, (text, formed) in enumerate(zip(episode["observations"], episode["well_formed"]))]
            task = Task(f"golden/train/{group['group']}", "household", "train", "pick_and_place_simple", "goal")
            status = Termination.SUCCESS if episode["won"] else Termination.STEP_LIMIT
            episodes.append(Trajectory(task, group["start"], steps, status))
            ids.append(str(group["group"]))
    return episodes, ids
