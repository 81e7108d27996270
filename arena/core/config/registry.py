"""Name -> factory registries for methods, environments and LLM backends.

Plugins fill them through the registration hooks; lookups of unknown names answer with the
closest names and the full list, so a typo is fixed from the error message alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class UnknownNameError(KeyError):
    """An unknown method, environment or backend name. ``str()`` is the user-facing message."""

    def __str__(self) -> str:
        return str(self.args[0])


class RegistrationError(ValueError):
    """A plugin registered a name twice or with a bad config path."""


@dataclass(frozen=True)
class Entry:
    """One registered component."""

    name: str
    factory: Callable[..., Any]
    configs: tuple[Path, ...]  # YAML defaults, merged in order
    description: str
    plugin: str  # name of the plugin that registered it
    package: str  # distribution that ships it
    version: str
    hooks: tuple[str, ...] = field(default=())
    presets: dict[str, Path] = field(default_factory=dict)  # name -> YAML merged on request


def did_you_mean(kind: str, name: str, available: list[str]) -> str:
    """``Unknown method 'evolvng_rl'. Did you mean 'evolving_rl'? Available: a, b``."""
    message = f"Unknown {kind} '{name}'."
    close = difflib.get_close_matches(name, available, n=1, cutoff=0.6)
    if close:
        message += f" Did you mean '{close[0]}'?"
    message += f" Available: {', '.join(sorted(available)) or '(none)'}"
    return message


class Registry:
    """Registered components of one kind (``method``, ``environment`` or ``backend``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def check(self, entry: Entry) -> None:
        """Raise :class:`RegistrationError` if ``entry`` cannot be added."""
        if entry.name in self._entries:
            other = self._entries[entry.name]
            raise RegistrationError(
                f"{self.kind} '{entry.name}' is registered twice: by plugin '{other.plugin}' and by "
                f"plugin '{entry.plugin}'. Uninstall one of them or block it with ARENA_LOAD_PLUGINS."
            )
        for path in (*entry.configs, *entry.presets.values()):
            if not path.is_file():
                raise RegistrationError(
                    f"{self.kind} '{entry.name}' (plugin '{entry.plugin}') names a config file "
                    f"that does not exist: {path}"
                )

    def add(self, entry: Entry) -> None:
        self.check(entry)
        self._entries[entry.name] = entry

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(did_you_mean(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[name] for name in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries
