"""results.json against its committed schema: every built-in method's results validate, and
a file that does not match is refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from arena.core import protocol
from arena.core.contract.results import SCHEMA_FILE, ResultsError, render_schema, validate
from arena.core.storage.metrics import read_metrics
from arena.core.storage.rundir import RunDir
from arena.report import build_tables, load_runs
from arena.report.runs import ReportError, load_run

ROOT = Path(__file__).resolve().parents[1]
FAKE = ["llm.backend=fake", "eval.limit=2", "learn.budget.episodes=2", "embedder.name=hashing"]
TINY = ["llm.backend=transformers", "llm.model=tiny", "eval.limit=1", "embedder.name=hashing",
        "eval.max_steps=3", "learn.max_steps=3"]
#: Every built-in method, each on the smallest run that exercises its learning phase.
BUILT_IN = {
    "base": FAKE,
    "random": FAKE,
    "rag": FAKE,
    "memrl": FAKE,
    "expel": [*FAKE, "method.max_reflections=0"],
    "evolving_rl": [*TINY, "method.iterations=1", "method.n_sources=1", "method.n_skills=1",
                    "method.k_downstream=1", "method.extractor_max_tokens=8", "method.valid_every=0"],
    "grpo": [*TINY, "method.iterations=1", "method.n_sources=1", "method.group_size=2",
             "method.valid_every=0"],
    "skillrl": [*TINY, "method.collect.tasks=1", "method.sft.tasks=1", "method.sft.steps=1",
                "method.rl.steps=1", "method.rl.tasks_per_step=1", "method.rl.group_size=2",
                "method.evolution.every=0", "method.teacher.max_new_tokens=8"],
    "gigpo": [*TINY, "method.iterations=1", "method.tasks_per_iteration=1", "method.group_size=2"],
    "reflexion": [*FAKE, "method.train_tasks=1", "method.trials=2"],
    "mem0": FAKE,
}


def test_the_committed_schema_is_the_models_schema() -> None:
    """docs/results.schema.json is generated from arena.core.contract.results (python -m arena.core.contract.results)."""
    assert SCHEMA_FILE.read_text() == render_schema()


def test_every_built_in_method_is_covered(plugins) -> None:
    assert set(BUILT_IN) == {entry.name for entry in plugins.methods.entries()
                             if entry.plugin.startswith("arena.plugins.")}


@pytest.fixture(scope="module")
def built_in_run(tmp_path_factory):
    """The run directory of a built-in method (each run once for the module's tests)."""
    from arena.testing import fresh_plugins

    plugins, runs = fresh_plugins(), {}

    def run(method: str) -> Path:
        if method not in runs:
            out = tmp_path_factory.mktemp("runs") / method
            runs[method], _ = protocol.run(method, overrides=BUILT_IN[method], out=out, plugins=plugins)
        return runs[method]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(BUILT_IN))
def test_results_of_every_built_in_method_validate_against_the_committed_schema(method: str, built_in_run) -> None:
    written = json.loads((built_in_run(method) / "results.json").read_text())
    assert written["method"] == method and written["schema_version"] == 2
    if method not in ("base", "random"):  # each learned something: its learning phase is covered
        assert written["cost"]["learn"]["episodes"] > 0
    if method in ("evolving_rl", "grpo", "skillrl"):
        assert written["learn"]["used"]["gradient_steps"] >= 1
    jsonschema.validate(written, json.loads(SCHEMA_FILE.read_text()))
    validate(written)  # and the models themselves


LEARNING = sorted(set(BUILT_IN) - {"base", "random"})


@pytest.mark.slow
@pytest.mark.parametrize("method", LEARNING)
def test_every_learning_method_logs_its_learning_to_metrics_jsonl(method: str, built_in_run) -> None:
    logged = [entry for entry in read_metrics(built_in_run(method)) if entry["phase"] == "learn"]
    assert logged, f"{method} logged no metrics (run.log_metrics) while learning"
    assert all(entry["metrics"] for entry in logged)
    # ... and the board draws its learning curves from them (SkillRL's included).
    path = built_in_run(method)
    (table,) = build_tables(load_runs([path]))
    (row,) = table.rows
    curves = row.learning_curves[path.name]
    assert curves and all(name.startswith(f"{method}: ") for name in curves), curves
def test_committed_board_runs_validate() -> None:
    """Runs of Arena 0.1 (schema_version 1) on the committed boards still read."""
    files = sorted(ROOT.glob("leaderboards/*/runs/*/results.json"))
    assert files
    schema = json.loads(SCHEMA_FILE.read_text())
    for file in files:
        data = json.loads(file.read_text())
        jsonschema.validate(data, schema)
        assert validate(data, str(file)).schema_version in (1, 2)


#: Every results.json committed under leaderboards/ (board runs, ablations, experiments' arms).
COMMITTED = sorted(ROOT.glob("leaderboards/**/results.json"))


def test_a_fresh_runs_results_read_and_write_back_byte_for_byte(tmp_path) -> None:
    """results.json is written from the model: reading it and writing it again changes no byte
    (no key added, none dropped, none reordered: an optional key never written stays absent)."""
    path = _a_result(tmp_path)
    written = (path / "results.json").read_bytes()
    data = json.loads(written)
    assert "experience" not in data["protocol"] and "continued_from" not in data["learn"]
    assert "variants" not in data["splits"]["test_seen"]
    directory = RunDir(path)
    directory.write_results(directory.read_results())
    assert (path / "results.json").read_bytes() == written


def test_every_committed_results_file_reads_and_writes_back_to_the_same_json() -> None:
    """What the models make of each committed file is the file: the same keys and values
    (only provenance's key order may differ, in files whose provenance has a key of its own)."""
    assert len(COMMITTED) > 50
    for file in COMMITTED:
        data = json.loads(file.read_text())
        results = validate(data, str(file))
        assert results.to_json() == data, file
        assert validate(results.to_json(), str(file)) == results, file
        beyond_provenance = {key: value for key, value in data.items() if key != "provenance"}
        again = {key: value for key, value in results.to_json().items() if key != "provenance"}
        assert json.dumps(again, indent=2) == json.dumps(beyond_provenance, indent=2), file


def _a_result(tmp_path: Path) -> Path:
    path, _ = protocol.run("base", overrides=FAKE, out=tmp_path / "run")
    return path


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r.update(sucess=1), "sucess: Extra inputs are not permitted"),
    (lambda r: r["splits"]["test_seen"].update(success_rate=1.5), "splits.test_seen.success_rate"),
    (lambda r: r.pop("cost"), "cost: Field required"),
    (lambda r: r.update(track="frozn"), "track"),
])
def test_a_results_file_that_does_not_match_is_refused_naming_the_field(tmp_path, change, field) -> None:
    path = _a_result(tmp_path)
    data = json.loads((path / "results.json").read_text())
    change(data)
    (path / "results.json").write_text(json.dumps(data))
    with pytest.raises(ReportError, match="does not match the results schema") as raised:
        load_run(path)
    assert field in str(raised.value) and str(path / "results.json") in str(raised.value)


def test_an_unknown_schema_version_names_the_versions_read() -> None:
    with pytest.raises(ResultsError, match="schema_version 9; this Arena reads versions 1, 2"):
        validate({"schema_version": 9})
