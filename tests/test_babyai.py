"""BabyAI-Text (``--env babyai``): the view in words, the commands, splits and held-out levels,
minigrid's bot as expert, and every built-in method run on it with the instructions it owns."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from minigrid.core.world_object import Door, Key
from minigrid.minigrid_env import MiniGridEnv

from arena.cli import cli
from arena.core import protocol
from arena.core.contract.env import POOL_SPLIT, TEST_SPLITS, TRAIN_SPLIT
from arena.core.contract.types import Task
from arena.envs.babyai import LADDER
from arena.envs.babyai.environment import (
    SPLIT_SEED_BASE,
    VERSION,
    BabyAIEnvironment,
    _new_level_env,
    _reset,
    mission_of,
)
from arena.envs.babyai.levels import DEFAULT_SEEN, DEFAULT_UNSEEN
from arena.envs.babyai.text import COMMANDS, describe_view
from arena.envs.babyai.view import egocentric_view
from arena.testing import ChoiceRecorder, expert_episode

ROOT = Path(__file__).resolve().parents[1]


def play_expert(env: BabyAIEnvironment, task) -> tuple[bool, int]:
    episode = env.open(task)
    observation, steps = episode.reset(), 0
    while not observation.done:
        action = episode.expert_action()
        assert action in observation.admissible_actions, (task.task_id, action, observation)
        observation = episode.step(action)
        steps += 1
    return observation.won, steps


def test_the_expert_wins_every_task_of_every_split() -> None:
    """minigrid's BabyAI bot, through the text commands, on the default splits and the pool."""
    env = BabyAIEnvironment()
    for split in [*env.split_names(), POOL_SPLIT]:
        tasks = env.pool_tasks() if split == POOL_SPLIT else env.tasks(split)
        assert tasks, split
        lost = [task.task_id for task in tasks if not play_expert(env, task)[0]]
        assert not lost, f"the expert lost {len(lost)} of {len(tasks)} {split} tasks: {lost[:5]}"


def test_the_expert_wins_every_level_of_the_ladder() -> None:
    names = [level.name for level in LADDER]
    env = BabyAIEnvironment(n_train=0, n_valid=0, n_test=3 * len(names), seen_levels=names[:-1],
                            unseen_levels=names[-1:])
    for task in env.tasks(TEST_SPLITS[0]) + env.tasks(TEST_SPLITS[1]):
        assert play_expert(env, task)[0], task.task_id


def test_layouts_and_missions_are_minigrids_own(capsys) -> None:
    """Arena's level classes generate what minigrid's registered levels generate, seed for seed,
    without printing minigrid's rejected samples."""
    import gymnasium

    for level in LADDER:
        ours, theirs = _new_level_env(level.name), gymnasium.make(level.gym_id, disable_env_checker=True).unwrapped
        for seed in (0, 7, 2_000_001):
            ours.reset(seed=seed)
            assert capsys.readouterr().out == "", level.name  # minigrid's own prints its rejections
            theirs.reset(seed=seed)
            capsys.readouterr()
            assert ours.mission == theirs.mission and ours.max_steps == theirs.max_steps, (level.name, seed)
            assert np.array_equal(ours.grid.encode(), theirs.grid.encode()), (level.name, seed)
            assert tuple(ours.agent_pos) == tuple(theirs.agent_pos) and ours.agent_dir == theirs.agent_dir


def test_the_fast_view_is_minigrids_own_observation() -> None:
    """Cell for cell equal to minigrid's gen_obs over random play on every level (doors opened,
    objects carried and dropped, boxes opened, rooms left)."""
    rng = random.Random(0)
    compared = 0
    for level in LADDER:
        env = _new_level_env(level.name)
        _reset(env, 11)
        for step in range(120):
            expected = MiniGridEnv.gen_obs(env)["image"]
            assert np.array_equal(np.array(egocentric_view(env), dtype=np.uint8), expected), (level.name, step)
            compared += 1
            _, _, terminated, truncated, _ = env.step(rng.randrange(6))
            if terminated or truncated:
                _reset(env, step)
    assert compared == 120 * len(LADDER)


def _image(cells: dict[tuple[int, int], tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    view = [[(1, 0, 0)] * 7 for _ in range(7)]
    for (i, j), cell in cells.items():
        view[i][j] = cell
    return view


def test_the_view_names_objects_by_colour_and_steps_forward_and_aside() -> None:
    # The agent at (3, 6) looks up the view: (3, 4) is 2 steps forward, (5, 6) 2 steps right.
    image = _image({(3, 4): (6, 0, 0), (5, 6): (4, 4, 2), (1, 3): (5, 2, 0), (3, 1): (2, 5, 0),
                    (0, 6): (2, 5, 0), (2, 0): (0, 0, 0)})
    text = describe_view(image, carrying=Key("purple"))
    # Nearest first (steps forward plus aside), then the walls straight ahead, left and right.
    assert text == ("You see a locked yellow door 2 steps right, a red ball 2 steps forward, "
                    "a blue key 3 steps forward and 2 steps left, a wall 5 steps forward, "
                    "a wall 3 steps left. You are carrying a purple key.")
    assert describe_view(_image({}), carrying=None) == "You see nothing but the floor."


def test_only_commands_that_do_something_are_admissible_and_others_change_nothing() -> None:
    env = BabyAIEnvironment(n_train=40)
    for task in env.tasks(TRAIN_SPLIT):
        episode = env.open(task)
        observation = episode.reset()
        assert set(observation.admissible_actions) <= set(COMMANDS)
        assert {"turn left", "turn right"} <= set(observation.admissible_actions)
        game = episode._env
        front = game.grid.get(*game.front_pos)
        assert ("go forward" in observation.admissible_actions) == (front is None or front.can_overlap())
        assert ("drop" in observation.admissible_actions) is False  # nothing is carried at first
        before = (tuple(game.agent_pos), game.agent_dir, game.step_count)
        refused = episode.step("drop")
        assert refused.text == "Nothing happens." and not refused.done
        assert (tuple(game.agent_pos), game.agent_dir, game.step_count) == before


def test_a_locked_door_needs_its_key_and_says_so() -> None:
    env = BabyAIEnvironment(n_train=1, seen_levels=("GoToObj",), unseen_levels=("OpenRedDoor",))
    episode = env.open(env.tasks(TRAIN_SPLIT)[0])
    episode.reset()
    game = episode._env
    x, y = game.front_pos
    game.grid.set(x, y, Door("yellow", is_locked=True))
    for _ in range(4):  # a full turn on the spot: the episode sees the door placed in front
        observation = episode.step("turn left")
    assert "toggle" in observation.admissible_actions and "go forward" not in observation.admissible_actions
    assert episode.step("go forward").text == "Nothing happens."
    locked = episode.step("toggle")
    assert locked.text.startswith("The yellow door is locked; it opens with the yellow key.")
    game.carrying = Key("yellow")
    opened = episode.step("toggle")
    assert opened.text.startswith("You unlock the yellow door with the key and open it.")
    assert "go forward" in opened.admissible_actions


def test_a_sequence_level_reports_progress_per_instruction() -> None:
    env = BabyAIEnvironment(n_train=0, n_valid=0, n_test=2, seen_levels=("GoToObj",),
                            unseen_levels=("OpenTwoDoors",))
    task = env.tasks(TEST_SPLITS[1])[0]
    episode = env.open(task)
    observation = episode.reset()
    seen = []
    while not observation.done:
        observation = episode.step(episode.expert_action())
        seen.append(observation.progress)
    assert observation.won and ", then " in task.goal
    assert 0.5 in seen and seen[-1] == 1.0 and seen == sorted(seen)
    assert observation.reward > 0  # minigrid's own reward, 1 - 0.9 * steps / limit


def test_splits_use_disjoint_seeds_and_hold_the_unseen_levels_out() -> None:
    env = BabyAIEnvironment(n_train=40, n_valid=12, n_test=12)
    seeds: dict[str, set[int]] = {}
    for split in [*env.split_names(), POOL_SPLIT]:
        tasks = env.pool_tasks() if split == POOL_SPLIT else env.tasks(split)
        seeds[split] = {int(t.payload["seed"]) for t in tasks}
        expected = DEFAULT_UNSEEN if split in (TEST_SPLITS[1], POOL_SPLIT) else DEFAULT_SEEN
        assert {t.task_type for t in tasks} == set(expected), split
        assert all(t.task_id.startswith(f"babyai/{VERSION}/s0/{split}/") for t in tasks)
        assert all(t.goal and t.payload["level"] == t.task_type for t in tasks)
        assert all(SPLIT_SEED_BASE[split] <= seed < SPLIT_SEED_BASE[split] + 1_000_000 for seed in seeds[split])
    names = list(seeds)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            assert not seeds[first] & seeds[second], (first, second)
    assert "minigrid" in VERSION
    # A task is the same whoever lists it, and another world seed gives other layouts.
    assert BabyAIEnvironment(n_train=40).tasks(TRAIN_SPLIT) == env.tasks(TRAIN_SPLIT)
    other = BabyAIEnvironment(seed=1, n_train=40).tasks(TRAIN_SPLIT)
    assert [t.goal for t in other] != [t.goal for t in env.tasks(TRAIN_SPLIT)]


def test_level_lists_are_checked_with_the_fix_named() -> None:
    with pytest.raises(ValueError, match="Unknown BabyAI level 'GoToLocl'. Did you mean 'GoToLocal'"):
        BabyAIEnvironment(seen_levels=("GoToLocl",))
    with pytest.raises(ValueError, match="in both env.seen_levels and env.unseen_levels"):
        BabyAIEnvironment(seen_levels=("GoToObj", "OpenRedDoor"))
    with pytest.raises(ValueError, match="env.unseen_levels is empty"):
        BabyAIEnvironment(unseen_levels=())


def test_arena_plugins_lists_babyai_with_its_levels() -> None:
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    (entry,) = [e for e in json.loads(result.output)["envs"] if e["name"] == "babyai"]
    assert all(level.name in entry["description"] for level in LADDER)


def test_no_core_module_names_a_world() -> None:
    """The core knows environments only through their interface: no module of arena/core names
    the household world or ALFWorld (their instructions and task types are theirs)."""
    named = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / "arena" / "core").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if re.search(r"household|alfworld|receptacle", line, re.I)]
    assert not named, named


# -- every built-in method on babyai -----------------------------------------------------------

SMALL = ["env.n_train=8", "env.n_valid=4", "env.n_test=4", "eval.limit=2", "embedder.name=hashing",
         "eval.max_steps=6", "learn.max_steps=6", "learn.budget.episodes=4"]
RECORDING = ["llm.backend=recording", *SMALL]
TINY = ["llm.backend=transformers", "llm.model=tiny", "eval.limit=1", *SMALL]
ON_FAKE = {
    "base": RECORDING,
    "random": RECORDING,
    "rag": RECORDING,
    "memrl": RECORDING,
    "expel": [*RECORDING, "method.max_reflections=1", "method.train_tasks=4"],
}
ON_TINY = {
    "evolving_rl": [*TINY, "method.iterations=1", "method.n_sources=1", "method.n_skills=1",
                    "method.k_downstream=1", "method.extractor_max_tokens=8", "method.valid_every=0"],
    "grpo": [*TINY, "method.iterations=1", "method.n_sources=1", "method.group_size=2", "method.valid_every=0"],
    "skillrl": [*TINY, "method.collect.tasks=1", "method.sft.tasks=1", "method.sft.steps=1",
                "method.rl.steps=1", "method.rl.tasks_per_step=1", "method.rl.group_size=2",
                "method.evolution.every=0", "method.teacher.max_new_tokens=8"],
}


@pytest.fixture
def recorded(plugins) -> ChoiceRecorder:
    """The fake backend as ``llm.backend=recording``: every prompt it is sent is kept."""
    return ChoiceRecorder(plugins, inner="fake")


def _complete(path: Path, method: str) -> dict:
    results = json.loads((path / "results.json").read_text())
    assert results["method"] == method and results["env"] == "babyai"
    assert set(results["splits"]) == set(TEST_SPLITS) and results["valid"], results.get("violations")
    assert results["protocol"]["env"] == {"seen_levels": list(DEFAULT_SEEN), "unseen_levels": list(DEFAULT_UNSEEN)}
    assert {"minigrid", "gymnasium"} <= set(results["provenance"]["packages"])
    return results


@pytest.mark.parametrize("method", sorted(ON_FAKE))
def test_every_built_in_method_runs_on_babyai_with_its_instructions(method, plugins, recorded, tmp_path) -> None:
    path, _ = protocol.run(method, overrides=ON_FAKE[method], out=tmp_path / method, plugins=plugins,
                           env="babyai")
    results = _complete(path, method)
    if method not in ("base", "random"):
        assert results["cost"]["learn"]["episodes"] > 0
    chats = [call.prompt for call in recorded.calls] + recorded.generated
    texts = [message["content"] for chat in chats for message in chat]
    if method != "random":  # the random policy asks no model
        assert any("You are an agent in a grid world" in text and "'toggle' opens" in text for text in texts)
        assert any(text.startswith("Your mission: ") for text in texts)
    assert not [text for text in texts if "household" in text.lower()]


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(ON_TINY))
def test_every_trained_built_in_method_runs_on_babyai(method, plugins, tmp_path) -> None:
    path, _ = protocol.run(method, overrides=ON_TINY[method], out=tmp_path / method, plugins=plugins,
                           env="babyai")
    results = _complete(path, method)
    assert results["learn"]["used"]["gradient_steps"] >= 1


def test_environments_in_worker_processes_keep_their_instructions_and_packages() -> None:
    """env.workers wraps an environment in a process pool; what the agent is told and which
    packages a run records must come from the wrapped world, not the interface's defaults."""
    from arena.core.execution.env_workers import ProcessEnvironment
    from arena.envs.babyai.environment import INSTRUCTIONS

    local = BabyAIEnvironment(n_train=2, n_valid=1, n_test=1)
    pool = ProcessEnvironment(local, lambda: BabyAIEnvironment(n_train=2, n_valid=1, n_test=1), workers=1)
    try:
        assert pool.instructions() is INSTRUCTIONS and pool.packages == ("minigrid", "gymnasium")
        assert "grid world" in pool.instructions().system_prompt() and "'toggle'" in pool.instructions().system_prompt()
    finally:
        pool.close()


def test_a_bot_that_replans_forever_leaves_the_expert_without_a_command() -> None:
    """minigrid 3.2.0's bot never finishes one replan on Unlock at seed 3,000,031 (world 1.0's
    test_unseen task 31); capped, the expert answers None there and the episode goes on."""
    env = BabyAIEnvironment(n_train=0, n_valid=0, n_test=0, seen_levels=("GoToObj",), unseen_levels=("Unlock",))
    mission, limit = mission_of("Unlock", 3_000_031)
    task = Task(task_id="babyai/test/unlock-3000031", env=env.name, split=TEST_SPLITS[1], task_type="Unlock",
                goal=mission, payload={"level": "Unlock", "seed": 3_000_031, "max_steps": limit})
    episode = env.open(task)
    observation, steps = expert_episode(episode)
    assert not observation.done and 100 < steps < int(task.payload["max_steps"])
    assert episode.expert_action() is None
    assert episode.step("turn left").admissible_actions  # the game itself is unharmed


def test_a_recoloured_world_renames_every_colour_the_agent_reads_and_nothing_else() -> None:
    """``env.recolour``: the same tasks (ids, seeds, layouts, expert), their colours swapped in
    the mission and in every reply: a changed world for experience learned under the old names."""
    plain, swapped = (BabyAIEnvironment(n_train=8, n_valid=0, n_test=8, recolour=flag) for flag in (False, True))
    assert swapped.protocol_fields() == {**plain.protocol_fields(), "recolour": True}
    assert "recolour" not in plain.protocol_fields()  # earlier runs keep their fields
    words = r"\b(red|green|blue|purple|yellow|grey)\b"
    swap = {"red": "green", "green": "red", "blue": "purple", "purple": "blue", "yellow": "grey", "grey": "yellow"}
    renamed = 0
    for before, after in zip(plain.tasks(TEST_SPLITS[1]) + plain.tasks(TRAIN_SPLIT),
                             swapped.tasks(TEST_SPLITS[1]) + swapped.tasks(TRAIN_SPLIT)):
        assert (before.task_id, before.task_type, before.payload) == (after.task_id, after.task_type, after.payload)
        assert re.sub(words, lambda m: swap[m.group(1)], before.goal) == after.goal
        renamed += before.goal != after.goal
        one, other = plain.open(before), swapped.open(after)
        seen, read = one.reset(), other.reset()
        for _ in range(12):
            assert re.sub(words, lambda m: swap[m.group(1)], seen.text) == read.text
            assert seen.admissible_actions == read.admissible_actions
            if seen.done or one.expert_action() is None:
                break
            action = one.expert_action()
            seen, read = one.step(action), other.step(action)
        assert play_expert(swapped, after)[0]  # the world itself is unchanged
    assert renamed  # the missions do name colours
