"""How a run's policy acts at evaluation: per split, the share of steps of each command verb,
how often an action repeats the one two steps before (the 2-cycles a cloned policy falls into),
the episodes that end in one, and per household task type that needs one, the episodes that ever
issue its key command (heat, cool, clean, use: a policy that copies another type's examples
skips it). Reads RUN_DIR/trajectories.jsonl (kept in the run directory,
not committed beside a board: re-run a row to get it).

Usage: python scripts/action_statistics.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def primary_episodes(run: Path) -> list[dict]:
    """The evaluation's primary episodes (no helper or paired variants)."""
    path = run / "trajectories.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} not found: this needs the run directory the run wrote, not a board's copy")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row["key"][0] == "evaluate" and row["key"][4] == "default"]


def ends_in_two_cycle(actions: list[str], window: int = 6) -> bool:
    tail = actions[-window:]
    return len(tail) == window and len(set(tail)) == 2 and len(set(tail[0::2])) == 1


#: The command a household task type cannot be solved without (ALFWorld's types).
KEY_VERB = {"pick_heat_then_place_in_recep": "heat", "pick_cool_then_place_in_recep": "cool",
            "pick_clean_then_place_in_recep": "clean", "look_at_obj_in_light": "use"}


def key_steps(episodes: list[dict]) -> dict[str, str]:
    """Task type -> "k/n": of its n episodes, k issued the type's key command at least once."""
    issued: Counter[str] = Counter()
    played: Counter[str] = Counter()
    for episode in episodes:
        task_type = episode["task"]["task_type"]
        if task_type in KEY_VERB:
            played[task_type] += 1
            issued[task_type] += any(step["action"].split()[:1] == [KEY_VERB[task_type]] for step in episode["steps"])
    return {f"{KEY_VERB[t]} ({t})": f"{issued[t]}/{played[t]}" for t in sorted(played)}


def summary(episodes: list[dict]) -> dict[str, object]:
    verbs: Counter[str] = Counter()
    steps = repeats = cycles = 0
    for episode in episodes:
        actions = [step["action"] for step in episode["steps"]]
        steps += len(actions)
        verbs.update(action.split()[0] for action in actions if action)
        repeats += sum(1 for earlier, later in zip(actions, actions[2:]) if earlier == later)
        cycles += ends_in_two_cycle(actions)
    return {
        "episodes": len(episodes),
        "ends_in_2_cycle": cycles / max(1, len(episodes)),
        "repeats_two_back": repeats / max(1, steps),
        "verbs": {verb: count / max(1, steps) for verb, count in verbs.most_common(6)},
    }


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    for name in argv:
        episodes = primary_episodes(Path(name))
        for split in sorted({row["key"][1] for row in episodes}):
            figures = summary([row for row in episodes if row["key"][1] == split])
            verbs = ", ".join(f"{verb} {share:.0%}" for verb, share in figures["verbs"].items())  # type: ignore[union-attr]
            print(f"{name} {split}: {figures['episodes']} episodes; ending in a 2-cycle "
                  f"{figures['ends_in_2_cycle']:.0%}; action = the one two steps before "
                  f"{figures['repeats_two_back']:.0%}; verbs: {verbs}")
            keyed = key_steps([row for row in episodes if row["key"][1] == split])
            if keyed:
                print("  episodes that issue their type's key command: "
                      + ", ".join(f"{verb} {share}" for verb, share in keyed.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
