"""Typed method settings: every built-in method's YAML and presets read into its dataclass, and
a config that does not match is refused naming the key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core.config.compose import compose
from arena.core.contract.method_config import MethodConfigError, typed_config
from arena.plugins.evolving_rl.settings import EvolvingRLSettings
from arena.plugins.expel.settings import ExpeLSettings
from arena.plugins.memrl.settings import MemRLSettings
from arena.plugins.rag.settings import RAGSettings
from arena.plugins.skillrl.settings import SkillRLSettings

SETTINGS = {"evolving_rl": EvolvingRLSettings, "grpo": EvolvingRLSettings, "expel": ExpeLSettings,
            "memrl": MemRLSettings, "rag": RAGSettings, "skillrl": SkillRLSettings}


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_every_default_and_preset_reads_into_the_methods_settings(plugins, method) -> None:
    for preset in [None, *sorted(plugins.methods.get(method).presets)]:
        settings = typed_config(compose(plugins, method, preset=preset).method, SETTINGS[method])
        assert isinstance(settings, SETTINGS[method]), (method, preset)


def test_values_arrive_typed(plugins) -> None:
    cfg = compose(plugins, "skillrl", overrides=["method.rl.steps=3", "method.retrieval.threshold=0.5"])
    settings = typed_config(cfg.method, SkillRLSettings)
    assert settings.rl.steps == 3 and isinstance(settings.rl.steps, int)
    assert settings.retrieval.threshold == 0.5 and settings.teacher.llm is None


@dataclass
class Inner:
    depth: int


@dataclass
class Outer:
    width: int
    inner: Inner
    label: str = "x"


@pytest.mark.parametrize(("section", "message"), [
    ({"width": 1, "inner": {"depth": 2}, "widht": 3}, "Unknown config key 'method.widht'. Did you mean 'method.width'?"),
    ({"width": 1, "inner": {"dept": 2}}, "Unknown config key 'method.inner.dept'. Did you mean 'method.inner.depth'?"),
    ({"width": "wide", "inner": {"depth": 2}}, "Config key 'method.width': Value 'wide'"),
    ({"inner": {"depth": 2}}, "missing mandatory value: width"),
])
def test_a_section_that_does_not_match_is_refused_naming_the_key(section, message) -> None:
    with pytest.raises(MethodConfigError) as raised:
        typed_config(section, Outer)
    assert message in str(raised.value)


def test_a_range_error_stops_the_run_before_it_leaves_a_directory(tmp_path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["run", "--method", "memrl", "--out", str(out), "llm.backend=fake",
                                      "method.k1=0"])
    assert result.exit_code != 0 and "method.k1 must be >= 1, got 0" in result.output
    assert "Traceback" not in result.output and not out.exists()
