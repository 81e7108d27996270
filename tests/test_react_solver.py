"""The reasoning solver (``solver.mode: react``): free-text reasoning and an action in tags, the
action mapped to an admissible one, invalid actions counted, and RL trained on every token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.core.contract.types import Observation, Step, Task, Trajectory
from arena.core.execution.solver import build_prompt, parse_action, well_formed
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from tests.helpers.overrides import SKILLRL_TINY
from tests.helpers.runs import learned_metrics

ADMISSIBLE = ("go to fridge 1", "open fridge 1", "look")
#: The household worlds' system prompts, word for word as before environments owned them (the
#: runs on the committed boards were made with them).
SYSTEM_PROMPT = (
    "You are an agent in a household. Each turn you read an observation and reply with exactly one "
    "of the admissible actions, copied verbatim. Reach the task's goal in as few steps as possible."
)
REACT_SYSTEM_PROMPT = (
    "You are an agent in a household. Each turn you read an observation and the admissible "
    "actions. First think about the situation inside <reasoning> and </reasoning>, then give "
    "exactly one admissible action, copied verbatim, inside <action> and </action>. Reach the "
    "task's goal in as few steps as possible."
)
TINY = ["llm.model=tiny", "llm.dtype=float32", "embedder.name=hashing", "env.n_train=8",
        "env.n_valid=4", "env.n_test=4", "eval.limit=1", "eval.max_steps=3", "learn.max_steps=3",
        "solver.mode=react", "solver.reasoning_max_tokens=12"]


@pytest.mark.parametrize("reply, action", [
    ("<reasoning>The apple may be cold.</reasoning><action>go to fridge 1</action>", "go to fridge 1"),
    ("<reasoning>x</reasoning>\n<action> Open  Fridge-1. </action>", "open fridge 1"),
    ("<action>look</action> then <action>go to fridge 1</action>", "go to fridge 1"),  # the last
    ("<reasoning>unfinished <action>open fridge 1", "open fridge 1"),  # cut by the token limit
    ("<action>fly to the moon</action>", "fly to the moon"),  # invalid: played as written
    ("go to fridge 1", "go to fridge 1"),  # no tag at all: the reply itself
])
def test_parse_action_maps_to_an_admissible_one(reply: str, action: str) -> None:
    assert parse_action(reply, ADMISSIBLE) == action


def test_react_prompts_ask_for_tags_and_replay_what_was_written() -> None:
    task = Task(task_id="t", env="household", split="train", task_type="pick", goal="put a mug")
    written = "<reasoning>The mug may be in the fridge.</reasoning><action>go to fridge 1</action>"
    trajectory = Trajectory(task=task, initial_observation="You are in a room.",
                            steps=[Step("go to fridge 1", "You arrive at fridge 1.", True, thought=written)])
    observation = Observation(text="You arrive at fridge 1.", admissible_actions=ADMISSIBLE)
    common = dict(history=2, show_admissible=True, max_experiences=4, max_experience_chars=800,
                  instructions=HOUSEHOLD_INSTRUCTIONS)
    chat = build_prompt(task, observation, trajectory, [], layout="transcript",
                        admissible_shown=[list(ADMISSIBLE)] * 2, mode="react", **common)
    assert chat[0]["content"] == REACT_SYSTEM_PROMPT and chat[2] == {"role": "assistant", "content": written}
    plain = build_prompt(task, observation, trajectory, [], layout="transcript",
                         admissible_shown=[list(ADMISSIBLE)] * 2, **common)
    assert plain[0]["content"] == SYSTEM_PROMPT and plain[2]["content"] == "go to fridge 1"
    window = build_prompt(task, observation, trajectory, [], mode="react", **common)
    assert window[-1]["content"].endswith("Your reasoning and next action:")
    with pytest.raises(ValueError, match="Unknown solver.mode 'reason'"):
        build_prompt(task, observation, trajectory, [], mode="reason", **common)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_base_plays_whole_react_episodes_with_the_tiny_model(plugins: Plugins, tmp_path: Path) -> None:
    path, results = protocol.run("base", overrides=TINY, out=tmp_path / "b", plugins=plugins)
    assert results.valid and results.solver.mode == "react"
    played = lines(path / "trajectories.jsonl")
    steps = [s for t in played for s in t["steps"]]
    assert len(played) == 2 and len(steps) >= 2
    assert all(s["thought"] for s in steps)  # the reply as written
    assert all(t["tokens_out"] > 0 for t in played)
    # the random tiny model names no admissible action: played as written, counted invalid
    assert all((s["valid"] is False) == (s["observation"] == "Nothing happens.") for s in steps)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "evolving_rl"])
def test_rl_trains_on_every_generated_token_of_react_episodes(plugins: Plugins, tmp_path: Path,
                                                              method: str) -> None:
    overrides = TINY + ["method.iterations=1", "method.n_sources=2", "method.group_size=2",
                        "method.n_skills=2", "method.k_downstream=1", "method.extractor_max_tokens=8",
                        "learn.sampling.temperature=1.0", "method.trainer.micro_batch_size=8"]
    path, results = protocol.run(method, overrides=overrides, out=tmp_path / "g", plugins=plugins)
    assert results.learn.used["gradient_steps"] == 1
    trained_on = "/rollout" if method == "grpo" else "/skill"  # sources are not trained on
    learned = [e for e in lines(path / "episodes.jsonl")
               if e["phase"] == "learn" and trained_on in e["variant"]]
    generated = sum(e["tokens_out"] for e in learned)
    steps = sum(e["steps"] for e in learned)
    assert learned and generated > steps  # more than one token a decision: reasoning is generated
    # every generated token is trained on (one decision sample per step, all its tokens)
    assert learned_metrics(path)[0]["solver/n_tokens"] == generated


@pytest.mark.slow
def test_skillrl_runs_and_trains_with_the_react_solver_on_the_tiny_model(plugins: Plugins,
                                                                         tmp_path: Path) -> None:
    overrides = SKILLRL_TINY + ["llm.dtype=float32", "solver.mode=react",
                                "solver.reasoning_max_tokens=8"]
    path, results = protocol.run("skillrl", overrides=overrides, out=tmp_path / "s", plugins=plugins)
    assert results.valid and results.solver.mode == "react"
    state = json.loads((path / "method" / "state.json").read_text())
    assert state["stage"] == "done" and state["steps_done"] == 1
    assert learned_metrics(path)[0]["samples"] > 0  # the RL step trained on react decisions
    # SFT taught the form the react prompt asks for (sft.target auto): reasoning and action tags.
    rows = [row for demo in (path / "method" / "demos").glob("*.json")
            for row in json.loads(demo.read_text())["rows"]]
    assert rows and all(well_formed(row["completion"][0]["content"]) for row in rows)
    evaluated = [e for e in lines(path / "episodes.jsonl") if e["phase"] != "learn"]
    assert evaluated and all(e["steps"] > 0 and e["tokens_out"] > 0 for e in evaluated)
