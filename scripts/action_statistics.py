"""How a run's policy acts at evaluation: per split, the share of steps of each command verb,
how often an action repeats the one two steps before (the 2-cycles a cloned policy falls into),
and the episodes that end in one. Reads RUN_DIR/trajectories.jsonl (kept in the run directory,
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


if __name__ == "__main__":
    main(sys.argv[1:])
