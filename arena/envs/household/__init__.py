"""The embedded household world: a pure-Python, seeded text environment in ALFWorld's grammar."""

from arena.envs.household.environment import VERSION, HouseholdEnvironment, make_task
from arena.envs.household.world import HouseholdEpisode

__all__ = ["VERSION", "HouseholdEnvironment", "HouseholdEpisode", "make_task"]
