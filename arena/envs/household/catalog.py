"""What a household world is made of: rooms, receptacles, objects, task types and goal phrasings.

The tables follow ALFWorld's text games: receptacle and object names, which receptacles open,
which objects can be heated, cooled or cleaned, and where each kind of object is usually found
(weights rounded from the placements in ALFWorld's game files). Generation in ``layout.py`` and
the rules in ``world.py`` read only these tables, so the world's vocabulary lives in one place.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# Task types
# ---------------------------------------------------------------------------------------------
# ALFWorld's six types (defined once, in arena.envs.alfworld_tasks, for both worlds).
from arena.envs.alfworld_tasks import (
    CLEAN_AND_PLACE,
    COOL_AND_PLACE,
    HEAT_AND_PLACE,
    LOOK_AT_IN_LIGHT,
    PICK_AND_PLACE,
    PICK_TWO_AND_PLACE,
    SEEN_TASK_TYPES,
    UNSEEN_TASK_TYPES,
)

TASK_TYPES = SEEN_TASK_TYPES + UNSEEN_TASK_TYPES

#: ALFWorld's goal phrasings: ``{o}`` object type, ``{r}`` receptacle type, ``{l}`` lamp type.
GOAL_TEMPLATES: dict[str, tuple[str, ...]] = {
    PICK_AND_PLACE: ("put a {o} in {r}.", "put some {o} on {r}."),
    LOOK_AT_IN_LIGHT: ("look at {o} under the {l}.", "examine the {o} with the {l}."),
    CLEAN_AND_PLACE: ("put a clean {o} in {r}.", "clean some {o} and put it in {r}."),
    HEAT_AND_PLACE: ("put a hot {o} in {r}.", "heat some {o} and put it in {r}."),
    COOL_AND_PLACE: ("put a cool {o} in {r}.", "cool some {o} and put it in {r}."),
    PICK_TWO_AND_PLACE: ("put two {o} in {r}.", "find two {o} and put them in {r}."),
}

# ---------------------------------------------------------------------------------------------
# Rooms and receptacles
# ---------------------------------------------------------------------------------------------

KITCHEN = "kitchen"
LIVING_ROOM = "livingroom"
BEDROOM = "bedroom"
BATHROOM = "bathroom"

#: Receptacle types per room with (min, max) counts; every room has 8 to 25 receptacles.
ROOM_RECEPTACLES: dict[str, tuple[tuple[str, int, int], ...]] = {
    KITCHEN: (
        ("cabinet", 2, 6),
        ("coffeemachine", 1, 1),
        ("countertop", 1, 3),
        ("diningtable", 0, 1),
        ("drawer", 1, 3),
        ("fridge", 1, 1),
        ("garbagecan", 1, 1),
        ("microwave", 1, 1),
        ("shelf", 0, 2),
        ("sinkbasin", 1, 1),
        ("stoveburner", 2, 4),
        ("toaster", 1, 1),
    ),
    LIVING_ROOM: (
        ("armchair", 0, 1),
        ("cabinet", 0, 2),
        ("coffeetable", 1, 1),
        ("diningtable", 0, 1),
        ("drawer", 1, 3),
        ("dresser", 0, 1),
        ("garbagecan", 1, 1),
        ("safe", 0, 1),
        ("shelf", 2, 4),
        ("sidetable", 1, 2),
        ("sofa", 1, 1),
        ("tvstand", 1, 1),
    ),
    BEDROOM: (
        ("armchair", 0, 1),
        ("bed", 1, 1),
        ("desk", 1, 1),
        ("drawer", 3, 6),
        ("dresser", 0, 1),
        ("garbagecan", 1, 1),
        ("laundryhamper", 0, 1),
        ("safe", 0, 1),
        ("shelf", 1, 3),
        ("sidetable", 1, 2),
    ),
    BATHROOM: (
        ("bathtubbasin", 0, 1),
        ("cabinet", 2, 4),
        ("countertop", 1, 1),
        ("drawer", 1, 3),
        ("garbagecan", 1, 1),
        ("handtowelholder", 0, 1),
        ("shelf", 0, 2),
        ("sinkbasin", 1, 2),
        ("toilet", 1, 1),
        ("toiletpaperhanger", 1, 1),
        ("towelholder", 1, 1),
    ),
}

#: Receptacles that start closed and must be opened to see or reach their contents.
OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})

#: The appliance each transformation needs (ALFWorld: heat in a microwave, cool in a fridge,
#: clean in a sink basin).
HEAT_APPLIANCE = "microwave"
COOL_APPLIANCE = "fridge"
CLEAN_APPLIANCE = "sinkbasin"

# ---------------------------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------------------------

DESKLAMP = "desklamp"

#: Where each object type is found: receptacle type -> relative weight.
OBJECT_HOMES: dict[str, dict[str, int]] = {
    "alarmclock": {"desk": 5, "shelf": 3, "sidetable": 3, "dresser": 2, "diningtable": 1},
    "apple": {
        "fridge": 9, "countertop": 9, "diningtable": 5, "garbagecan": 5, "microwave": 5,
        "sinkbasin": 3,
    },
    "book": {
        "bed": 8, "desk": 3, "drawer": 2, "dresser": 1, "sidetable": 1, "coffeetable": 2,
        "armchair": 1, "sofa": 2, "shelf": 1, "diningtable": 1,
    },
    "bowl": {
        "cabinet": 12, "fridge": 8, "countertop": 8, "diningtable": 6, "desk": 3, "shelf": 3,
        "sinkbasin": 1, "microwave": 1,
    },
    "box": {
        "diningtable": 3, "sofa": 3, "coffeetable": 3, "shelf": 1, "sidetable": 1, "cabinet": 1,
        "dresser": 1, "armchair": 1, "tvstand": 1,
    },
    "bread": {"countertop": 16, "diningtable": 9, "fridge": 4},
    "butterknife": {"countertop": 20, "diningtable": 8, "drawer": 3, "sinkbasin": 2},
    "candle": {
        "countertop": 4, "toilet": 4, "cabinet": 2, "drawer": 2, "shelf": 1, "sidetable": 1,
        "coffeetable": 1,
    },
    "cd": {
        "drawer": 4, "desk": 3, "dresser": 2, "sidetable": 2, "garbagecan": 1, "shelf": 1,
        "safe": 1,
    },
    "cellphone": {
        "drawer": 5, "bed": 5, "desk": 3, "dresser": 2, "sidetable": 2, "shelf": 2,
        "diningtable": 1, "armchair": 1, "sofa": 1, "safe": 1, "coffeetable": 1,
    },
    "cloth": {
        "bathtubbasin": 4, "cabinet": 3, "countertop": 2, "drawer": 2, "sinkbasin": 1,
        "shelf": 1, "toilet": 1,
    },
    "creditcard": {
        "drawer": 8, "shelf": 4, "sidetable": 4, "desk": 3, "dresser": 3, "sofa": 2,
        "armchair": 2, "coffeetable": 2, "diningtable": 2, "tvstand": 1, "safe": 1,
    },
    "cup": {
        "cabinet": 8, "fridge": 8, "countertop": 8, "diningtable": 5, "sinkbasin": 4,
        "microwave": 3,
    },
    "dishsponge": {
        "countertop": 10, "cabinet": 9, "drawer": 8, "diningtable": 4, "sinkbasin": 3,
        "garbagecan": 2,
    },
    "egg": {
        "fridge": 9, "countertop": 9, "sinkbasin": 5, "garbagecan": 5, "microwave": 4,
        "diningtable": 4,
    },
    "fork": {"countertop": 16, "diningtable": 8, "drawer": 8, "sinkbasin": 3},
    "handtowel": {"handtowelholder": 10, "countertop": 1},
    "kettle": {"stoveburner": 7, "countertop": 4, "cabinet": 4, "diningtable": 1},
    "keychain": {
        "drawer": 5, "sidetable": 4, "shelf": 3, "desk": 3, "dresser": 2, "coffeetable": 2,
        "diningtable": 1, "armchair": 1, "sofa": 1, "safe": 1, "tvstand": 1,
    },
    "knife": {"countertop": 17, "diningtable": 8, "drawer": 7, "sinkbasin": 2},
    "ladle": {"countertop": 5, "cabinet": 3, "drawer": 2, "diningtable": 2},
    "laptop": {
        "bed": 9, "desk": 2, "sofa": 2, "diningtable": 2, "coffeetable": 2, "dresser": 1,
        "armchair": 1, "sidetable": 1,
    },
    "lettuce": {"countertop": 14, "diningtable": 9, "fridge": 8, "sinkbasin": 2},
    "mug": {
        "countertop": 11, "coffeemachine": 7, "cabinet": 7, "fridge": 6, "diningtable": 5,
        "microwave": 3, "desk": 3, "sinkbasin": 2, "shelf": 2, "sidetable": 1, "dresser": 1,
    },
    "newspaper": {
        "sofa": 3, "coffeetable": 3, "diningtable": 3, "sidetable": 2, "shelf": 2, "dresser": 1,
        "armchair": 1, "tvstand": 1,
    },
    "pan": {"stoveburner": 18, "countertop": 11, "cabinet": 2, "fridge": 1, "diningtable": 1},
    "papertowelroll": {"countertop": 4, "garbagecan": 1, "diningtable": 1, "shelf": 1},
    "pen": {
        "desk": 4, "drawer": 4, "dresser": 3, "shelf": 3, "sidetable": 3, "diningtable": 2,
        "garbagecan": 1,
    },
    "pencil": {
        "desk": 4, "drawer": 4, "dresser": 3, "shelf": 3, "sidetable": 3, "diningtable": 2,
        "garbagecan": 1,
    },
    "peppershaker": {"cabinet": 12, "countertop": 12, "diningtable": 6, "drawer": 6, "shelf": 1},
    "pillow": {"bed": 13, "sofa": 4, "armchair": 1},
    "plate": {
        "cabinet": 13, "countertop": 10, "diningtable": 6, "fridge": 3, "shelf": 1,
        "sinkbasin": 1,
    },
    "pot": {"stoveburner": 25, "countertop": 5, "fridge": 1, "diningtable": 1, "cabinet": 1},
    "potato": {
        "countertop": 10, "fridge": 9, "diningtable": 6, "sinkbasin": 4, "microwave": 4,
        "garbagecan": 2,
    },
    "remotecontrol": {
        "coffeetable": 4, "sofa": 3, "sidetable": 3, "diningtable": 2, "dresser": 2, "drawer": 2,
        "armchair": 2, "tvstand": 2, "shelf": 1,
    },
    "saltshaker": {"cabinet": 12, "countertop": 12, "diningtable": 6, "drawer": 6, "shelf": 1},
    "soapbar": {
        "countertop": 3, "toilet": 2, "sinkbasin": 2, "cabinet": 2, "bathtubbasin": 2,
        "drawer": 1, "garbagecan": 1, "shelf": 1,
    },
    "soapbottle": {
        "countertop": 15, "cabinet": 14, "diningtable": 7, "garbagecan": 5, "toilet": 3,
        "shelf": 2,
    },
    "spatula": {"countertop": 16, "diningtable": 8, "drawer": 8, "sinkbasin": 3},
    "spoon": {"countertop": 14, "drawer": 10, "diningtable": 7, "sinkbasin": 4},
    "spraybottle": {"countertop": 5, "toilet": 4, "cabinet": 3, "garbagecan": 2, "shelf": 1},
    "statue": {
        "shelf": 5, "coffeetable": 3, "diningtable": 2, "sidetable": 2, "dresser": 1,
        "tvstand": 1, "desk": 1,
    },
    "teddybear": {"bed": 1},
    "tissuebox": {
        "shelf": 2, "coffeetable": 2, "drawer": 2, "sidetable": 2, "diningtable": 1, "desk": 1,
        "tvstand": 1,
    },
    "toiletpaper": {
        "toilet": 3, "countertop": 3, "cabinet": 2, "toiletpaperhanger": 2, "drawer": 2,
        "garbagecan": 1, "shelf": 1,
    },
    "tomato": {"fridge": 12, "countertop": 11, "diningtable": 7, "garbagecan": 3, "sinkbasin": 3},
    "towel": {"towelholder": 1},
    "vase": {
        "shelf": 6, "cabinet": 3, "coffeetable": 2, "diningtable": 1, "dresser": 1, "sidetable": 1,
        "tvstand": 1,
    },
    "watch": {
        "drawer": 3, "coffeetable": 3, "sidetable": 2, "diningtable": 1, "dresser": 1,
        "tvstand": 1, "shelf": 1, "safe": 1,
    },
    "winebottle": {"countertop": 5, "cabinet": 4, "diningtable": 4, "garbagecan": 1, "shelf": 1},
}

#: Where a desk lamp stands (it is listed with the receptacle's contents and cannot be taken).
DESKLAMP_HOMES: dict[str, int] = {"sidetable": 4, "desk": 3, "dresser": 2, "shelf": 1}

#: Which object types each room is furnished with.
ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    KITCHEN: (
        "apple", "bowl", "bread", "butterknife", "cup", "dishsponge", "egg", "fork", "kettle",
        "knife", "ladle", "lettuce", "mug", "pan", "papertowelroll", "peppershaker", "plate",
        "pot", "potato", "saltshaker", "soapbottle", "spatula", "spoon", "spraybottle", "tomato",
        "winebottle",
    ),
    LIVING_ROOM: (
        "book", "box", "candle", "cellphone", "creditcard", "keychain", "laptop", "newspaper",
        "pillow", "remotecontrol", "statue", "tissuebox", "vase", "watch",
    ),
    BEDROOM: (
        "alarmclock", "book", "bowl", "cd", "cellphone", "creditcard", "keychain", "laptop",
        "mug", "pen", "pencil", "pillow", "teddybear", "tissuebox",
    ),
    BATHROOM: (
        "candle", "cloth", "handtowel", "soapbar", "soapbottle", "spraybottle", "toiletpaper",
        "towel",
    ),
}

#: ALFWorld's object properties: which types the microwave, fridge and sink basin accept.
HEATABLE = frozenset({"apple", "bread", "cup", "egg", "mug", "plate", "potato", "tomato"})
COOLABLE = frozenset(
    {"apple", "bowl", "bread", "cup", "egg", "lettuce", "mug", "pan", "plate", "pot", "potato",
     "tomato", "winebottle"}
)
CLEANABLE = frozenset(
    {"apple", "bowl", "butterknife", "cloth", "cup", "dishsponge", "egg", "fork", "kettle",
     "knife", "ladle", "lettuce", "mug", "pan", "plate", "pot", "potato", "soapbar", "spatula",
     "spoon", "tomato"}
)
#: Objects that hold things; ALFWorld describes them as containers when examined.
RECEPTACLE_OBJECTS = frozenset({"bowl", "box", "cup", "mug", "pan", "plate", "pot"})

# ---------------------------------------------------------------------------------------------
# Which goals each task type draws (room weights, object types, target receptacle types)
# ---------------------------------------------------------------------------------------------

#: Rooms a task type is set in, with weights.
TASK_ROOMS: dict[str, dict[str, int]] = {
    PICK_AND_PLACE: {KITCHEN: 35, LIVING_ROOM: 25, BEDROOM: 20, BATHROOM: 20},
    PICK_TWO_AND_PLACE: {KITCHEN: 35, LIVING_ROOM: 25, BEDROOM: 20, BATHROOM: 20},
    CLEAN_AND_PLACE: {KITCHEN: 75, BATHROOM: 25},
    HEAT_AND_PLACE: {KITCHEN: 1},
    COOL_AND_PLACE: {KITCHEN: 1},
    LOOK_AT_IN_LIGHT: {BEDROOM: 60, LIVING_ROOM: 40},
}

#: Where a transformed object may be asked to go (ALFWorld's targets for these types); the
#: placement types pick their targets among the object's usual homes instead.
TRANSFORM_TARGETS: dict[str, frozenset[str]] = {
    HEAT_AND_PLACE: frozenset(
        {"fridge", "cabinet", "countertop", "garbagecan", "diningtable", "shelf"}
    ),
    COOL_AND_PLACE: frozenset(
        {"microwave", "countertop", "diningtable", "cabinet", "garbagecan", "shelf"}
    ),
    CLEAN_AND_PLACE: frozenset(
        {"countertop", "diningtable", "drawer", "cabinet", "microwave", "fridge", "shelf",
         "toilet", "garbagecan"}
    ),
}
#: Extra targets that only make sense for some objects ("put a hot mug in coffeemachine").
EXTRA_TARGETS: dict[str, frozenset[str]] = {
    "mug": frozenset({"coffeemachine"}),
    "pan": frozenset({"stoveburner"}),
    "pot": frozenset({"stoveburner"}),
    "kettle": frozenset({"stoveburner"}),
}

#: Object types a transformation task may ask for.
TRANSFORM_OBJECTS: dict[str, frozenset[str]] = {
    HEAT_AND_PLACE: HEATABLE,
    COOL_AND_PLACE: COOLABLE,
    CLEAN_AND_PLACE: CLEANABLE,
}

#: How an object is placed: ``move X to Y`` (ALFWorld 0.3 on, the world's own), or ``put X in/on Y``
#: (ALFWorld's earlier grammar): a changed world for ``arena experiment stale``.
MOVE_DIALECT, PUT_DIALECT = "move", "put"
DIALECTS = (MOVE_DIALECT, PUT_DIALECT)

HELP_TEXT = (
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object"
)
PUT_HELP_TEXT = HELP_TEXT.replace("  move (object) to (receptacle):  ", "  put (object) in/on (receptacle):")
