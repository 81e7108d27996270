"""Arena: a fair, reproducible harness for comparing experience-driven LLM-agent methods.

A plugin imports what it needs from here: the names are :mod:`arena.api`'s (the ``Run``
protocol a method hook receives, the types, the solver and RL helpers), re-exported.
"""

__version__ = "0.2.0"  # first: core modules that ``import arena`` read it while this loads

from arena.api import *  # noqa: F403 - the public API, listed in arena.api.__all__
from arena.api import __all__ as _api_names

__all__ = ["__version__", *_api_names]
