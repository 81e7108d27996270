"""The modules of Arena's built-in plugins: environments, LLM backends and methods.

Each registers through the same hooks a third-party package uses (``arena.core.contract.hookspecs``);
the list lives outside ``arena.core``, which knows no particular environment or method.
"""

from __future__ import annotations

BUILTIN_PLUGINS: tuple[str, ...] = (
    "arena.envs.household.plugin",
    "arena.envs.alfworld.plugin",
    "arena.envs.babyai.plugin",
    "arena.backends.plugin",
    "arena.backends.warm_bases",
    "arena.plugins.base",
    "arena.plugins.evolving_rl",
    "arena.plugins.expel",
    "arena.plugins.gigpo",
    "arena.plugins.mem0",
    "arena.plugins.memrl",
    "arena.plugins.rag",
    "arena.plugins.random_policy",
    "arena.plugins.reflexion",
    "arena.plugins.skillrl",
    "arena.testing",
)
