"""No valid or test game is a train game, in any world that defines its games, at any level.

A split keeps only games of its family (``arena.core.contract.env.draw_games``): the family follows from
the game's identity alone, so the rule holds whatever the sizes, the seeds or a test salt.
"""

from __future__ import annotations

import pytest

from arena.core.contract.env import POOL_SPLIT, TEST_SPLITS, TRAIN_SPLIT, VALID_SPLIT, draw_games, game_family
from arena.envs.babyai.environment import BabyAIEnvironment
from arena.envs.household.environment import HouseholdEnvironment
from arena.envs.household.levels import LEVELS

WORLDS = [pytest.param(lambda level=level: HouseholdEnvironment(level=level), id=f"household-{level}")
          for level in LEVELS]
WORLDS += [pytest.param(BabyAIEnvironment, id="babyai"),
           pytest.param(lambda: BabyAIEnvironment(seed=1), id="babyai-seed1")]


@pytest.mark.parametrize("make", WORLDS)
@pytest.mark.parametrize("salt", [None, "a-secret-salt"])
def test_no_valid_or_test_game_is_a_train_or_pool_game(make, salt):
    env = make()  # the default sizes: every task a board plays, and 1,200 (1,000) train tasks
    if salt:
        env.draw_tests_with(salt)
    learned = {env.game_identity(task) for task in [*env.tasks(TRAIN_SPLIT), *env.pool_tasks()]}
    for split in (VALID_SPLIT, *TEST_SPLITS):
        leaked = [task.task_id for task in env.tasks(split) if env.game_identity(task) in learned]
        assert not leaked, f"{split} games that are train games: {leaked[:5]}"
    valid = {env.game_identity(task) for task in env.tasks(VALID_SPLIT)}
    tested = {env.game_identity(task) for split in TEST_SPLITS for task in env.tasks(split)}
    assert not valid & tested


def test_a_household_game_is_its_room_goal_and_starts_not_its_seed():
    """The identity is the game's content: the easy level's small rooms repeat (two seeds, one
    game), the identity sees it, and a split keeps only its family's games."""
    env = HouseholdEnvironment(level="easy")
    train = env.tasks(TRAIN_SPLIT)
    identities = [env.game_identity(task) for task in train]
    assert len(set(identities)) < len(identities)  # seeds differ, games repeat at this level
    assert {game_family(identity) for identity in identities} == {"learn"}
    assert {game_family(env.game_identity(t)) for t in env.tasks(TEST_SPLITS[0])} == {"test"}


def test_draws_keep_their_familys_games_and_sizes_only_cut_lists_short():
    def candidate(index, draw):
        return (index, draw), f"game {draw % 37}"

    long = draw_games("toy", TEST_SPLITS[0], 20, candidate)
    assert draw_games("toy", TEST_SPLITS[0], 7, candidate) == long[:7]
    assert all(game_family(f"game {draw % 37}") == "test" for _, draw in long)
    assert [index for index, _ in long] == list(range(20))
    pool = draw_games("toy", POOL_SPLIT, 5, candidate)
    assert all(game_family(f"game {draw % 37}") == "learn" for _, draw in pool)


def test_a_world_with_too_few_games_for_a_split_says_so():
    only = next(f"game {n}" for n in range(1000) if game_family(f"game {n}") == "learn")
    with pytest.raises(ValueError, match="too few games"):
        draw_games("toy", VALID_SPLIT, 3, lambda index, draw: (draw, only))
