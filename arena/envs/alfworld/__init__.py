"""The real ALFWorld text games (extra ``alfworld``): ``--env alfworld``.

Importing this package does not import ``alfworld`` or ``textworld``; only playing a game does.
"""

from arena.envs.alfworld.data import AlfworldDataError
from arena.envs.alfworld.environment import (
    VERSION,
    AlfworldEnvironment,
    AlfworldEpisode,
    AlfworldNotInstalled,
)

__all__ = [
    "VERSION",
    "AlfworldDataError",
    "AlfworldEnvironment",
    "AlfworldEpisode",
    "AlfworldNotInstalled",
]
