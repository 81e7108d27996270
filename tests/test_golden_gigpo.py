"""GiGPO against its authors' code (verl-agent): tests/golden/gigpo.yaml holds fixed inputs and
what the authors' functions returned for them; Arena's code must return the same."""

from __future__ import annotations

import pytest

from arena.core.config.compose import compose
from arena.core.contract.method_config import typed_config
from arena.core.execution.solver import parse_action, well_formed
from arena.core.rl import discounted_returns
from arena.plugins.gigpo.method import build_samples, episode_reward, step_penalties, step_rewards
from arena.plugins.gigpo.settings import GiGPOSettings
from tests.helpers.golden_verl import cases, group_episodes

CASES = cases("gigpo")
ADVANTAGE_CASES = [name for name in CASES if name.startswith("gigpo_advantage_")]


def settings(plugins, case: dict) -> GiGPOSettings:
    given = case["input"]
    overrides = [f"method.advantage.gamma={given['gamma']}", f"method.advantage.step_weight={given['step_weight']}",
                 f"method.advantage.normalisation={given['normalisation']}",
                 f"method.invalid_action_penalty={given['invalid_action_penalty']}",
                 f"method.win_reward={given['win_reward']}"]
    cfg = typed_config(compose(plugins, "gigpo", overrides=overrides).method, GiGPOSettings)
    # Everything else is the default's, which is the authors' (episode statistics over steps,
    # unbiased std, eps 1e-6, no progress reward).
    assert (cfg.estimator.estimator, cfg.estimator.episode_level_over, cfg.estimator.std) == ("gigpo", "steps", "unbiased")
    assert cfg.estimator.eps == 1e-6 and cfg.progress_reward == 0.0
    return cfg


@pytest.mark.parametrize("name", ADVANTAGE_CASES)
def test_step_level_advantages_are_the_authors(plugins, name: str) -> None:
    """Episode- and step-level normalisation, anchor-state step groups, discounted returns, the
    weighting, and the invalid-action penalty taken off each malformed step's own row."""
    case = CASES[name]
    cfg = settings(plugins, case)
    episodes, groups = group_episodes(case["input"]["groups"])
    samples, _ = build_samples(episodes, groups, cfg)
    expected = case["expected"]
    assert [s.advantage for s in samples] == pytest.approx(expected["advantages"], abs=1e-4)
    # The two rows the authors' estimator reads, each decision's: its episode score and its step
    # return, both less the decision's own penalty (the return discounted before it).
    scores, returns = [], []
    for trajectory in episodes:
        reward = episode_reward(trajectory, cfg)
        penalties = step_penalties(trajectory, cfg)
        scores += [reward - p for p in penalties]
        returns += [g - p for g, p in zip(discounted_returns(step_rewards(trajectory, reward), cfg.estimator.gamma),
                                          penalties)]
    assert scores == pytest.approx(expected["row_scores"], abs=1e-5)
    assert returns == pytest.approx(expected["step_returns"], abs=1e-5)


def as_arena(reply: str) -> str:
    """The authors' prompt asks for think tags, Arena's react prompt for reasoning tags."""
    return reply.replace("<think>", "<reasoning>").replace("</think>", "</reasoning>")


def test_malformed_replies_are_the_authors_invalid_ones() -> None:
    """verl-agent's alfworld projection: both think tags (as written) and both action tags (any
    case) present, no CJK ideograph; a well-formed inadmissible action is valid."""
    case = CASES["alfworld_projection_validity"]
    replies = case["input"]["replies"]
    assert [int(well_formed(as_arena(r))) for r in replies] == case["expected"]["valid"]
    admissible = case["input"]["admissible"]
    for reply, action in zip(replies, case["expected"]["action"]):
        if action is not None:  # the reply has action tags: the action played is theirs
            assert parse_action(as_arena(reply), admissible) == action
