"""Arena: a fair, reproducible harness for comparing experience-driven LLM-agent methods."""

from arena.core.hookspecs import hookimpl, hookspec

__version__ = "0.2.0"

__all__ = ["__version__", "hookimpl", "hookspec"]
