"""The harness's config, typed (arena.core.contract.settings): built once from the YAML, read without casts."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import arena.core.contract.settings as settings_module
from arena.core.config.compose import compose, load_yaml
from arena.core.config.plugins import get_plugins
from arena.core.contract.settings import Sampling, Settings, SolverSettings

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "arena" / "core" / "configs" / "defaults.yaml"


def defaults_of(kind: type, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of a settings dataclass that has a default, with that default."""
    found: dict[str, Any] = {}
    for field in dataclasses.fields(kind):
        key = f"{prefix}{field.name}"
        if field.default is not dataclasses.MISSING:
            found[key] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
            if dataclasses.is_dataclass(value):
                found.update({k: v for k, v in defaults_of(type(value), key + ".").items()})
            else:
                found[key] = value
    return found


def test_every_default_of_a_setting_is_the_yamls() -> None:
    """A dataclass default serves only configs of an earlier Arena that lack the key; it may not
    say something else than the harness's YAML."""
    yaml = OmegaConf.to_container(load_yaml(DEFAULTS), resolve=True)
    wrong = []
    for section, kind in (("run", "RunSettings"), ("learn", "LearnSettings"), ("eval", "EvalSettings"),
                          ("solver", "SolverSettings"), ("store", "StoreSettings"),
                          ("logging", "LoggingSettings"), ("executor", "ExecutorSettings"),
                          ("embedder", "EmbedderChoice")):
        for key, default in defaults_of(getattr(settings_module, kind), section + ".").items():
            value = OmegaConf.select(OmegaConf.create(yaml), key, default="<absent>")
            if isinstance(value, (list, dict)) or OmegaConf.is_config(value):
                value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            if value != default:
                wrong.append(f"{key}: settings {default!r}, defaults.yaml {value!r}")
    assert not wrong, "\n".join(wrong)


def test_a_composed_config_is_typed_once_with_the_yamls_types() -> None:
    cfg = compose(get_plugins(), "random", "household", None, ["eval.concurrency=3", "learn.seed=7"], None)
    settings = Settings.of(cfg)
    assert settings.eval.concurrency == 3 and isinstance(settings.eval.concurrency, int)
    assert settings.learn.seed == 7
    assert settings.eval.sampling == Sampling(temperature=0.0, top_p=1.0)
    assert settings.method.name == "random" and settings.env.name == "household"
    assert settings.llm.backend == str(cfg.llm.backend)
    assert settings.eval.splits == list(cfg.eval.splits)


def test_a_value_of_the_wrong_type_is_refused_and_a_numeric_string_converted() -> None:
    base = {"layout": "window", "history": "3", "show_admissible": True, "admissible_turns": "full"}
    assert SolverSettings.from_config(base).history == 3
    with pytest.raises(Exception, match="history"):
        SolverSettings.from_config({**base, "history": "three"})


def test_every_committed_runs_config_types_whatever_arena_wrote_it() -> None:
    """Configs of earlier versions lack later keys (salts, isolation, the experience control):
    they type with the YAML's defaults, as the code read them before."""
    configs = sorted(ROOT.glob("leaderboards/**/config.yaml"))
    assert len(configs) > 20
    for path in configs:
        settings = Settings.of(OmegaConf.load(path))
        assert settings.eval.splits and settings.run.seeds, path


def _casts_of_config(tree: ast.AST) -> list[str]:
    """``int(cfg.x)``, ``str(self.cfg.x.get(...))``, ``float(section["k"])`` on a config: a
    builtin conversion applied to an expression that reads a config (a name ending in ``cfg`` or
    ``config``; a model's own ``model.config`` is no run config)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("int", "float", "str", "bool") and node.args):
            continue
        reads = [sub for sub in ast.walk(node.args[0])
                 if (isinstance(sub, ast.Name) and sub.id.endswith(("cfg", "config")))
                 or (isinstance(sub, ast.Attribute) and sub.attr.endswith(("cfg", "config")))]
        if reads and "model.config" not in ast.unparse(node.args[0]):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "arena").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_in_arena_casts_a_config_value(path: Path) -> None:
    casts = _casts_of_config(ast.parse(path.read_text()))
    assert not casts, (f"{path.relative_to(ROOT)} casts config values: the harness reads its sections "
                       "from arena.core.contract.settings, a plugin types its own with arena.typed_config:\n"
                       + "\n".join(casts))


def test_the_cast_finder_finds_casts() -> None:
    found = _casts_of_config(ast.parse("a = int(self.cfg.eval.concurrency)\nb = str(cfg.get('x'))\nc = int(n)"))
    assert [line.split(":")[0] for line in found] == ["1", "2"]
