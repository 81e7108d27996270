"""Step-level advantage estimators (``arena.core.rl.step_advantages``): GRPO's episode advantage
on every decision, and GiGPO's anchor-state step groups, checked against numbers worked by hand."""

from __future__ import annotations

import pytest

from arena.core.contract.types import RolloutTokens, Step, Task, Trajectory
from arena.core.rl import (
    AdvantageSettings,
    EpisodeSignal,
    decision_samples,
    discounted_returns,
    step_advantages,
    step_anchors,
    terminal_rewards,
)

# Group g: the first episode reaches B from A and is rewarded 8; the second stays in A one step
# longer (a "Nothing happens" loop), reaches B and gets nothing. Group h: one episode alone.
EPISODES = [
    EpisodeSignal("g", 8.0, [0.0, 8.0], ["A", "B"]),
    EpisodeSignal("g", 0.0, [0.0, 0.0, 0.0], ["A", "A", "B"]),
    EpisodeSignal("h", 2.0, [2.0], ["A"]),
]


def test_discounted_returns_by_hand() -> None:
    assert discounted_returns([0.0, 0.0, 10.0], 0.5) == [2.5, 5.0, 10.0]
    assert discounted_returns([1.0, 1.0], 1.0) == [2.0, 1.0]
    assert discounted_returns([], 0.95) == []


def test_gigpo_groups_steps_by_anchor_state_within_the_episode_group() -> None:
    settings = AdvantageSettings(estimator="gigpo", gamma=0.5, step_weight=1.0, normalisation="mean")
    got = step_advantages(EPISODES, settings)
    # Episode level, mean only: g's rewards 8 and 0 around 4 -> +4, -4; h alone -> 0.
    # Returns (gamma 0.5): first [4, 8], second [0, 0, 0], third [2].
    # Step group (g, A) holds 4, 0, 0 (mean 4/3); (g, B) holds 8, 0 (mean 4); (h, A) is alone.
    expected = [[4 + 8 / 3, 4 + 4], [-4 - 4 / 3, -4 - 4 / 3, -4 - 4], [0.0]]
    assert [pytest.approx(row) for row in expected] == got
    # Grouped by step position instead of state, the second episode's last step would stand
    # alone (-4, not -8) and its first two would differ; mixing h's A into g's, the mean moves.


def test_gigpo_step_weight_and_std_normalisation() -> None:
    settings = AdvantageSettings(estimator="gigpo", gamma=0.5, step_weight=0.5, normalisation="mean_std",
                                 std="population", eps=1e-12)
    got = step_advantages(EPISODES, settings)
    # Population std of (8, 0) is 4: episode advantages +1, -1. Step group (g, A): values
    # 4, 0, 0, mean 4/3, population std sqrt(32/9); (g, B): 8, 0 -> +1, -1.
    std_a = (32 / 9) ** 0.5
    expected = [[1 + 0.5 * (8 / 3) / std_a, 1 + 0.5], [-1 - 0.5 * (4 / 3) / std_a] * 2 + [-1 - 0.5], [0.0]]
    assert [pytest.approx(row) for row in expected] == got


def test_grpo_estimator_puts_the_episode_advantage_on_every_step() -> None:
    got = step_advantages(EPISODES, AdvantageSettings(estimator="grpo", normalisation="mean"))
    assert got == [[4.0, 4.0], [-4.0, -4.0, -4.0], [0.0]]


def test_bad_settings_name_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="grpo"):
        AdvantageSettings(estimator="ppo")
    with pytest.raises(ValueError, match="mean_std"):
        AdvantageSettings(normalisation="zscore")
    with pytest.raises(ValueError, match="anchors"):
        EpisodeSignal("g", 1.0, [1.0], [])
    with pytest.raises(ValueError, match="eps must be > 0"):
        AdvantageSettings(eps=0.0)


def test_tied_groups_empty_input_and_episodes_without_steps() -> None:
    tied = [EpisodeSignal("g", 0.0, [0.0], ["A"]), EpisodeSignal("g", 0.0, [0.0], ["A"])]
    assert step_advantages(tied, AdvantageSettings(estimator="gigpo")) == [[0.0], [0.0]]
    assert step_advantages([], AdvantageSettings(estimator="gigpo")) == []
    empty = EpisodeSignal("g", 10.0, [], [])
    assert step_advantages([empty, EPISODES[1]], AdvantageSettings(estimator="gigpo"))[0] == []


def _trajectory() -> Trajectory:
    task = Task("t1", "household", "train", "pick_and_place_simple", "put a mug on the desk")
    steps = [Step(action, obs, True, rollout=RolloutTokens([1, 2], [3], [-0.5]))
             for action, obs in (("go to desk 1", "You arrive at desk 1."), ("look", "Nothing happens."))]
    return Trajectory(task, "You are in a room.", steps)


def test_anchors_rewards_and_per_step_samples_of_a_trajectory() -> None:
    trajectory = _trajectory()
    assert step_anchors(trajectory) == ["You are in a room.", "You arrive at desk 1."]
    assert terminal_rewards(trajectory, 10.0) == [0.0, 10.0]
    samples = decision_samples(trajectory, role="solver", group="g", reward=10.0, advantage=[0.5, -1.0])
    assert [s.advantage for s in samples] == [0.5, -1.0]
    assert [s.advantage for s in decision_samples(trajectory, role="solver", group="g", reward=1.0,
                                                  advantage=2.0)] == [2.0, 2.0]
    with pytest.raises(ValueError, match="3 advantages"):
        decision_samples(trajectory, role="solver", group="g", reward=1.0, advantage=[1.0, 2.0, 3.0])


def test_episode_level_statistics_over_steps_weigh_long_episodes_more() -> None:
    # Rows are steps: g holds 8, 8 (two steps of the winner) and 0, 0, 0 (three of the loser):
    # mean 16/5, so the winner's rows get 8 - 3.2 = 4.8 and the loser's -3.2 (mean only).
    got = step_advantages(EPISODES, AdvantageSettings(estimator="grpo", normalisation="mean",
                                                      episode_level_over="steps"))
    assert [pytest.approx(row) for row in [[4.8, 4.8], [-3.2] * 3, [0.0]]] == got
    with pytest.raises(ValueError, match="episodes"):
        AdvantageSettings(episode_level_over="trajectories")
