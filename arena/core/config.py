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

from omegaconf import DictConfig, OmegaConf

from arena.core.plugins import Plugins

DEFAULTS_PATH = Path(__file__).parent / "configs" / "defaults.yaml"
#: Settings a method's YAML may not set: they define the comparison, the same for every method.
PROTECTED_KEYS = ("eval", "run", "env")


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
    user = OmegaConf.merge(*user_layers)

    base = load_yaml(DEFAULTS_PATH)
    env_name = env or OmegaConf.select(user, "env.name") or base.env.name
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
        if touched:
            raise ConfigError(
                f"Method '{method}' sets {touched} in {path}; evaluation settings are shared by "
                "all methods. Move them out of the method's YAML."
            )
        layers.append(method_layer)
    layers.append(user)
    layers.append({"method": {"name": method, "preset": preset}, "env": {"name": env_name}})
    cfg = OmegaConf.merge(*layers)
    assert isinstance(cfg, DictConfig)
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:
        raise ConfigError(f"Could not resolve config interpolations: {exc}") from exc
    check_choices(cfg)
    return cfg


#: Harness keys that take one of a few named values.
CHOICES: dict[str, tuple[str, ...]] = {
    "run.track": ("frozen", "online"),
    "eval.source_pool": ("train", "all_types"),
}


def check_choices(cfg: DictConfig) -> None:
    """Refuse a value of a :data:`CHOICES` key that is not one of its choices."""
    for key, choices in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}; "
                              f"set {key}=<one of them>.")


def to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A config section as a plain, resolved dict (what registry factories hand to components)."""
    if not isinstance(cfg, DictConfig):
        return dict(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return plain  # type: ignore[return-value]
