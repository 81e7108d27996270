"""``eval.salt``: test layouts drawn from a salt the method never sees (arena.core.execution.salt)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.contract.env import SALTED_SEED_BASE, TEST_SPLITS, SaltUnsupported
from arena.core.execution.salt import SaltError
from arena.envs.household.environment import HouseholdEnvironment
from tests.helpers.methods import WorldRebuilder
from tests.helpers.runs import register

SMALL = {"n_train": 12, "n_valid": 4, "n_test": 6}


def layouts(env: HouseholdEnvironment, split: str) -> list[int]:
    return [int(task.payload["layout_seed"]) for task in env.tasks(split)]


def test_a_salt_redraws_the_test_rooms_only_and_keeps_ids_and_types():
    public, salted, again, other = (HouseholdEnvironment(**SMALL) for _ in range(4))
    salted.draw_tests_with("abc")
    again.draw_tests_with("abc")
    other.draw_tests_with("xyz")
    for split in ("train", "valid"):
        assert salted.tasks(split) == public.tasks(split)
    for split in TEST_SPLITS:
        assert [t.task_id for t in salted.tasks(split)] == [t.task_id for t in public.tasks(split)]
        assert [t.task_type for t in salted.tasks(split)] == [t.task_type for t in public.tasks(split)]
        assert salted.tasks(split) == again.tasks(split)  # the salt alone decides
        assert not set(layouts(salted, split)) & set(layouts(public, split))
        assert not set(layouts(salted, split)) & set(layouts(other, split))
        assert min(layouts(salted, split)) >= SALTED_SEED_BASE  # never a public room of any split
        assert salted.split_hash(split) != public.split_hash(split)
        episode = salted.open(salted.tasks(split)[0])  # a salted room plays
        assert episode.reset().text


def test_babyai_draws_its_test_seeds_from_the_salt():
    from arena.envs.babyai.environment import BabyAIEnvironment

    public, salted = BabyAIEnvironment(n_train=2, n_valid=1, n_test=2), BabyAIEnvironment(n_train=2, n_valid=1, n_test=2)
    salted.draw_tests_with("abc")
    assert salted.tasks("train") == public.tasks("train")
    seeds = [t.payload["seed"] for t in salted.tasks("test_seen")]
    assert all(seed >= SALTED_SEED_BASE for seed in seeds)
    assert seeds != [t.payload["seed"] for t in public.tasks("test_seen")]


def test_an_environment_of_fixed_test_data_refuses_a_salt():
    from arena.envs.alfworld.environment import AlfworldEnvironment

    with pytest.raises(SaltUnsupported, match="set eval.salt=public"):
        AlfworldEnvironment.draw_tests_with(object.__new__(AlfworldEnvironment), "abc")


def test_a_secret_salt_is_drawn_kept_out_of_the_record_and_reused_on_resume(plugins, fast, tmp_path):
    path, results = protocol.run("base", overrides=fast + ["eval.limit=1", "eval.salt=secret"],
                                 out=tmp_path / "r", plugins=plugins)
    salt_file = Path(path) / "eval_salt"
    salt = salt_file.read_text().strip()
    assert len(salt) == 32 and stat.S_IMODE(os.stat(salt_file).st_mode) == 0o600
    assert results.protocol.eval_salt.startswith("secret:")
    for name in ("config.yaml", "results.json", "episodes.jsonl", "trajectories.jsonl", "state.json"):
        assert salt not in (Path(path) / name).read_text(), name
    _, again = protocol.run("base", overrides=fast + ["eval.limit=1", "eval.salt=secret"],
                                     out=tmp_path / "s", plugins=plugins)
    assert again.protocol.eval_salt != results.protocol.eval_salt  # a new draw each run
    assert again.provenance.split_hashes["test_seen"] != results.provenance.split_hashes["test_seen"]
    public_path, public = protocol.run("base", overrides=fast + ["eval.limit=1"], out=tmp_path / "p",
                                       plugins=plugins)
    assert public.protocol.eval_salt == "public" and not (Path(public_path) / "eval_salt").exists()


def test_isolation_draws_a_secret_salt_unless_told(plugins, fast, tmp_path, monkeypatch):
    _, isolated = protocol.run("base", overrides=fast + ["eval.limit=1", "run.isolation=process"],
                               out=tmp_path / "i", plugins=plugins)
    assert isolated.protocol.eval_salt.startswith("secret:")
    _, named = protocol.run("base", overrides=fast + ["eval.limit=1", "eval.salt=season-2026"],
                            out=tmp_path / "n", plugins=plugins)
    assert named.protocol.eval_salt.startswith("board:")  # a named draw, public in the config
    monkeypatch.setenv("BOARD_SALT", "a private one")
    board_path, board = protocol.run("base", overrides=fast + ["eval.limit=1", "eval.salt=env:BOARD_SALT"],
                                     out=tmp_path / "b", plugins=plugins)
    assert board.protocol.eval_salt.startswith("board:")
    assert all("a private one" not in path.read_text() for path in Path(board_path).glob("*.*"))
    _, again = protocol.run("base", overrides=fast + ["eval.limit=1", "eval.salt=env:BOARD_SALT"],
                            out=tmp_path / "c", plugins=plugins)
    assert again.protocol.eval_salt == board.protocol.eval_salt  # one board, one draw
    assert again.provenance.split_hashes == board.provenance.split_hashes
    monkeypatch.delenv("BOARD_SALT")
    with pytest.raises(SaltError, match="export BOARD_SALT="):
        protocol.run("base", overrides=fast + ["eval.limit=1", "eval.salt=env:BOARD_SALT"],
                     out=tmp_path / "d", plugins=plugins)


# -- a method that rebuilds the world from its own import of Arena's environment code -----------


@pytest.mark.slow
def test_a_world_rebuilt_by_import_wins_in_public_and_fails_on_a_secret_draw(plugins, fast, tmp_path):
    register(plugins, rebuilder=WorldRebuilder)
    settings = fast + ["eval.limit=2"]
    _, public = protocol.run("rebuilder", overrides=settings + ["eval.salt=public"], out=tmp_path / "p",
                             plugins=plugins)
    _, isolated = protocol.run("rebuilder", overrides=settings + ["run.isolation=process"], out=tmp_path / "i",
                               plugins=plugins)
    rates = {name: [r.splits[s].success_rate for s in TEST_SPLITS] for name, r in
             (("public", public), ("isolated", isolated))}
    assert min(rates["public"]) >= 0.5, rates  # the attack works where the draw is public (12 steps)
    assert rates["isolated"] == [0.0, 0.0], rates  # and not on the run's own secret draw


def test_an_environment_that_refuses_a_salt_leaves_no_run_directory(plugins, fast, tmp_path, monkeypatch):
    """As ALFWorld does under run.isolation=process (whose salt is secret unless told)."""
    from arena.core.contract.env import Environment

    monkeypatch.setattr(HouseholdEnvironment, "draw_tests_with", Environment.draw_tests_with)
    with pytest.raises(SaltUnsupported, match="set eval.salt=public"):
        protocol.run("base", overrides=fast + ["eval.limit=1", "run.isolation=process"], out=tmp_path / "r",
                     plugins=plugins)
    assert not (tmp_path / "r").exists()
