"""Config composition with OmegaConf.

Precedence, lowest first: harness defaults (``core/configs/defaults.yaml``) < environment YAML
(under ``env``) < backend YAML (under ``llm``) < method YAML (top level) < the method's preset
(``--preset NAME``) < ``--config FILE`` < ``key=value`` overrides. A method's YAML may not
touch ``eval``, ``run`` or ``env``: those settings are the same for every method, which is what
makes two results comparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from arena.core.config import schema
from arena.core.config.plugins import Plugins

DEFAULTS_PATH = Path(__file__).parents[1] / "configs" / "defaults.yaml"
#: Settings a method's YAML may not set: they define the comparison, the same for every method.
PROTECTED_KEYS = ("eval", "run", "env")
#: Keys inside sections a method may otherwise set: the warm-start base is the board's, shared by
#: every method on it, so only the user names it.
PROTECTED_DOTTED_KEYS = ("llm.warmstart",)
#: ``llm.warmstart: auto``: the base a plugin knows for the run's world and model
#: (the ``warm_start_for`` hook), resolved here so that config.yaml names it.
AUTO = "auto"


class ConfigError(ValueError):
    """A config file or override is invalid; the message says which and how to fix it."""


def load_yaml(path: Path | str) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigError(f"Could not parse config file {path}: {exc}") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"Config file {path} must hold a mapping at the top level.")
    return loaded


def parse_overrides(overrides: list[str]) -> DictConfig:
    """``["eval.limit=10", "run.seeds=[0,1]"]`` -> config; a malformed item names the fix."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"Override '{item}' is not of the form key=value (e.g. eval.max_steps=50)."
            )
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except Exception as exc:
        raise ConfigError(f"Could not parse overrides {overrides}: {exc}") from exc


def compose(
    plugins: Plugins,
    method: str,
    env: str | None = None,
    config_file: Path | str | None = None,
    overrides: list[str] | None = None,
    preset: str | None = None,
) -> DictConfig:
    """The resolved config of one run (``preset``: one of the method's registered presets)."""
    user_layers = [load_yaml(config_file)] if config_file else []
    user_layers.append(parse_overrides(overrides or []))
    user = _merged(user_layers, "your --config file and key=value overrides")

    base = load_yaml(DEFAULTS_PATH)
    env_name = env if env is not None else (OmegaConf.select(user, "env.name") or base.env.name)
    backend_name = OmegaConf.select(user, "llm.backend") or base.llm.backend

    method_entry = plugins.methods.get(method)
    env_entry = plugins.envs.get(env_name)
    backend_entry = plugins.backends.get(backend_name)

    layers: list[Any] = [base]
    layers.extend({"env": load_yaml(path)} for path in env_entry.configs)
    layers.extend({"llm": load_yaml(path)} for path in backend_entry.configs)
    method_files = list(method_entry.configs)
    if preset is not None:
        if preset not in method_entry.presets:
            raise ConfigError(
                f"Unknown preset '{preset}' for method '{method}'. Available: "
                f"{', '.join(sorted(method_entry.presets)) or '(none)'}"
            )
        method_files.append(method_entry.presets[preset])
    for path in method_files:
        method_layer = load_yaml(path)
        touched = [key for key in PROTECTED_KEYS if key in method_layer]
        touched += [key for key in PROTECTED_DOTTED_KEYS if OmegaConf.select(method_layer, key) is not None]
        if touched:
            raise ConfigError(
                f"Method '{method}' sets {touched} in {path}; evaluation settings are shared by "
                "all methods. Move them out of the method's YAML."
            )
        layers.append(method_layer)
    names = {"method": {"name": method, "preset": preset}, "env": {"name": env_name}}
    defaults = _merged([*layers, names], "the plugins' YAML")
    # A method without YAML of its own declares no keys: its section is its own to check.
    problems = schema.unknown_keys(user, defaults, () if method_entry.configs else ("method",))
    problems += schema.kind_mismatches(user, defaults)
    if problems:
        raise ConfigError("\n".join(problems))
    cfg = _merged([*layers, user, names], "your settings over the defaults")
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:
        raise ConfigError(f"Could not resolve config interpolations: {exc}") from exc
    problems = schema.bad_values(cfg) + _repeated(cfg) + _embedder_problems(cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    if OmegaConf.select(cfg, "llm.warmstart") == AUTO:
        cfg.llm.warmstart = plugins.pm.hook.warm_start_for(env=to_plain(cfg.env), llm=to_plain(cfg.llm))
    return cfg


def _merged(layers: list[Any], what: str) -> DictConfig:
    """OmegaConf's merge, its errors said in a user's words (``run: 5`` where a section goes)."""
    try:
        merged = OmegaConf.merge(*layers)
    except Exception as exc:
        detail = str(exc).splitlines()[0]
        raise ConfigError(f"Could not merge {what}: {detail}. A section such as `run:` takes keys "
                          "(run: {seeds: [0]}), not a single value.") from exc
    assert isinstance(merged, DictConfig)
    return merged


def _repeated(cfg: DictConfig) -> list[str]:
    problems = []
    for key in ("run.seeds", "eval.splits"):
        values = OmegaConf.select(cfg, key)
        if isinstance(values, ListConfig) and len(set(values)) != len(values):
            problems.append(f"{key} lists a value twice ({list(values)}); each must appear once.")
    return problems


def _embedder_problems(cfg: DictConfig) -> list[str]:
    from arena.core.services.embedder import check_embedder_config

    try:
        check_embedder_config(cfg.get("embedder") or {})
    except ValueError as exc:
        return [str(exc)]
    return []


def to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A config section as a plain, resolved dict (what registry factories hand to components)."""
    if not isinstance(cfg, DictConfig):
        return dict(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return plain  # type: ignore[return-value]
