"""What the board scripts ask of a run directory or a board, one subcommand each (so the shell
scripts hold no Python of their own):

    python3 scripts/board_state.py started-commit RUN_DIR    # the commit that started the run ("" if none)
    python3 scripts/board_state.py learn-done RUN_DIR        # exit 0 once its learning has finished
    python3 scripts/board_state.py bf16-native               # exit 0 where torch trains in bf16 autocast
    python3 scripts/board_state.py seeds-needed BOARD_JSON RUNS METHOD...  # the runs claims wait for

Reads state.json (the run's ledger) and leaderboard.json as plain JSON: no Arena import, so it
runs in any Python 3 (``bf16-native`` alone needs torch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _state(run_dir: str) -> dict:
    path = Path(run_dir) / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def started_commit(run_dir: str) -> int:
    print(_state(run_dir).get("provenance", {}).get("git_sha") or "")
    return 0


def learn_done(run_dir: str) -> int:
    return 0 if _state(run_dir).get("learn_done") else 1


def bf16_native() -> int:
    """torch's own test, the one the trainer's ``precision: auto`` resolves by."""
    import torch

    return 0 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 1


def seeds_needed(board_json: str, runs: str, *reset_methods: str) -> int:
    """The runs still missing for the rows whose claims wait for more learning seeds (the
    committed board's verdicts, ``seeds_needed``), each seed of a memory method with its reset."""
    board = json.loads(Path(board_json).read_text())
    needed = []
    for verdict in board.get("verdicts", []):
        if verdict["seeds_needed"]:
            name = verdict["row"].split(" (")[0]  # the script's row: the board's label without its preset
            for seed in range(verdict["seeds"] + verdict["seeds_needed"]):
                needed += [f"{name}-seed{seed}"] + ([f"{name}-none-seed{seed}"] if name in reset_methods else [])
    print(" ".join(row for row in needed if not (Path(runs) / row / "results.json").is_file()))
    return 0


COMMANDS = {"started-commit": started_commit, "learn-done": learn_done, "bf16-native": bf16_native,
            "seeds-needed": seeds_needed}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: board_state.py {{{'|'.join(COMMANDS)}}} ARGS (see the module docstring)")
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
