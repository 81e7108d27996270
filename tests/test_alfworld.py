"""The real ALFWorld environment: data command, splits, walkthrough replays, progress, workers.

The games are never in this repository: tests that need them unpack the archives of
``../shared/data/alfworld/`` (beside the repository) once per session and skip, saying so, where
that folder is absent; tests that play games also skip where ``alfworld`` is not installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import random
import subprocess
import sys
import tarfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core import protocol
from arena.core.contract.env import TEST_SPLITS, TRAIN_SPLIT, VALID_SPLIT
from arena.envs import alfworld_tasks
from arena.envs.alfworld import data
from arena.envs.alfworld.environment import (
    AlfworldEnvironment,
    AlfworldNotInstalled,
    missing_engine_packages,
)
from arena.envs.alfworld.plugin import make_alfworld

REPO = Path(__file__).resolve().parents[1]
SHARED_ARCHIVES = REPO.parent / "shared" / "data" / "alfworld"
ENGINE_MISSING = missing_engine_packages()
needs_engine = pytest.mark.skipif(
    bool(ENGINE_MISSING),
    reason=f"{' and '.join(ENGINE_MISSING)} not installed: pip install 'arena[alfworld]'",
)


@pytest.fixture(scope="session")
def real_data(tmp_path_factory) -> Path:
    """The three real archives, verified against the pinned checksums and unpacked once."""
    if not all((SHARED_ARCHIVES / name).is_file() for name in data.ARCHIVES.values()):
        pytest.skip(f"ALFWorld archives not found in {SHARED_ARCHIVES} (the tests read them from "
                    "../shared/data/alfworld/ beside the repository)")
    root = tmp_path_factory.mktemp("alfworld-data")
    data.install(str(SHARED_ARCHIVES), root)
    return root


@pytest.fixture(scope="session")
def archive_listing() -> dict[str, list[str]]:
    """Game ids per ALFWorld split read from the archives themselves (independent of the loader)."""
    if not SHARED_ARCHIVES.is_dir():
        pytest.skip(f"ALFWorld archives not found in {SHARED_ARCHIVES}")
    listing = {}
    for split, name in data.ARCHIVES.items():
        with tarfile.open(SHARED_ARCHIVES / name) as tar:
            listing[split] = sorted(
                member.rsplit("/", 1)[0].split("/", 2)[2]
                for member in tar.getnames() if member.endswith("/game.tw-pddl")
            )
    return listing


# -- constructed archives ---------------------------------------------------------------------


def fake_game(goal: str) -> str:
    grammar = 'grammar :: """{"task": [{"rhs": "Your task is to: ' + goal + '"}]}"""'
    return json.dumps({"grammar": grammar, "pddl_problem": "(define)", "solvable": True,
                       "walkthrough": ["look"]})


def write_archive(folder: Path, split: str, games: dict[str, str], extra: dict[str, str] | None = None) -> str:
    """A ``<split>.tar.xz`` of fake games ({"task_folder/trial": goal}); returns its sha256."""
    path = folder / data.ARCHIVES[split]
    with tarfile.open(path, "w:xz") as tar:
        members = {f"{data.RELEASE}/{split}/{game}/game.tw-pddl": fake_game(goal)
                   for game, goal in games.items()}
        members.update(extra or {})
        for name, text in members.items():
            blob = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return hashlib.sha256(path.read_bytes()).hexdigest()


FAKE_GAMES = {
    "train": {"pick_and_place_simple-Book-None-Bed-1/trial_a": "put some book on bed.",
              "pick_two_obj_and_place-Pen-None-Desk-2/trial_b": "put two pen in desk."},
    "valid_seen": {"pick_heat_then_place_in_recep-Egg-None-Fridge-3/trial_c": "heat some egg and put it in fridge."},
    "valid_unseen": {"pick_cool_then_place_in_recep-Apple-None-Table-4/trial_d": "cool some apple and put it in table.",
                     "look_at_obj_in_light-Cd-None-DeskLamp-5/trial_e": "look at cd under the desklamp."},
}


@pytest.fixture
def fake_source(tmp_path) -> tuple[Path, dict[str, str]]:
    source = tmp_path / "source"
    source.mkdir()
    sums = {data.ARCHIVES[split]: write_archive(source, split, games) for split, games in FAKE_GAMES.items()}
    (source / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums.items()))
    return source, sums


def test_install_verifies_and_unpacks_constructed_archives(fake_source, tmp_path):
    source, sums = fake_source
    dest = tmp_path / "data"
    installed = data.install(str(source), dest, checksums=sums)
    assert {item.split: item.games for item in installed} == {s: len(g) for s, g in FAKE_GAMES.items()}
    assert data.data_status(dest) == {s: len(g) for s, g in FAKE_GAMES.items()}
    manifest = json.loads((dest / data.MANIFEST).read_text())
    assert manifest["valid_seen"]["sha256"] == sums["valid_seen.tar.xz"]
    games = data.scan_games(dest, "valid_unseen")
    assert [(g.task_type, g.goal) for g in games] == [
        ("look_at_obj_in_light", "look at cd under the desklamp."),
        ("pick_cool_then_place_in_recep", "cool some apple and put it in table."),
    ]
    assert not list(dest.glob(".arena-alfworld-*"))  # the work folder is gone
    # Installed splits are kept unless --force.
    assert data.install(str(source), dest, checksums=sums) == []
    assert len(data.install(str(source), dest, checksums=sums, force=True)) == 3


def test_install_from_a_url(fake_source, tmp_path):
    source, sums = fake_source
    dest = tmp_path / "data"
    data.install(source.as_uri(), dest, splits=["valid_seen"], checksums=sums)
    assert data.data_status(dest)["valid_seen"] == 1
    with pytest.raises(data.AlfworldDataError, match="Could not download .*nowhere/train.tar.xz"):
        data.install((tmp_path / "nowhere").as_uri(), dest, checksums=sums)


def test_checksum_mismatch_installs_nothing(fake_source, tmp_path):
    source, _ = fake_source
    dest = tmp_path / "data"
    with pytest.raises(data.AlfworldDataError, match="Checksum mismatch for train.tar.xz") as raised:
        data.install(str(source), dest)  # the pinned checksums of the real release
    assert "nothing was installed" in str(raised.value) and "--checksums" in str(raised.value)
    assert data.data_status(dest) == {split: 0 for split in data.ALFWORLD_SPLITS}


def test_missing_archive_and_foreign_members_are_named(fake_source, tmp_path):
    source, sums = fake_source
    (source / "valid_unseen.tar.xz").unlink()
    with pytest.raises(data.AlfworldDataError, match=f"valid_unseen.tar.xz not found in {source}"):
        data.install(str(source), tmp_path / "a", checksums=sums)
    sums["valid_unseen.tar.xz"] = write_archive(
        source, "valid_unseen", FAKE_GAMES["valid_unseen"], extra={f"{data.RELEASE}/train/x.txt": "x"}
    )
    with pytest.raises(data.AlfworldDataError, match="holds files outside json_2.1.1/valid_unseen/"):
        data.install(str(source), tmp_path / "b", checksums=sums)
    assert data.data_status(tmp_path / "b")["valid_unseen"] == 0


def test_missing_data_names_the_splits_and_the_command(tmp_path):
    empty = tmp_path / "empty"
    with pytest.raises(data.AlfworldDataError) as raised:
        data.require_data(empty, source="$ALFWORLD_DATA")
    message = str(raised.value)
    for split in data.ALFWORLD_SPLITS:
        assert f"json_2.1.1/{split}/" in message
    assert "arena data alfworld --from PATH_OR_URL" in message and "$ALFWORLD_DATA" in message
    with pytest.raises(data.AlfworldDataError, match="arena data alfworld"):
        AlfworldEnvironment(empty).tasks("test_seen")
    if not ENGINE_MISSING:
        with pytest.raises(data.AlfworldDataError, match="json_2.1.1/train/"):
            make_alfworld({"data_dir": str(empty)})


def test_data_folder_comes_from_config_then_alfworld_data_then_user_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert data.resolve_data_dir(None) == (tmp_path / "xdg" / "arena" / "alfworld", data.DEFAULT_SOURCE)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alf"))
    assert data.resolve_data_dir(None) == (tmp_path / "alf", "$ALFWORLD_DATA")
    assert data.resolve_data_dir(str(tmp_path / "cfg")) == (tmp_path / "cfg", "env.data_dir")


def test_data_command(fake_source, tmp_path):
    source, _sums = fake_source
    dest = tmp_path / "data"
    runner = CliRunner()
    status = runner.invoke(cli, ["data", "alfworld", "--to", str(dest)])
    assert status.exit_code == 1 and "train         missing" in status.output
    assert "arena data alfworld --from PATH_OR_URL" in status.output
    refused = runner.invoke(cli, ["data", "alfworld", "--from", str(source), "--to", str(dest)])
    assert refused.exit_code != 0 and "Checksum mismatch" in refused.output
    done = runner.invoke(cli, ["data", "alfworld", "--from", str(source), "--to", str(dest),
                               "--checksums", str(source / "SHA256SUMS")])
    assert done.exit_code == 0, done.output
    assert "valid_unseen: 2 games installed" in done.output and "verified valid_seen.tar.xz" in done.output


def test_type_split_on_constructed_games(fake_source, tmp_path):
    source, sums = fake_source
    data.install(str(source), tmp_path / "data", checksums=sums)
    env = AlfworldEnvironment(tmp_path / "data")
    ids = {split: [t.task_id for t in env.tasks(split)] for split in env.split_names()}
    assert ids == {
        TRAIN_SPLIT: ["alfworld/train/pick_and_place_simple-Book-None-Bed-1/trial_a"],
        VALID_SPLIT: ["alfworld/valid_seen/pick_heat_then_place_in_recep-Egg-None-Fridge-3/trial_c"],
        TEST_SPLITS[0]: ["alfworld/valid_unseen/pick_cool_then_place_in_recep-Apple-None-Table-4/trial_d"],
        TEST_SPLITS[1]: ["alfworld/valid_unseen/look_at_obj_in_light-Cd-None-DeskLamp-5/trial_e"],
    }


def test_plugin_imports_without_alfworld(monkeypatch):
    code = (
        "import sys; sys.modules['textworld'] = None; sys.modules['alfworld'] = None\n"
        "import arena.envs.alfworld.plugin as plugin\n"
        "from arena.envs.alfworld.environment import AlfworldNotInstalled\n"
        "assert 'textworld' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    plugin.make_alfworld({})\nexcept AlfworldNotInstalled as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "textworld and alfworld" in result.stdout and "pip install 'arena[alfworld]'" in result.stdout
    monkeypatch.setitem(sys.modules, "textworld", None)
    with pytest.raises(AlfworldNotInstalled, match=r"pip install 'arena\[alfworld\]'"):
        make_alfworld({})


def test_alfworld_is_a_registered_environment(plugins):
    entry = plugins.envs.get("alfworld")
    assert entry.factory is make_alfworld and entry.configs[0].name == "config.yaml"


# -- the real games ---------------------------------------------------------------------------


def test_splits_match_the_archives(real_data, archive_listing):
    for split, expected in data.EXPECTED_GAMES.items():
        assert len(archive_listing[split]) == expected  # the counts the data README states
    by_type: dict[tuple[str, str], set[str]] = defaultdict(set)
    for split, games in archive_listing.items():
        for game in games:
            by_type[split, game.split("-", 1)[0]].add(f"alfworld/{split}/{game}")

    def union(split: str, types: tuple[str, ...]) -> set[str]:
        return set().union(*(by_type[split, t] for t in types))

    env = AlfworldEnvironment(real_data)
    ids = {split: [t.task_id for t in env.tasks(split)] for split in env.split_names()}
    assert env.split_names() == [TRAIN_SPLIT, VALID_SPLIT, *TEST_SPLITS]
    assert set(ids[TRAIN_SPLIT]) == union("train", data.SEEN_TYPES)
    assert set(ids[VALID_SPLIT]) == union("valid_seen", data.SEEN_TYPES)
    assert set(ids[TEST_SPLITS[0]]) == union("valid_unseen", data.SEEN_TYPES)
    assert set(ids[TEST_SPLITS[1]]) == union("valid_unseen", data.UNSEEN_TYPES)
    assert set(ids[TEST_SPLITS[0]]) | set(ids[TEST_SPLITS[1]]) == union("valid_unseen", data.TASK_TYPES)
    assert all(len(set(v)) == len(v) for v in ids.values())
    # The test-time source pool: train's games of the held-out types (never a test game).
    assert {t.task_id for t in env.pool_tasks()} == union("train", data.UNSEEN_TYPES)
    assert {t.split for t in env.pool_tasks()} == {"pool"}
    for split in (TRAIN_SPLIT, VALID_SPLIT, *TEST_SPLITS):
        for task in env.tasks(split):
            assert task.split == split and task.task_id.split("/")[2].startswith(task.task_type)
            assert (real_data / task.payload["game"]).is_file() and task.goal.endswith(".")
    standard = AlfworldEnvironment(real_data, split_scheme="alfworld")
    assert standard.split_names() == [TRAIN_SPLIT, *TEST_SPLITS]
    assert {t.task_id for t in standard.tasks(TRAIN_SPLIT)} == union("train", data.TASK_TYPES)
    assert {t.task_id for t in standard.tasks(TEST_SPLITS[0])} == union("valid_seen", data.TASK_TYPES)
    assert {t.task_id for t in standard.tasks(TEST_SPLITS[1])} == union("valid_unseen", data.TASK_TYPES)
    assert standard.pool_tasks() == []  # its train split already holds every type
    with pytest.raises(ValueError, match="available splits: train, test_seen, test_unseen"):
        standard.tasks(VALID_SPLIT)


def sample_types(env: AlfworldEnvironment, alfworld_split: str, types: tuple[str, ...], seed: int = 0) -> list:
    """One game of each of ``types``, drawn with a fixed seed."""
    rng = random.Random(seed)
    by_type = defaultdict(list)
    for task in env.all_tasks(alfworld_split):
        by_type[task.task_type].append(task)
    return [rng.choice(by_type[t]) for t in types]


def replay_expert(episode) -> tuple[list, list[str]]:
    observations = [episode.reset()]
    actions = []
    while not observations[-1].done:
        action = episode.expert_action()
        assert action in observations[-1].admissible_actions
        actions.append(action)
        observations.append(episode.step(action))
    return observations, actions


@pytest.mark.slow
@needs_engine
def test_walkthroughs_win_a_sample_of_valid_seen_and_valid_unseen(real_data):
    env = AlfworldEnvironment(real_data)
    # Every task type once, half of them from each split (a game takes 1-3 s to load and play).
    sample = (sample_types(env, "valid_seen", data.TASK_TYPES[0::2])
              + sample_types(env, "valid_unseen", data.TASK_TYPES[1::2]))
    assert len({t.task_type for t in sample}) == len(data.TASK_TYPES)
    for task in sample:
        episode = env.open(task)
        observations, actions = replay_expert(episode)
        episode.close()
        first, last = observations[0], observations[-1]
        assert first.text.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert f"Your task is to: {task.goal}" in first.text
        assert last.won and last.done and last.progress == 1.0, task.task_id
        assert sum(o.reward for o in observations) == 1.0
        assert not any(o.won for o in observations[:-1])
        assert len(actions) < env.max_steps


@pytest.mark.slow
@needs_engine
def test_progress_marks_the_subgoals_of_a_heat_task(real_data):
    env = AlfworldEnvironment(real_data)
    task = next(t for t in env.tasks(TEST_SPLITS[0]) if t.task_type == alfworld_tasks.HEAT_AND_PLACE)
    episode = env.open(task)
    observations, actions = replay_expert(episode)
    episode.close()
    progress = dict(zip(actions, (o.progress for o in observations[1:])))
    take = next(a for a in actions if a.startswith("take "))
    heat = next(a for a in actions if a.startswith("heat "))
    assert observations[0].progress == 0.0
    assert progress[take] == pytest.approx(1 / 3) and progress[heat] == pytest.approx(2 / 3)
    assert observations[-1].progress == 1.0


@pytest.mark.slow
@needs_engine
def test_max_steps_ends_the_episode_and_bad_commands_change_nothing(real_data):
    env = AlfworldEnvironment(real_data, max_steps=3)
    episode = env.open(env.tasks(TEST_SPLITS[1])[0])
    start = episode.reset()
    replies = [episode.step("dance with the fridge") for _ in range(3)]
    assert [r.text for r in replies] == ["Nothing happens."] * 3
    assert all(r.admissible_actions == start.admissible_actions for r in replies)
    assert [r.done for r in replies] == [False, False, True] and not replies[-1].won
    assert [r.truncated for r in replies] == [False, False, True]  # ended by the limit, not lost
    with pytest.raises(RuntimeError, match="is over"):
        episode.step("look")
    episode.close()


@pytest.mark.slow
@needs_engine
def test_expert_replans_after_a_detour(real_data):
    env = AlfworldEnvironment(real_data)
    task = next(t for t in env.tasks(TEST_SPLITS[0]) if t.task_type == alfworld_tasks.CLEAN_AND_PLACE)
    episode = env.open(task)
    observation = episode.reset()
    walkthrough_first = episode.expert_action()
    detour = next(a for a in observation.admissible_actions if a.startswith("go to") and a != walkthrough_first)
    observation = episode.step(detour)
    steps = 1
    while not observation.done:
        observation = episode.step(episode.expert_action())
        steps += 1
    episode.close()
    assert observation.won and steps < env.max_steps


def scripted_play(env, task) -> list:
    """The walkthrough with an inadmissible command and a look spliced in."""
    episode = env.open(task)
    seen = [episode.reset()]
    number = 0
    while not seen[-1].done:
        if number == 1:
            seen.append(episode.step("jump over the table"))
        elif number == 2:
            seen.append(episode.step("look"))
        seen.append(episode.step(episode.expert_action()))
        number += 1
    episode.close()
    return seen


@pytest.mark.slow
@needs_engine
def test_workers_give_the_same_observations_as_in_process(real_data):
    local = make_alfworld({"data_dir": str(real_data), "workers": 0})
    tasks = [local.tasks(TEST_SPLITS[0])[3], local.tasks(TEST_SPLITS[1])[3]]
    remote = make_alfworld({"data_dir": str(real_data), "workers": 2})
    try:
        assert remote.tasks(TEST_SPLITS[1]) == local.tasks(TEST_SPLITS[1])
        with ThreadPoolExecutor(max_workers=2) as pool:
            in_workers = list(pool.map(lambda task: scripted_play(remote, task), tasks))
        assert len(set(remote.worker_pids())) == 2
    finally:
        remote.close()
    with ThreadPoolExecutor(max_workers=2) as pool:  # in-process games in threads take turns
        in_process = list(pool.map(lambda task: scripted_play(local, task), tasks))
    assert in_workers == in_process
    assert all(seen[-1].won for seen in in_workers)


@pytest.mark.slow
@needs_engine
def test_base_method_runs_on_alfworld_with_workers(real_data, plugins, tmp_path):
    overrides = [
        "llm.backend=fake", "embedder.name=hashing", f"env.data_dir={real_data}", "env.workers=2",
        "eval.limit=2", "eval.max_steps=4", "eval.concurrency=4",
    ]
    path, results = protocol.run("base", env="alfworld", overrides=overrides, out=tmp_path / "run",
                                 plugins=plugins)
    assert results.valid and results.env == "alfworld"
    assert {split: s.n_episodes for split, s in results.splits.items()} == {
        TEST_SPLITS[0]: 2, TEST_SPLITS[1]: 2}
    assert results.provenance.env_version.startswith(data.RELEASE)
    assert set(results.provenance.split_hashes) == {TRAIN_SPLIT, VALID_SPLIT, *TEST_SPLITS}
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and all(e["error"] is None for e in episodes)
    assert all(e["steps"] <= 4 and e["task_id"].startswith("alfworld/valid_unseen/") for e in episodes)


@pytest.mark.slow
@needs_engine
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed: pip install 'arena[ray]'")
def test_ray_executor_plays_alfworld_as_its_workers_do(real_data, plugins, tmp_path):
    """The games in Ray actors (each plays in-process: env.workers=0 inside an actor) give the
    same episodes as the environment's own worker processes."""
    overrides = [
        "llm.backend=fake", "embedder.name=hashing", f"env.data_dir={real_data}", "env.workers=2",
        "eval.limit=2", "eval.max_steps=6", "eval.concurrency=2",
    ]
    runs = {}
    for executor in ("local", "ray"):
        path, results = protocol.run("base", env="alfworld", out=tmp_path / executor, plugins=plugins,
                                     overrides=[*overrides, f"executor.name={executor}",
                                                "executor.ray.num_cpus=2"])
        episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
        runs[executor] = {(e["split"], e["task_id"]): {k: v for k, v in e.items() if k not in ("wall_s", "chain", "phase_cost")}
                          for e in episodes}
        assert results.valid and all(e["error"] is None for e in episodes)
    assert len(runs["ray"]) == 4 and runs["ray"] == runs["local"]
