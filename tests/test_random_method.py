"""The ``random`` method: the floor of every board, played under the same protocol as the rest."""

from __future__ import annotations

import json
from pathlib import Path

from arena.core import protocol
from arena.core.config.plugins import Plugins


def episodes(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]


def test_random_calls_no_model_plays_only_admissible_actions_and_repeats_by_seed(
    plugins: Plugins, fast: list[str], tmp_path: Path
) -> None:
    overrides = fast + ["env.level=easy", "eval.max_steps=30"]
    first, results = protocol.run("random", overrides=overrides, out=tmp_path / "a", plugins=plugins)
    again, _ = protocol.run("random", overrides=overrides, out=tmp_path / "b", plugins=plugins)
    other, _ = protocol.run("random", overrides=overrides + ["run.seeds=[1]"],
                            out=tmp_path / "c", plugins=plugins)
    assert results.valid and results.cost.evaluate.llm_calls == 0
    assert results.protocol.env == {"level": "easy"}
    played = episodes(first)
    assert len(played) == 24 and all(e["valid_actions"] == e["steps"] for e in played)
    assert all(e["steps"] == 30 or e["success"] for e in played)  # stopped by the limit or a win
    key = sorted((e["task_id"], e["success"], e["steps"], e["progress"]) for e in played)
    assert key == sorted((e["task_id"], e["success"], e["steps"], e["progress"]) for e in episodes(again))
    trajectories = [json.loads(line) for line in (first / "trajectories.jsonl").read_text().splitlines()]
    others = [json.loads(line) for line in (other / "trajectories.jsonl").read_text().splitlines()]
    def actions_by_task(lines: list[dict]) -> dict[str, list[str]]:
        return {t["task"]["task_id"]: [s["action"] for s in t["steps"]] for t in lines}

    actions = list(actions_by_task(trajectories).values())
    assert actions_by_task(trajectories) != actions_by_task(others)  # a new seed, new play
    assert len({tuple(a) for a in actions}) == len(actions)  # episodes draw apart from each other
