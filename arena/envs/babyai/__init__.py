"""BabyAI-Text on minigrid: ``--env babyai`` (see ``docs/babyai.md``).

The environment is in :mod:`arena.envs.babyai.environment`; importing this package (as listing
plugins does) imports only the level ladder, not minigrid.
"""

from arena.envs.babyai.levels import DEFAULT_SEEN, DEFAULT_UNSEEN, LADDER, Level

__all__ = ["DEFAULT_SEEN", "DEFAULT_UNSEEN", "LADDER", "Level"]
