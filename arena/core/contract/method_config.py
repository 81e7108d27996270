"""A method's config section as a typed object: ``run.cfg.method`` checked against a dataclass.

The method's YAML stays its one list of settings and their defaults; the dataclass says each
setting's type. :func:`typed_config` refuses a key the dataclass does not know (with a
did-you-mean), a key it needs that the config lacks, and a value of the wrong type (OmegaConf's
structured-config conversion: ``"3"`` becomes 3, ``"abc"`` for an int is refused), so a method
reads ``self.cfg.k1`` as an int instead of casting ``int(self.cfg.k1)`` at every use.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class MethodConfigError(ValueError):
    """A method's config does not match the settings its dataclass declares."""


def _unknown_keys(section: Mapping[str, Any], schema: type, prefix: str) -> list[str]:
    """Every key of ``section`` that ``schema`` does not declare, with a did-you-mean each."""
    fields = typing.get_type_hints(schema)
    problems = []
    for key, value in section.items():
        name = str(key)
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
            problems.append(f"Unknown config key '{prefix}{name}'.{hint}")
            continue
        kind = fields[name]
        nested = kind if isinstance(kind, type) else None
        if nested is not None and dataclasses.is_dataclass(nested) and isinstance(value, Mapping):
            problems.extend(_unknown_keys(value, nested, f"{prefix}{name}."))
    return problems


def declared_only(section: Mapping[str, Any], schema: type) -> dict[str, Any]:
    """``section`` cut to the keys the dataclass ``schema`` declares (nested dataclasses
    likewise): for a section shared with others (a backend's fields among the ``llm`` keys), or
    a stored config of another version."""
    hints = typing.get_type_hints(schema)
    kept: dict[str, Any] = {}
    for key, value in section.items():
        kind = hints.get(str(key))
        if kind is None:
            continue
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            value = declared_only(value, kind)
        kept[str(key)] = value
    return kept


def typed_config(section: DictConfig | Mapping[str, Any], schema: type[T], *,
                 prefix: str = "method.", ignore: tuple[str, ...] = ("name", "preset"),
                 others: bool = False) -> T:
    """``section`` as an instance of the dataclass ``schema`` (see the module docstring).
    Keys in ``ignore`` (the harness's ``method.name`` and ``method.preset``) are left out;
    ``others=True`` leaves out every key ``schema`` does not declare instead of refusing it."""
    plain = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) \
        else dict(section)
    assert isinstance(plain, dict)
    plain = {str(k): v for k, v in plain.items() if k not in ignore}
    if others:
        plain = declared_only(plain, schema)
    problems = _unknown_keys(plain, schema, prefix)
    if problems:
        raise MethodConfigError(" ".join(problems))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), plain)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        raise MethodConfigError(f"Config key '{prefix}{key}': {exc.msg if hasattr(exc, 'msg') else exc}"
                                .split("\n")[0]) from exc
