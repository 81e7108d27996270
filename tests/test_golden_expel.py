"""ExpeL against its authors' own outputs (tests/golden/expel.yaml): the critique's operations as
their parser reads them and the insight list their update rule leaves, and the episode that ends
on a repeated action, all under the paper preset's settings (the authors' behaviour)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from arena.core.config.compose import compose
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.expel.insights import parse_operations
from arena.plugins.expel.method import EndOnRepeat, ExpeL, fresh_state
from tests.helpers import golden
from tests.helpers.worlds import RepeatWinEpisode

CASES = yaml.safe_load((Path(__file__).parent / "golden" / "expel.yaml").read_text())["cases"]
CRITIQUES = [case for case in CASES if case["kind"] == "critique"]
EPISODES = [case for case in CASES if case["kind"] == "episode"]


def paper(plugins: Any, *overrides: str) -> Any:
    return compose(plugins, "expel", preset="paper", overrides=["llm.backend=fake", *overrides])


def written(operation: Any) -> list[Any]:
    """An operation as the authors' parser returns it: (``KIND[ n]``, text)."""
    head = operation.kind if operation.number is None else f"{operation.kind} {operation.number}"
    return [head, operation.text]


@pytest.mark.parametrize("golden", CRITIQUES, ids=[case["name"] for case in CRITIQUES])
def test_a_critique_updates_the_insights_as_the_authors(plugins, golden) -> None:
    cfg = paper(plugins, f"method.max_insights={golden['input']['max_num_rules']}")
    method = ExpeL(types.SimpleNamespace(cfg=cfg))  # type: ignore[arg-type]
    state = fresh_state()
    state["book"] = {"insights": [{"id": f"insight-{n:04d}", "text": text, "weight": weight}
                                  for n, (text, weight) in enumerate(golden["input"]["rules"], start=1)],
                     "next_number": len(golden["input"]["rules"]) + 1}
    book = method._book(state)
    parsed = parse_operations(golden["input"]["reply"], method.cfg.operation_parser)
    assert [written(op) for op in parsed.operations] == golden["expected"]["operations"]
    book.apply(parsed.operations)
    assert [[i.text, i.weight] for i in book.insights] == golden["expected"]["rules"]


@pytest.mark.parametrize("case", EPISODES, ids=golden.names(EPISODES))
def test_an_episode_ends_on_a_repeated_action_as_the_authors(case) -> None:
    golden.assert_ends_on_repeat(case)


def test_the_paper_preset_plays_the_authors_episode_rule_and_the_default_does_not(plugins) -> None:
    """``solve`` wraps the solver's policy in :class:`EndOnRepeat` exactly where
    ``method.end_on_repeated_action`` is on (the paper preset)."""
    def policy_of(cfg: Any) -> Any:
        run = golden.solving_run(cfg, HOUSEHOLD_INSTRUCTIONS)
        return ExpeL(run).solve(run, RepeatWinEpisode([]).task, [], 0)  # type: ignore[arg-type]

    assert isinstance(policy_of(paper(plugins)), EndOnRepeat)
    assert not isinstance(policy_of(compose(plugins, "expel", overrides=["llm.backend=fake"])), EndOnRepeat)
