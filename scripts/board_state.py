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
    committed board's verdicts, ``seeds_needed``), each seed of a memory method with its reset.
    A run is made when it finished here (``runs``) or is committed beside the board; a finished
    memory row whose reset is missing is listed again where its learned state is gone (neither
    here nor parked): the reset evaluates that state, and the board keeps only small files."""
    board = Path(board_json).parent
    verdicts = json.loads(Path(board_json).read_text()).get("verdicts", [])

    def made(row: str) -> bool:
        return (Path(runs) / row / "results.json").is_file() or (board / "runs" / row / "results.json").is_file()

    def state_kept(row: str) -> bool:
        return (Path(runs) / row).is_dir() or (board / "unfinished" / row).is_dir()

    needed = []
    for verdict in verdicts:
        if verdict["seeds_needed"]:
            name = verdict["row"].split(" (")[0]  # the script's row: the board's label without its preset
            for seed in range(verdict["seeds"] + verdict["seeds_needed"]):
                row, reset = f"{name}-seed{seed}", f"{name}-none-seed{seed}"
                reset_missing = name in reset_methods and not made(reset)
                if not made(row) or (reset_missing and not state_kept(row)):
                    needed.append(row)
                if reset_missing:
                    needed.append(reset)
    print(" ".join(needed))
    return 0


COMMANDS = {"started-commit": started_commit, "learn-done": learn_done, "bf16-native": bf16_native,
            "seeds-needed": seeds_needed}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: board_state.py {{{'|'.join(COMMANDS)}}} ARGS (see the module docstring)")
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
