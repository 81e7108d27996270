"""``arena new-method``: write a method package that installs and passes its own tests at once.

The files are the ``*.tmpl`` files beside this module, with ``${name}``-style placeholders
(:class:`string.Template`) filled in; they are plain text so a wheel carries them as package data.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from string import Template

TEMPLATE_DIR = Path(__file__).parent
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class TemplateError(ValueError):
    """The method name or target folder is not usable; the message says how to fix it."""


def package_names(name: str) -> dict[str, str]:
    """Method, distribution, import package and class names for method ``name``."""
    method = name.replace("-", "_")
    if not _NAME.match(method):
        raise TemplateError(
            f"Method name '{name}' must start with a lowercase letter and hold only lowercase "
            "letters, digits and underscores (e.g. my_method)."
        )
    return {
        "name": method,
        "dist": "arena-" + method.replace("_", "-"),
        "package": f"arena_{method}",
        "class_name": "".join(part.capitalize() for part in method.split("_") if part),
    }


def _arena_version() -> str:
    try:
        return importlib.metadata.version("arena")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source tree only
        return "0.1"


def create_method_package(name: str, path: str | Path | None = None) -> list[Path]:
    """Write the package for method ``name`` into ``path`` (default ``./arena-NAME``).

    Refuses a folder that already holds files, so nothing of the user's is overwritten.
    Returns the files written.
    """
    values = {**package_names(name), "arena_version": _arena_version()}
    root = Path(path) if path is not None else Path.cwd() / values["dist"]
    if root.exists() and any(root.iterdir()):
        raise TemplateError(f"{root} already holds files; pass --path to an empty or new folder.")
    layout = {
        "pyproject.toml.tmpl": "pyproject.toml",
        "README.md.tmpl": "README.md",
        "__init__.py.tmpl": f"{values['package']}/__init__.py",
        "plugin.py.tmpl": f"{values['package']}/plugin.py",
        "config.yaml.tmpl": f"{values['package']}/config.yaml",
        "test_plugin.py.tmpl": "tests/test_plugin.py",
    }
    written = []
    for template, target in layout.items():
        text = Template((TEMPLATE_DIR / template).read_text()).substitute(values)
        destination = root / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(text)
        written.append(destination)
    return written
