"""ALFWorld's task types and its household instructions, in one place for both worlds that use
them: the real ALFWorld games (``arena.envs.alfworld``) and their embedded twin
(``arena.envs.household``), which imitates their commands, replies and task types.
"""

from __future__ import annotations

from arena.core.contract.env import Instructions

PICK_AND_PLACE = "pick_and_place_simple"
LOOK_AT_IN_LIGHT = "look_at_obj_in_light"
CLEAN_AND_PLACE = "pick_clean_then_place_in_recep"
HEAT_AND_PLACE = "pick_heat_then_place_in_recep"
COOL_AND_PLACE = "pick_cool_then_place_in_recep"
PICK_TWO_AND_PLACE = "pick_two_obj_and_place"

#: Types learned on (train, valid) and evaluated in-distribution (test_seen): Evolving-RL's type
#: split (``src/data/alfworld/split.py``) ...
SEEN_TASK_TYPES = (PICK_AND_PLACE, CLEAN_AND_PLACE, HEAT_AND_PLACE, COOL_AND_PLACE)
#: ... and the two types held out of training entirely (test_unseen only).
UNSEEN_TASK_TYPES = (PICK_TWO_AND_PLACE, LOOK_AT_IN_LIGHT)
#: Every type, in the order of ALFWorld's own list.
TASK_TYPES = (
    PICK_AND_PLACE, LOOK_AT_IN_LIGHT, CLEAN_AND_PLACE, HEAT_AND_PLACE, COOL_AND_PLACE,
    PICK_TWO_AND_PLACE,
)

#: ALFWorld's commands name what they do ("heat apple 1 with microwave 1"), so no command help.
HOUSEHOLD_INSTRUCTIONS = Instructions(setting="a household", domain="household")
