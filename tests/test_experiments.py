"""``arena experiment``: each arm changes one factor of what a learned method is given, applied
by the harness; arms pair with their control per split and task type."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import arena
from arena.cli import cli
from arena.core import protocol
from arena.report import evaluate_state
from arena.report.experiments import ExperimentError, make_plan, run_experiment, summarise
from arena.report.runs import ReportError, load_run
from tests.helpers.runs import register

NOTE = "note"


class TypeNotes:
    """Learns one note per train task type ("type T"), stored with that type; retrieves the
    notes of the asked task's type. What it is shown says whose experience it got."""

    def __init__(self, run: arena.Run) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run: arena.Run) -> None:
        first: dict[str, arena.Task] = {}
        for task in run.tasks("train"):
            first.setdefault(task.task_type, task)
        run.store.add([arena.Experience(kind=NOTE, text=f"type {t}", metadata={"task_type": t},
                                        provenance=arena.Provenance((task.task_id,), "train"))
                       for t, task in first.items()])

    @arena.hookimpl
    def retrieve(self, run: arena.Run, task: arena.Task) -> list[arena.Experience]:
        return run.store.all(kind=NOTE, where={"task_type": task.task_type})

    @arena.hookimpl
    def export(self, run: arena.Run) -> list[arena.Experience]:
        return run.store.all(kind=NOTE)


class NotesInSolve(TypeNotes):
    """The same notes, looked up inside ``solve`` (as Evolving-RL picks its source game), for
    the task ``run.experience_task`` names."""

    @arena.hookimpl
    def retrieve(self, run: arena.Run, task: arena.Task) -> list[arena.Experience]:
        return []

    @arena.hookimpl
    def solve(self, run: arena.Run, task: arena.Task, experiences: list[arena.Experience],
              seed: int) -> arena.Trajectory:
        source = run.experience_task(task)
        found = [] if source is None else run.store.all(kind=NOTE, where={"task_type": source.task_type})
        return run.play(arena.EpisodeRequest(task, found, seed, policy=arena.STANDARD))


@pytest.fixture
def learned(plugins, fast, tmp_path):
    """A finished run of TypeNotes and of NotesInSolve (no learning episodes: the notes are
    written by ``learn`` itself)."""
    register(plugins, type_notes=TypeNotes, notes_in_solve=NotesInSolve)
    paths = {}
    for name in ("type_notes", "notes_in_solve"):
        path, results = protocol.run(name, overrides=fast + ["eval.limit=6", "eval.max_steps=3"],
                                     out=tmp_path / name, plugins=plugins)
        assert results.valid, results.violations
        assert results.exported == {NOTE: results.state.memory_items}
        paths[name] = path
    return paths


def shown_types(arm_path):
    """(played task type, [types of the notes it was shown]) per test episode of an arm."""
    from arena.core.services.store import stored_experiences

    notes = {e.experience_id: e.text.removeprefix("type ") for e in stored_experiences(arm_path / "store")}
    shown = []
    for line in (arm_path / "trajectories.jsonl").read_text().splitlines():
        trajectory = json.loads(line)
        if trajectory["key"][0] == "evaluate":
            shown.append((trajectory["task"]["task_type"], [notes[i] for i in trajectory["experience_ids"]]))
    assert shown
    return shown


@pytest.mark.parametrize("method", ["type_notes", "notes_in_solve"])
def test_relevance_gives_own_another_types_or_no_experience(learned, plugins, tmp_path, method):
    plan = make_plan("relevance", learned[method])
    summary = run_experiment(plan, tmp_path / "relevance", plugins=plugins)
    arms = {arm: tmp_path / "relevance" / arm for arm in ("own", "other_type", "none")}
    # Notes exist for train's types only (test_unseen's types have none of their own).
    own, other, none = (shown_types(arms[arm]) for arm in ("own", "other_type", "none"))
    assert all(x == played for played, t in own for x in t) and sum(map(bool, (t for _, t in own))) >= 3
    assert all(x != played for played, t in other for x in t) and sum(map(bool, (t for _, t in other))) >= 3
    assert all(t == [] for _, t in none)
    for arm, path in arms.items():
        run = load_run(path)
        assert run.results.valid, run.results.violations
        assert run.results.experiment["name"] == "relevance"
        assert run.results.experiment["arm"] == arm
        assert run.results.learn.used == load_run(learned[method]).results.learn.used
    assert load_run(arms["own"]).results.protocol.experience is None  # the protocol
    assert load_run(arms["none"]).results.protocol.experience["source"] == "none"
    rows = summary["comparisons"]
    assert {(r["arm"], r["control"]) for r in rows} == {("other_type", "own"), ("none", "own")}
    assert all(r["other_differences"] == [] for r in rows)  # the factor is the only difference
    own_records = load_run(arms["own"]).evaluated()
    for row in rows:  # `none` shows nothing: the same items as `own` exactly where `own` showed none
        if row["arm"] == "none" and row["task_type"] == "all":
            played = [r for r in own_records if r.split == row["split"]]
            assert row["same_experience"] == round(sum(not r.experience_ids for r in played) / len(played), 4)
    assert any(r["same_experience"] < 1 for r in rows if r["arm"] == "other_type")
    splits = {r["split"] for r in rows}
    types = {r["task_type"] for r in rows} - {"all"}
    assert splits == {"test_seen", "test_unseen"} and len(types) >= 2
    for row in rows:  # per type rows add up to the split's
        if row["task_type"] == "all":
            parts = [r for r in rows if r["arm"] == row["arm"] and r["split"] == row["split"]
                     and r["task_type"] != "all"]
            assert sum(p["pairs"] for p in parts) == row["pairs"]


def test_poison_adds_a_share_of_other_types_notes_under_learned_keys(learned, plugins, tmp_path):
    plan = make_plan("poison", learned["type_notes"], fractions=(0.5,))
    assert [arm.name for arm in plan.arms] == ["poison-0", "poison-0.5"]
    run_experiment(plan, tmp_path / "poison", plugins=plugins)
    clean, poisoned = (load_run(tmp_path / "poison" / arm) for arm in ("poison-0", "poison-0.5"))
    assert poisoned.results.valid, poisoned.results.violations
    record = poisoned.results.protocol.experience["poisoned"]
    items = clean.results.state.memory_items
    assert record["clean_items"] == items and record["poison_items"] == items  # half the store
    assert record["from_another_type"] == record["poison_items"]
    assert poisoned.results.state.memory_items == 2 * items
    assert record["digest_clean"] == clean.results.state.digest_before_eval
    from arena.report.experiments import load_experiment
    from arena.report.render import experiment_line
    shown = load_experiment(tmp_path / "poison")
    assert shown.poisoned == {"poison-0.5": {k: v for k, v in record.items() if k != "digest_clean"}}
    assert f"poison-0.5: {items} poison items beside {items} learned, {items} of another task type" in experiment_line(shown)
    assert poisoned.results.state.digest_before_eval != record["digest_clean"]
    # Found where the learned note would be: episodes are shown their own type's note and poison.
    misled = [t for played, t in shown_types(tmp_path / "poison" / "poison-0.5") if any(x != played for x in t)]
    assert misled
    assert all(x == played for played, t in shown_types(tmp_path / "poison" / "poison-0") for x in t)
    from arena.core.services.store import stored_experiences
    assert not any("poison" in e.experience_id for e in stored_experiences(tmp_path / "poison" / "poison-0.5" / "store"))


def test_poison_killed_while_poisoning_is_poisoned_once_and_a_share_that_adds_nothing_is_refused(
        learned, plugins, fast, tmp_path, monkeypatch):
    from arena.core.storage.ledger import Ledger

    source = learned["type_notes"]
    items = load_run(source).results.state.memory_items
    plan = make_plan("poison", source, fractions=(0.5,))

    def killed_after_adding(self, summary, digest):
        raise KeyboardInterrupt  # the poison items are in the store; the state does not say so

    with monkeypatch.context() as patched:
        patched.setattr(Ledger, "poisoned", killed_after_adding)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(plan, tmp_path / "poison", plugins=plugins)
    run_experiment(plan, tmp_path / "poison", plugins=plugins)
    poisoned = load_run(tmp_path / "poison" / "poison-0.5")
    assert poisoned.results.valid, poisoned.results.violations
    record = poisoned.results.protocol.experience["poisoned"]
    assert record["clean_items"] == items and record["poison_items"] == items
    assert poisoned.results.state.memory_items == 2 * items  # not poisoned twice
    smallest_empty = 0.4 / items  # rounds to no item in a store of `items`
    with pytest.raises(ExperimentError, match=r"--fraction .* add no item to .* store of \d+ items: give --fraction F of at"):
        make_plan("poison", source, fractions=(smallest_empty,))
    _, direct = protocol.run("type_notes", overrides=[*fast, "eval.limit=2", f"eval.experience.poison={smallest_empty}"],
                             out=tmp_path / "direct", plugins=plugins)  # a run by itself: none added, and said
    assert direct.valid and direct.protocol.experience["poisoned"]["poison_items"] == 0


#: The state entry of a learned state evaluated with another model (arena.core.storage.ledger.ModelChange).
MODEL_CHANGED = "model_changed"


def test_transfer_evaluates_another_model_with_and_without_the_experience(learned, plugins, tmp_path):
    plan = make_plan("transfer", learned["type_notes"], model=("llm.reply=Another model.",))
    summary = run_experiment(plan, tmp_path / "transfer", plugins=plugins)
    for arm in ("with", "without"):
        run = load_run(tmp_path / "transfer" / arm)
        assert run.results.valid, run.results.violations
        assert run.config["llm"]["reply"] == "Another model."
    assert any(t for _, t in shown_types(tmp_path / "transfer" / "with"))
    assert all(t == [] for _, t in shown_types(tmp_path / "transfer" / "without"))
    assert {r["arm"] for r in summary["comparisons"]} == {"with"}


def test_stale_plays_the_same_tasks_in_a_changed_world_with_and_without_experience(learned, plugins, tmp_path):
    plan = make_plan("stale", learned["type_notes"], change=("env.dialect=put",))
    summary = run_experiment(plan, tmp_path / "stale", plugins=plugins)
    runs = {arm.name: load_run(tmp_path / "stale" / arm.name) for arm in plan.arms}
    assert all(run.results.valid for run in runs.values())
    assert runs["changed_world"].results.protocol.env["dialect"] == "put"
    assert "dialect" not in runs["learned_world"].results.protocol.env
    assert {(r["arm"], r["control"]) for r in summary["comparisons"]} == {
        ("changed_world", "learned_world"), ("learned_world", "learned_world_none"),
        ("changed_world", "changed_world_none")}
    assert all(r["other_differences"] == [] for r in summary["comparisons"])  # same tasks
    assert runs["changed_world_none"].config["env"]["dialect"] == "put"


def test_transfer_refuses_a_method_that_exports_nothing(plugins, fast, tmp_path):
    path, results = protocol.run("base", overrides=fast + ["eval.limit=2"], out=tmp_path / "base",
                                 plugins=plugins)
    assert results.exported is None
    with pytest.raises(ExperimentError, match="exports nothing"):
        make_plan("transfer", path, model=("llm.reply=x",))


def test_an_experiment_is_resumed_and_refuses_bad_requests(learned, plugins, tmp_path, monkeypatch):
    source = learned["type_notes"]
    with pytest.raises(ExperimentError, match="conflict needs a change of the world"):
        make_plan("conflict", source)
    with pytest.raises(ExperimentError, match="would change the tasks"):
        make_plan("stale", source, change=("env.level=hard",))
    with pytest.raises(ExperimentError, match="Unknown experiment"):
        make_plan("relevence", source)
    with pytest.raises(ExperimentError, match="not --set's to set"):
        make_plan("relevance", source, board=("learn.budget.episodes=5",))
    with pytest.raises(ExperimentError, match="needs the model"):
        make_plan("transfer", source)
    with pytest.raises(ExperimentError, match="Unknown env setting 'dialekt'. Did you mean 'dialect'"):
        make_plan("stale", source, change=("env.dialekt=put",))  # would change nothing
    with pytest.raises(ExperimentError, match="Unknown llm setting 'repyl'. Did you mean 'reply'"):
        make_plan("transfer", source, model=("llm.repyl=tiny",))
    out = tmp_path / "relevance"
    plan = make_plan("relevance", source, board=("run.seeds=[1]", "eval.limit=4"))
    first = run_experiment(plan, out, plugins=plugins)
    assert load_run(out / "none").seeds == [1]
    assert load_run(out / "none").config["eval"]["limit"] == 4  # the source evaluated 6 tasks
    (out / "none" / "results.json").unlink()  # an arm interrupted before its end
    shutil.rmtree(out / "other_type")
    (out / "other_type" / "store").mkdir(parents=True)  # one killed while it was being made
    shutil.rmtree(out / "own")
    with monkeypatch.context() as patched:  # and one killed after its config and state, before its settings
        patched.setattr(evaluate_state.OmegaConf, "save", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            run_experiment(plan, out, plugins=plugins)
    assert not (out / "own").exists()
    again = run_experiment(plan, out, plugins=plugins)
    assert load_run(out / "own").config["eval"]["experience"]["source"] == "own"
    assert again["comparisons"] == first["comparisons"]
    assert {tuple(r["other_differences"]) for r in again["comparisons"]} == {()}
    fewer = make_plan("relevance", source, board=("run.seeds=[1]", "eval.limit=2"))
    done = run_experiment(fewer, tmp_path / "fewer", plugins=plugins)
    moved = tmp_path / "moved"  # a checkout moved to another folder: the source's path changed
    shutil.copytree(source, moved / source.name)
    shutil.copytree(tmp_path / "fewer", moved / "fewer")
    assert run_experiment(make_plan("relevance", moved / source.name, board=("run.seeds=[1]", "eval.limit=2")),
                          moved / "fewer", plugins=plugins)["comparisons"] == done["comparisons"]
    edited = tmp_path / "edited" / source.name  # the same learned state, evaluated otherwise
    shutil.copytree(source, edited)
    (edited / "config.yaml").write_text((edited / "config.yaml").read_text().replace("max_steps: 3", "max_steps: 4"))
    with pytest.raises(ExperimentError, match="another experiment .*differs in source"):
        run_experiment(make_plan("relevance", edited, board=("run.seeds=[1]", "eval.limit=2")), moved / "fewer",
                       plugins=plugins)
    with pytest.raises(ExperimentError, match="another experiment .*differs in source"):  # another source
        run_experiment(make_plan("relevance", learned["notes_in_solve"], board=("run.seeds=[1]", "eval.limit=2")),
                       moved / "fewer", plugins=plugins)
    shutil.rmtree(out / "none")
    shutil.copytree(tmp_path / "fewer" / "none", out / "none")  # an arm that played fewer tasks
    with pytest.raises(ReportError, match="not played on the same"):
        summarise(plan, out)
    with pytest.raises(ExperimentError, match="another experiment"):
        run_experiment(make_plan("poison", source, fractions=(0.5,)), out, plugins=plugins)


def test_the_command_prints_each_arm_against_its_control(learned, tmp_path, monkeypatch):
    """The CLI on a built-in method (rag's trajectories are what it retrieves)."""
    from arena.testing import run_method

    run = run_method("rag", ["eval.limit=4", "learn.budget.episodes=4", "learn.max_steps=4"],
                     out=tmp_path / "rag")
    result = CliRunner().invoke(cli, ["experiment", "relevance", str(run.path), "--out",
                                      str(tmp_path / "exp")])
    assert result.exit_code == 0, result.output
    assert "other_type" in result.output and "p = " in result.output and "same items shown in" in result.output
    import arena.report.experiments as experiments

    with monkeypatch.context() as patched:  # Ctrl-C: the hint resumes the experiment, not a run
        patched.setattr(experiments, "run_experiment", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        stopped = CliRunner().invoke(cli, ["experiment", "relevance", str(run.path), "--out", str(tmp_path / "exp")])
    assert stopped.exit_code == 130 and "the same options and --out" in stopped.output
    # The command to run again is one line to copy, however long its paths (not wrapped at 160).
    assert f"`arena experiment relevance {run.path} --out {tmp_path / 'exp'} ...`" in stopped.output
    stale = CliRunner().invoke(cli, ["experiment", "stale", str(run.path), "--out", str(tmp_path / "stale"),
                                     "--change", "env.dialect=put", "--reuse", str(tmp_path / "exp")])
    assert stale.exit_code == 0, stale.output
    assert "learned_world: the arm played in" in stale.output and "(--reuse)" in stale.output
    refused = CliRunner().invoke(cli, ["experiment", "conflict", str(run.path), "--out", str(tmp_path / "c")])
    assert refused.exit_code != 0 and "--change env.KEY=VALUE" in refused.output
    board = CliRunner().invoke(cli, ["leaderboard", str(run.path), str(tmp_path / "exp"), "--out",
                                     str(tmp_path / "board")])
    assert board.exit_code == 0, board.output
    shown = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    assert [row["method"] for table in shown["tables"] for row in table["rows"]] == ["rag"]  # arms unranked
    summary = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    (experiment,) = shown["experiments"]
    assert experiment["comparisons"] == summary["comparisons"]  # rebuilt from the arms' files
    page = (tmp_path / "board" / "README.md").read_text()
    assert "## Experiments" in page and "| other_type | own | test_seen |" in page
    assert experiment["limit"] == 4 and "every arm on the first 4 tasks of each split" in page
    assert "Same items shown" in page
    assert "Experiments</h2>" in (tmp_path / "board" / "index.html").read_text()
    ranked = CliRunner().invoke(cli, ["leaderboard", str(run.path), str(tmp_path / "exp" / "own"), "--out",
                                      str(tmp_path / "board3")])  # an arm among the runs
    assert ranked.exit_code != 0 and "an arm is never ranked with runs" in ranked.output
    (tmp_path / "exp" / "none" / "results.json").unlink()
    unfinished = CliRunner().invoke(cli, ["leaderboard", str(run.path), str(tmp_path / "exp"), "--out",
                                          str(tmp_path / "board2")])
    assert unfinished.exit_code != 0 and "the arms none have not finished" in unfinished.output


RULE = "rule"


class PlacingRule:
    """Learns the world's placing command (its help line) from one train game, and is shown
    every rule it learned: the first phase's and, continued on a changed world, the second's."""

    def __init__(self, run: arena.Run) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run: arena.Run) -> bool:
        task = run.tasks("train")[0]
        played = run.play(arena.EpisodeRequest(task, [], 0, max_steps=1,
                                                policy=lambda observation, trajectory: arena.Action("help")))
        line = next(text.strip() for text in played.steps[0].observation.splitlines() if text.strip().startswith(("move", "put")))
        run.store.add([arena.Experience(kind=RULE, text=line, metadata={"task_type": task.task_type},
                                        provenance=arena.Provenance((task.task_id,), "train"))])
        return True

    @arena.hookimpl
    def retrieve(self, run: arena.Run, task: arena.Task) -> list[arena.Experience]:
        return run.store.all(kind=RULE)


class LearnsOnce(PlacingRule):
    """Keeps its own progress, as most built-in methods do: continued, it learns nothing again."""

    @arena.hookimpl
    def learn(self, run: arena.Run) -> bool:
        if not run.method_state.load().get("done"):
            super().learn(run)
            run.method_state.save({"done": True})
        return True


@pytest.fixture
def placing(plugins, fast, tmp_path):
    register(plugins, placing_rule=PlacingRule, learns_once=LearnsOnce)
    paths = {}
    for name in ("placing_rule", "learns_once"):
        path, results = protocol.run(name, overrides=fast + ["eval.limit=4", "eval.max_steps=2",
                                                             "learn.budget.episodes=1"],
                                     out=tmp_path / name, plugins=plugins)
        assert results.valid, results.violations
        paths[name] = path
    return paths


def rules_shown(arm_path):
    """The placing commands each test episode of an arm was shown."""
    from arena.core.services.store import stored_experiences

    rules = {e.experience_id: e.text.split(":")[0].strip() for e in stored_experiences(arm_path / "store")}
    return {tuple(sorted(rules[i] for i in json.loads(line)["experience_ids"]))
            for line in (arm_path / "trajectories.jsonl").read_text().splitlines()
            if json.loads(line)["key"][0] == "evaluate"}


def test_conflict_learns_the_changed_world_again_from_the_old_lessons(placing, plugins, tmp_path):
    from arena.report.aggregate import CONTINUED_FIELD, protocol_of

    source = placing["placing_rule"]
    plan = make_plan("conflict", source, change=("env.dialect=put",))
    summary = run_experiment(plan, tmp_path / "conflict", plugins=plugins)
    arms = {arm.name: load_run(tmp_path / "conflict" / arm.name) for arm in plan.arms}
    assert all(run.results.valid for run in arms.values())
    assert all(run.results.protocol.env["dialect"] == "put" for run in arms.values())
    move, put = "move (object) to (receptacle)", "put (object) in/on (receptacle)"
    assert rules_shown(arms["both"].path) == {(move, put)}  # the old lesson and the newer one
    assert rules_shown(arms["new"].path) == {(put,)}
    assert rules_shown(arms["old"].path) == {(move,)}
    assert rules_shown(arms["none"].path) == {()}
    learned_first = load_run(source).results.state.digest_before_eval
    assert arms["both"].results.learn.continued_from["digest"] == learned_first
    assert protocol_of(arms["both"])[CONTINUED_FIELD] == learned_first  # ranked apart
    assert CONTINUED_FIELD not in protocol_of(arms["new"])
    assert {(r["arm"], r["control"]) for r in summary["comparisons"]} == {
        ("both", "new"), ("both", "old"), ("new", "none")}
    assert all(r["other_differences"] == [] for r in summary["comparisons"])
    assert summary["second_phase"] == {"episodes": 1, "items_before": 1, "items_after": 2, "digest_changed": True}


def test_conflict_says_when_a_method_learns_nothing_again(placing, plugins, tmp_path):
    summary = run_experiment(make_plan("conflict", placing["learns_once"], change=("env.dialect=put",)),
                             tmp_path / "conflict", plugins=plugins)
    assert summary["second_phase"]["episodes"] == 0
    assert "learned nothing in the second phase" in summary["second_phase"]["note"]


def test_a_run_continues_only_from_a_finished_valid_run_of_its_method(placing, plugins, fast, tmp_path):
    from arena.core.storage.rundir import RunDirError

    with pytest.raises(RunDirError, match="not 'placing_rule'"):
        protocol.run("placing_rule", overrides=fast + [f"run.continue_from={placing['learns_once']}"],
                     out=tmp_path / "other", plugins=plugins)
    with pytest.raises(RunDirError, match="own folder"):
        protocol.run("placing_rule", overrides=fast + [f"run.continue_from={placing['placing_rule']}"],
                     out=placing["placing_rule"], plugins=plugins)
    with pytest.raises(RunDirError, match="already holds a run"):
        protocol.run("learns_once", overrides=fast + [f"run.continue_from={placing['learns_once']}"],
                     out=placing["placing_rule"], plugins=plugins)
    assert load_run(placing["placing_rule"]).results.valid  # neither folder was touched
    with pytest.raises(RunDirError, match="not a finished run"):
        (tmp_path / "empty").mkdir()
        protocol.run("placing_rule", overrides=fast + [f"run.continue_from={tmp_path / 'empty'}"],
                     out=tmp_path / "nothing", plugins=plugins)
    source = placing["placing_rule"]
    with pytest.raises(RunDirError, match=r"learned with embedder.name=hashing.*Pass the same embedder.name"):
        protocol.run("placing_rule", overrides=[*fast, "embedder.name=minilm", f"run.continue_from={source}"],
                     out=tmp_path / "other_embedder", plugins=plugins)
    run_experiment(make_plan("relevance", source), tmp_path / "relevance", plugins=plugins)
    with pytest.raises(RunDirError, match="an arm of `arena experiment`"):
        protocol.run("placing_rule", overrides=fast + [f"run.continue_from={tmp_path / 'relevance' / 'none'}"],
                     out=tmp_path / "from_arm", plugins=plugins)
    linked = tmp_path / "linked"
    shutil.copytree(source, linked)
    (linked / "store" / "outside").symlink_to(tmp_path / "empty")
    with pytest.raises(RunDirError, match="symbolic links"):
        protocol.run("placing_rule", overrides=fast + [f"run.continue_from={linked}"],
                     out=tmp_path / "from_links", plugins=plugins)
    assert not any((tmp_path / name / "config.yaml").exists() for name in ("other_embedder", "from_arm", "from_links"))


def test_stale_on_a_recoloured_babyai(plugins, fast, tmp_path):
    """BabyAI's changed world: the same tasks, every colour renamed (env.recolour)."""
    register(plugins, type_notes=TypeNotes)
    babyai = ["llm.backend=fake", "embedder.name=hashing", "env.n_train=8", "env.n_valid=4", "env.n_test=4",
              "eval.limit=2", "eval.max_steps=3"]
    source, _ = protocol.run("type_notes", env="babyai", overrides=babyai, out=tmp_path / "notes", plugins=plugins)
    summary = run_experiment(make_plan("stale", source, change=("env.recolour=true",)), tmp_path / "stale",
                             plugins=plugins)
    changed = load_run(tmp_path / "stale" / "changed_world")
    learned = load_run(tmp_path / "stale" / "learned_world")
    assert changed.results.protocol.env["recolour"] is True
    assert sorted(r.task_id for r in changed.evaluated()) == sorted(r.task_id for r in learned.evaluated())
    assert {tuple(r["other_differences"]) for r in summary["comparisons"]} == {()}, summary["comparisons"]


def test_reflexion_learns_again_on_the_changed_world_beside_its_old_reflections(plugins, fast, tmp_path):
    """A continued Reflexion tries every train task again and keeps both phases' reflections."""
    from arena.core.services.store import stored_experiences

    settings = fast + ["llm.reply=Open the fridge before taking the apple.", "method.train_tasks=2",
                       "method.trials=2", "eval.limit=2", "eval.max_steps=3", "learn.max_steps=3"]
    source, results = protocol.run("reflexion", overrides=settings, out=tmp_path / "reflexion", plugins=plugins)
    first = results.state.memory_items
    assert first > 0
    summary = run_experiment(make_plan("conflict", source, change=("env.dialect=put",)), tmp_path / "conflict",
                             plugins=plugins)
    phase = summary["second_phase"]
    assert phase["episodes"] == results.learn.used["episodes"] and "note" not in phase
    assert phase["items_after"] == 2 * first  # the fake model fails alike in both worlds
    trials = sorted({e.metadata["trial"] for e in stored_experiences(tmp_path / "conflict" / "both" / "store")})
    assert trials == ["0", "1", "1.0", "1.1"]  # phase 1's trials, then phase 2's


def test_expel_gathers_again_on_the_changed_world_beside_its_old_trials(plugins, fast, tmp_path):
    """A continued ExpeL gathers every train task again (its trials stored beside the first
    phase's) and critiques them against the insights the first phase left."""
    from arena.core.services.store import stored_experiences

    settings = fast + ["method.max_reflections=1", "method.train_tasks=2", "eval.limit=2", "eval.max_steps=3",
                       "learn.max_steps=3"]
    source, results = protocol.run("expel", overrides=settings, out=tmp_path / "expel", plugins=plugins)
    summary = run_experiment(make_plan("conflict", source, change=("env.dialect=put",)), tmp_path / "conflict",
                             plugins=plugins)
    assert summary["second_phase"]["episodes"] == results.learn.used["episodes"] > 0
    trials = [e for e in stored_experiences(tmp_path / "conflict" / "both" / "store") if e.kind == "trajectory"]
    phases = sorted(int(e.metadata.get("phase", 0)) for e in trials)
    assert phases == [0] * (len(trials) // 2) + [1] * (len(trials) // 2)
    state = json.loads((tmp_path / "conflict" / "both" / "method" / "state.json").read_text())
    assert state["phase"] == 1 and state["stage"] == "done" and state["gather"]["trials"] == len(trials) // 2
    both = load_run(tmp_path / "conflict" / "both").results.state.method
    assert both["trajectories"] == len(trials)  # the state's size: both phases' trials


@pytest.mark.slow
def test_transfer_to_other_weights_checks_the_learned_state_under_the_source_weights(tmp_path):
    """Another model's weights change the state digest; the arm is valid when the learned state
    is the source's under the source's weights digest, and invalid when it is not."""
    from arena.report.evaluate_state import finish_evaluation, prepare_evaluation

    tiny = ["llm.model=tiny", "embedder.name=hashing", "env.n_train=8", "env.n_valid=2", "env.n_test=4",
            "eval.limit=2", "eval.max_steps=3", "learn.max_steps=3", "learn.budget.episodes=3"]
    source, learned = protocol.run("rag", overrides=tiny, out=tmp_path / "rag")
    # Another dtype than the source's (llm.dtype=auto is float32 on a CPU without native bf16).
    other = "bfloat16" if learned.provenance.model["dtype"] == "float32" else "float32"
    run_experiment(make_plan("transfer", source, model=(f"llm.dtype={other}",)), tmp_path / "transfer")
    for arm in ("with", "without"):
        run = load_run(tmp_path / "transfer" / arm)
        assert run.results.valid, run.results.violations
        assert run.results.provenance.model["weights_sha256"] != learned.provenance.model["weights_sha256"]
        change = json.loads((run.path / "state.json").read_text())[MODEL_CHANGED]
        assert change["rebased"] and change["digest_learned"] == learned.state.digest_before_eval
    lying = tmp_path / "lying"
    prepare_evaluation(source, lying, {"llm.dtype": other}, record_as="experiment_of", new_keys=("llm.",))
    state = json.loads((lying / "state.json").read_text())
    state[MODEL_CHANGED]["from_weights_sha256"] = "0" * 64  # not the weights the state was learned with
    (lying / "state.json").write_text(json.dumps(state))
    _, results = finish_evaluation(lying)
    assert not results.valid
    assert any("differs from the one its source's learning ended with" in v for v in results.violations)
    tampered = tmp_path / "tampered"  # a file of the method's own folder changed before evaluation
    prepare_evaluation(source, tampered, {"llm.dtype": other}, record_as="experiment_of", new_keys=("llm.",))
    (tampered / "method").mkdir(exist_ok=True)
    (tampered / "method" / "adapter.bin").write_bytes(b"not what it learned")
    _, results = finish_evaluation(tampered)
    assert any("differs from the one its source's learning ended with" in v for v in results.violations)


def test_a_learned_state_with_links_is_neither_evaluated_nor_continued(placing, plugins, fast, tmp_path):
    """A link in a submitted run's store would bring what it points to (the signing key, say)
    into the copy the method reads."""
    from arena.core.storage.rundir import RunDirError
    from arena.report.evaluate_state import EvaluateError, prepare_evaluation

    secret = tmp_path / "secret"
    secret.write_text("the board's key")
    linked = tmp_path / "linked"
    shutil.copytree(placing["placing_rule"], linked)
    (linked / "store" / "key").symlink_to(secret)
    with pytest.raises(EvaluateError, match="symbolic links"):
        prepare_evaluation(linked, tmp_path / "evaluated", {}, record_as="evaluated_from")
    assert not (tmp_path / "evaluated").exists()
    with pytest.raises(RunDirError, match="symbolic links"):
        protocol.run("placing_rule", overrides=fast + [f"run.continue_from={linked}"],
                     out=tmp_path / "continued", plugins=plugins)


def test_a_continued_run_killed_before_its_first_state_is_made_again_on_resume(placing, plugins, fast,
                                                                             tmp_path, monkeypatch):
    from arena.core.storage.rundir import RunDir

    real = RunDir.write_first_state
    with monkeypatch.context() as patched:
        patched.setattr(RunDir, "write_first_state", lambda self, *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            protocol.run("placing_rule", overrides=fast + ["eval.limit=4", "eval.max_steps=2", "learn.budget.episodes=1",
                                                           f"run.continue_from={placing['placing_rule']}"],
                         out=tmp_path / "continued", plugins=plugins)
    assert (tmp_path / "continued" / "config.yaml").is_file() and not (tmp_path / "continued" / "state.json").exists()
    assert RunDir.write_first_state is real
    _, results = protocol.run(None, resume=tmp_path / "continued", plugins=plugins)
    assert results.valid, results.violations
    assert results.learn.continued_from["run"] == str(placing["placing_rule"].resolve())


def test_every_arm_plays_the_experiments_one_secret_draw(learned, plugins, tmp_path):
    """Under a secret salt each run draws its own test layouts; an experiment's arms share one."""
    from arena.report.aggregate import protocol_of

    out = tmp_path / "secret"
    summary = run_experiment(make_plan("relevance", learned["type_notes"], board=("eval.salt=secret",)), out,
                             plugins=plugins)
    arms = [load_run(out / arm) for arm in ("own", "other_type", "none")]
    assert {run.results.protocol.eval_salt for run in arms} == {arms[0].results.protocol.eval_salt}
    assert arms[0].results.protocol.eval_salt.startswith("secret:")
    assert protocol_of(arms[0])["eval.salt"] == arms[0].results.protocol.eval_salt  # boards name the draw
    assert len({json.dumps(run.results.provenance.split_hashes) for run in arms}) == 1
    assert {tuple(row["other_differences"]) for row in summary["comparisons"]} == {()}
    alone = evaluate_state.evaluate_state(learned["type_notes"], tmp_path / "alone", ["eval.salt=secret"],
                                          plugins=plugins)[1]  # a run outside it draws its own
    assert alone.protocol.eval_salt != arms[0].results.protocol.eval_salt


def test_an_arm_is_no_source_and_a_submitted_state_plants_no_harness_keys(learned, plugins, tmp_path):
    """What only an arm's harness writes (poison, a change of model, the arm's mark) is not taken
    from a state handed over for evaluation or replay."""
    from arena.report.evaluate_state import EvaluateError, prepare_evaluation
    from arena.report.verify import prepare_replay, trajectories_by_key

    source = learned["type_notes"]
    run_experiment(make_plan("relevance", source), tmp_path / "relevance", plugins=plugins)
    with pytest.raises(ExperimentError, match="is an arm of `arena experiment`"):
        run_experiment(make_plan("poison", tmp_path / "relevance" / "own", fractions=(0.5,)), tmp_path / "p",
                       plugins=plugins)
    assert not (tmp_path / "p").exists()  # refused before anything was made: --out stays free
    planted = tmp_path / "planted"
    shutil.copytree(source, planted)
    state = json.loads((planted / "state.json").read_text())
    state.update({MODEL_CHANGED: {"rebased": False, "from_weights_sha256": "0" * 64},
                  "poisoned": {"fraction": 0.5}, "poisoning": ["x"]})
    (planted / "state.json").write_text(json.dumps(state))
    with pytest.raises(EvaluateError, match=r"bad value \(Field required\) at 'model_changed.settings'"):
        prepare_evaluation(planted, tmp_path / "evaluated", {}, record_as="evaluated_from")  # not even read
    state[MODEL_CHANGED].update(settings={"llm.reply": "planted"}, method_files_sha256="")
    (planted / "state.json").write_text(json.dumps(state))
    prepare_evaluation(planted, tmp_path / "evaluated", {}, record_as="evaluated_from")
    assert not {MODEL_CHANGED, "poisoned", "poisoning"} & set(json.loads((tmp_path / "evaluated" / "state.json").read_text()))
    run = load_run(planted, verification=False)
    prepare_replay(planted, tmp_path / "replay", run.results, run.episodes or [], trajectories_by_key(planted))
    assert not {MODEL_CHANGED, "poisoned", "poisoning"} & set(json.loads((tmp_path / "replay" / "state.json").read_text()))
    with pytest.raises(EvaluateError, match="is an arm of `arena experiment`"):
        prepare_evaluation(tmp_path / "relevance" / "own", tmp_path / "from_arm", {}, record_as="evaluated_from")


def test_other_type_on_a_split_of_one_type_is_refused_before_any_episode(plugins, fast, tmp_path):
    register(plugins, type_notes=TypeNotes)
    with pytest.raises(ValueError, match="split test_seen has the task types .* only; it needs at least two"):
        protocol.run("type_notes", overrides=[*fast, "env.n_test=1", "eval.experience.source=other_type"],
                     out=tmp_path / "one_type", plugins=plugins)
    assert not (tmp_path / "one_type").exists()


class WritesWhenTold(TypeNotes):
    """TypeNotes that adds a note while evaluated when ARENA_TEST_WRITE is set (one arm's run)."""

    @arena.hookimpl
    def retrieve(self, run: arena.Run, task: arena.Task) -> list[arena.Experience]:
        import os

        if os.environ.get("ARENA_TEST_WRITE"):
            run.store.add([arena.Experience(kind=NOTE, text="learned at test time", metadata={"task_type": "x"},
                                            provenance=arena.Provenance((task.task_id,), task.split))])
        return super().retrieve(run, task)


def test_an_invalid_arm_is_marked_in_every_comparison_it_is_in(plugins, fast, tmp_path, monkeypatch):
    from arena.report.experiments import load_experiment
    from arena.report.render import experiment_rows

    register(plugins, writes_when_told=WritesWhenTold)
    source, results = protocol.run("writes_when_told", overrides=fast + ["eval.limit=4"], out=tmp_path / "w",
                                   plugins=plugins)
    assert results.valid, results.violations
    plan = make_plan("relevance", source)
    out = tmp_path / "relevance"
    run_experiment(plan, out, plugins=plugins)
    shutil.rmtree(out / "other_type")
    monkeypatch.setenv("ARENA_TEST_WRITE", "1")  # other_type made again: it writes while evaluated
    summary = run_experiment(plan, out, plugins=plugins)
    assert not load_run(out / "other_type").results.valid
    assert {(r["arm"], tuple(r["invalid"])) for r in summary["comparisons"]} == {
        ("other_type", ("other_type",)), ("none", ())}
    shown = {cells[0]: cells[-1] for cells in experiment_rows(load_experiment(out), overall=True)}
    assert shown == {"other_type": "INVALID other_type", "none": "-"}


def test_an_arm_another_experiment_played_is_reused_not_played_again(learned, plugins, tmp_path):
    """stale's learned-world arms are relevance's own and none, poison's clean arm relevance's own:
    with --reuse they are read from there (same source, same settings, same test draw)."""
    from arena.report.experiments import load_experiment

    source = learned["type_notes"]
    secret = ("eval.salt=secret",)  # one draw for both experiments, adopted from the first
    run_experiment(make_plan("relevance", source, board=secret), tmp_path / "relevance", plugins=plugins)
    stale = run_experiment(make_plan("stale", source, change=("env.dialect=put",), board=secret),
                           tmp_path / "stale", plugins=plugins, reuse=[tmp_path / "relevance"])
    assert stale["reused"] == {"learned_world": "../relevance/own", "learned_world_none": "../relevance/none"}
    assert not (tmp_path / "stale" / "learned_world").exists() and (tmp_path / "stale" / "changed_world").is_dir()
    alone = run_experiment(make_plan("stale", source, change=("env.dialect=put",)), tmp_path / "alone",
                           plugins=plugins)  # played in full (public draw): the same comparisons
    assert [r["pairs"] for r in stale["comparisons"]] == [r["pairs"] for r in alone["comparisons"]]
    assert {tuple(r["other_differences"]) for r in stale["comparisons"]} == {()}
    draws = {load_run(tmp_path / "stale" / arm).results.protocol.eval_salt for arm in ("changed_world",
                                                                                           "changed_world_none")}
    assert draws == {load_run(tmp_path / "relevance" / "own").results.protocol.eval_salt}
    from arena.report.render import experiment_line

    assert load_experiment(tmp_path / "stale").reused == stale["reused"]
    assert "learned_world is the arm ../relevance/own (reused" in experiment_line(load_experiment(tmp_path / "stale"))
    poison = run_experiment(make_plan("poison", source, fractions=(0.5,), board=secret), tmp_path / "poison",
                            plugins=plugins, reuse=[tmp_path / "stale", tmp_path / "relevance"])
    assert poison["reused"] == {"poison-0": "../relevance/own"}  # poison 0 is the clean store
    other = run_experiment(make_plan("relevance", learned["notes_in_solve"], board=secret), tmp_path / "other",
                           plugins=plugins, reuse=[tmp_path / "relevance"])  # another source: nothing of it
    assert "reused" not in other and (tmp_path / "other" / "own").is_dir()
    with pytest.raises(ExperimentError, match="is not an experiment's folder"):
        run_experiment(make_plan("relevance", source), tmp_path / "r2", plugins=plugins, reuse=[tmp_path / "stale" / "changed_world"])


def test_relevance_on_a_source_of_one_type_splits_is_refused_before_any_arm(plugins, fast, tmp_path):
    register(plugins, type_notes=TypeNotes)
    source, _ = protocol.run("type_notes", overrides=[*fast, "env.n_test=1"], out=tmp_path / "one", plugins=plugins)
    with pytest.raises(ExperimentError, match="arm other_type: .*split test_seen has the task types"):
        run_experiment(make_plan("relevance", source), tmp_path / "relevance", plugins=plugins)
    assert not (tmp_path / "relevance" / "own").exists()  # nothing was played


def test_a_config_is_told_apart_by_what_it_evaluates_and_by_its_folders_only_where_asked():
    """A source moved to another folder is the same source; a transfer arm, whose model differs
    from its source's only in a folder (llm.warmstart), is never another experiment's arm."""
    from omegaconf import OmegaConf

    from arena.report.experiments import config_identity

    source = OmegaConf.create({"llm": {"backend": "transformers", "warmstart": "board/base"},
                               "eval": {"limit": None}, "run": {"continue_from": "/a/run"}})
    moved = OmegaConf.merge(source, {"run": {"continue_from": "/b/run"}, "llm": {"warmstart": "elsewhere/base"}})
    assert config_identity(source) == config_identity(moved)
    own = config_identity(source, {"eval.experience.source": "own"}, with_folders=True)
    assert own == config_identity(source, {"eval.experience.poison": 0.0}, with_folders=True)  # one evaluation
    transferred = config_identity(source, {"eval.experience.source": "own", "llm.warmstart": None}, with_folders=True)
    assert transferred != own
    assert config_identity(source, {"eval.limit": 18}) != config_identity(source)


class WinsWithItsOwnNote(TypeNotes):
    """Follows the expert (test code reaching past the view, as tests/helpers/runs.oracle_episode
    says) when shown its own type's note, and plays the fake model otherwise: what it is shown
    decides whether it wins."""

    @arena.hookimpl
    def solve(self, run: arena.Run, task: arena.Task, experiences: list[arena.Experience],
              seed: int) -> arena.Trajectory:
        from arena.core.execution.solver import Action, play
        from tests.helpers.runs import harness_of, oracle_episode

        if f"type {task.task_type}" not in {e.text for e in experiences}:
            return run.play(arena.EpisodeRequest(task, experiences, seed, policy=arena.STANDARD))
        episode = oracle_episode(run, task)
        return play(episode, lambda observation, trajectory: Action(text=episode.expert_action()),
                    max_steps=harness_of(run).max_steps(), max_invalid_actions=3, experience_ids=[e.experience_id for e in experiences])


def test_a_difference_is_the_arm_against_its_control_where_the_shown_experience_decides(plugins, fast, tmp_path):
    register(plugins, wins_with_its_own_note=WinsWithItsOwnNote)
    settings = [*fast, "env.level=easy", "eval.max_steps=30", "eval.limit=8", "eval.splits=[test_seen]"]
    source, results = protocol.run("wins_with_its_own_note", overrides=settings, out=tmp_path / "w", plugins=plugins)
    assert results.splits["test_seen"].success_rate == 1.0, results.violations  # its own notes win
    summary = run_experiment(make_plan("relevance", source), tmp_path / "relevance", plugins=plugins)
    overall = {r["arm"]: r for r in summary["comparisons"] if r["task_type"] == "all"}
    for arm in ("other_type", "none"):  # another type's note, or none: the expert is not followed
        row = overall[arm]
        assert row["control"] == "own" and row["success_control"] == 1.0 and row["success_arm"] <= 0.5
        assert row["difference"] == pytest.approx(row["success_arm"] - row["success_control"])
        assert row["ci95"][1] < 0 and row["p_value"] < 0.1
