"""Plugin loading: built-ins, entry-point plugins (group ``arena``) and in-process plugins.

Built-in methods, environments and backends are plugins too: their modules are listed in
:data:`DEFAULT_PLUGINS` (from :mod:`arena.builtins`) and register through the same hooks as a third-party package.

Environment variables:

``ARENA_LOAD_PLUGINS``
    Comma-separated entry-point names (or distribution names) to load; others are skipped.
    Set it to an empty string to load no third-party plugin at all.
``ARENA_STRICT_PLUGINS``
    ``1`` makes a broken third-party plugin an error instead of a warning.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from arena.builtins import BUILTIN_PLUGINS
from arena.core.config.registry import Entry, RegistrationError, Registry
from arena.core.contract import hookspecs

ENTRY_POINT_GROUP = "arena"

#: Modules of the built-in plugins (listed in :mod:`arena.builtins`).
DEFAULT_PLUGINS: tuple[str, ...] = BUILTIN_PLUGINS


class PluginLoadError(RuntimeError):
    """A plugin could not be loaded (raised in strict mode, or for an in-process plugin)."""


class PluginLoadWarning(UserWarning):
    """A third-party plugin was skipped because it is broken."""


def hook_names() -> list[str]:
    """Every hook name Arena defines."""
    return sorted(
        name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "arena_spec")
    )


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("arena")
    pm.add_hookspecs(hookspecs)
    return pm


def implemented_hooks(plugin: object) -> tuple[str, ...]:
    """Names of the ``@arena.hookimpl`` functions on a plugin object, class or module."""
    found = []
    for name in dir(plugin):
        try:
            value = getattr(plugin, name)
        except AttributeError:  # pragma: no cover - exotic descriptors
            continue
        if hasattr(value, "arena_impl"):
            found.append(name)
    return tuple(sorted(found))


def validate_hook_names(plugin: object, plugin_name: str) -> None:
    """Fail loudly on a hookimpl whose name is not an Arena hook (a typo such as ``retreive``)."""
    known = hook_names()
    for name in implemented_hooks(plugin):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise pluggy.PluginValidationError(
                plugin,
                f"Plugin '{plugin_name}' implements unknown hook '{name}'.{hint} "
                f"Arena hooks: {', '.join(known)}",
            )


@functools.lru_cache(maxsize=1)
def _top_level_distributions() -> Mapping[str, list[str]]:
    """Top-level module -> distributions; reads every installed distribution's file list (about
    half a second with a few hundred installed), so once per process at most."""
    return importlib.metadata.packages_distributions()


def _distribution_of(
    module_name: str, distribution: importlib.metadata.Distribution | None = None
) -> tuple[str, str]:
    """(distribution name, version) that ships a module, or the module's top package. An entry
    point names its distribution, and Arena's own modules are Arena's, so only in-process
    plugins need the scan of every installed distribution."""
    if distribution is not None:
        return distribution.metadata["Name"], distribution.version
    top = module_name.split(".")[0]
    if top == "arena":
        return "arena", importlib.metadata.version("arena")
    dists = _top_level_distributions().get(top, [])
    if dists:
        try:
            return dists[0], importlib.metadata.version(dists[0])
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover
            return dists[0], "unknown"
    module = sys.modules.get(top)
    return top, str(getattr(module, "__version__", "unknown"))


class Plugins:
    """The global plugin manager plus the three registries it fills."""

    def __init__(self) -> None:
        self.pm = new_plugin_manager()
        self.methods = Registry("method")
        self.envs = Registry("environment")
        self.backends = Registry("backend")
        self.skipped: dict[str, str] = {}  # plugin name -> reason

    # -- registration -----------------------------------------------------------------------

    def register_plugin(
        self,
        plugin: object,
        name: str | None = None,
        distribution: importlib.metadata.Distribution | None = None,
    ) -> None:
        """Register one plugin object or module and collect what it registers (``distribution``:
        the one that ships it, when known, as for an entry point).

        Raises ``pluggy.PluginValidationError`` for unknown hook names or bad signatures and
        :class:`RegistrationError` for name collisions; nothing of a failed plugin stays behind.
        """
        plugin_name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        validate_hook_names(plugin, plugin_name)
        self.pm.register(plugin, name=plugin_name)
        try:
            self.pm.check_pending()
            self._collect(plugin, plugin_name, distribution)
        except Exception:
            self.pm.unregister(plugin)
            raise

    def _collect(
        self, plugin: object, plugin_name: str, distribution: importlib.metadata.Distribution | None
    ) -> None:
        module_name = plugin.__name__ if isinstance(plugin, ModuleType) else type(plugin).__module__
        package, version = _distribution_of(module_name, distribution)
        staged: list[tuple[Registry, Entry]] = []

        def registrar(registry: Registry) -> Callable[..., None]:
            def register(
                name: str,
                factory: Callable[..., Any],
                *,
                config: str | Path | list[str | Path] | None = None,
                description: str = "",
                presets: dict[str, str | Path] | None = None,
            ) -> None:
                # A method class lists the method hooks it implements; otherwise the plugin's.
                hooks = implemented_hooks(factory if isinstance(factory, type) else plugin)
                entry = Entry(
                    name=name,
                    factory=factory,
                    configs=tuple(Path(c) for c in (config if isinstance(config, list) else
                                                    [config] if config is not None else [])),
                    description=description or (factory.__doc__ or "").strip().split("\n")[0],
                    plugin=plugin_name,
                    package=package,
                    version=version,
                    hooks=hooks,
                    presets={name: Path(path) for name, path in (presets or {}).items()},
                )
                staged.append((registry, entry))

            return register

        for hook_name, registry in (
            ("register_methods", self.methods),
            ("register_envs", self.envs),
            ("register_backends", self.backends),
        ):
            impl = getattr(plugin, hook_name, None)
            if impl is not None and hasattr(impl, "arena_impl"):
                impl(register=registrar(registry))
        for registry, entry in staged:  # all or nothing: check every entry before adding any
            registry.check(entry)
        for registry, entry in staged:
            registry.add(entry)

    # -- loading ----------------------------------------------------------------------------

    def load_defaults(self) -> None:
        for module_name in DEFAULT_PLUGINS:
            self.register_plugin(importlib.import_module(module_name), name=module_name)

    def load_entry_points(self, strict: bool | None = None) -> None:
        """Load third-party plugins one by one; a broken one is skipped with a warning."""
        if strict is None:
            strict = os.environ.get("ARENA_STRICT_PLUGINS", "") not in ("", "0")
        allow = os.environ.get("ARENA_LOAD_PLUGINS")
        allowed = None if allow is None else {n.strip() for n in allow.split(",") if n.strip()}
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = entry_point.dist.name if entry_point.dist else ""
            if allowed is not None and entry_point.name not in allowed and dist not in allowed:
                continue
            label = f"{entry_point.name} ({dist or entry_point.value})"
            try:
                self.register_plugin(entry_point.load(), name=entry_point.name,
                                     distribution=entry_point.dist)
            except Exception as exc:  # a third-party plugin must not take Arena down
                reason = f"{type(exc).__name__}: {exc}"
                if strict:
                    raise PluginLoadError(f"Arena plugin {label} failed to load: {reason}") from exc
                self.skipped[entry_point.name] = reason
                warnings.warn(
                    f"Arena plugin {label} failed to load and is skipped: {reason}. "
                    "Fix or uninstall it; set ARENA_STRICT_PLUGINS=1 to make this an error.",
                    PluginLoadWarning,
                    stacklevel=2,
                )


_PLUGINS: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugins, loaded once: built-ins first, then entry points."""
    global _PLUGINS
    if _PLUGINS is None:
        plugins = Plugins()
        plugins.load_defaults()
        plugins.load_entry_points()
        _PLUGINS = plugins
    return _PLUGINS


def reset_plugins() -> None:
    """Forget loaded plugins (tests, or after installing a plugin in-process)."""
    global _PLUGINS
    _PLUGINS = None


__all__ = [
    "DEFAULT_PLUGINS",
    "PluginLoadError",
    "PluginLoadWarning",
    "Plugins",
    "RegistrationError",
    "get_plugins",
    "hook_names",
    "implemented_hooks",
    "new_plugin_manager",
    "reset_plugins",
]
