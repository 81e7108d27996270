#!/usr/bin/env bash
# The household `easy` board on the warm-start base (docs/warmstart.md): every row under the same
# protocol (full test splits, the environment's step limit, seed 0 unless said), each run into
# RUNS/<row>, then the board rebuilt from them. Rows already finished are skipped; an interrupted
# one is resumed (RESUME_ARGS=--allow-version-change resumes one begun at an older commit).
# Usage: bash scripts/board_household_easy_warm.sh [ROW ...] (default: all rows).
# One run at a time: two share 2 cores badly.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-/work/runs/household-easy-warm}"
BOARD=leaderboards/household-easy-warm
COMMON=(--env household env.level=easy eval.limit=null llm.dtype=float32)
# Rows started from now on run their method isolated (docs/security.md) on the board's public
# draw; an isolated run plays what an in-process one plays. SkillRL cannot run isolated yet.
ISOLATED=(run.isolation=process eval.salt=public)
mkdir -p "$RUNS"

# The base every run serves: the committed one where it exists, else the recipe (built on first use).
if [[ -f "$BOARD/base/manifest.json" ]]; then WARM="$BOARD/base"; else WARM=household-easy; fi

# shellcheck source=board_rows.sh
source scripts/board_rows.sh  # from the repository root (the cd above)

rows=("$@")
if [[ ${#rows[@]} -eq 0 ]]; then
    rows=(base-seed0 random-seed0 random-seed1 random-seed2 evolving_rl-seed0 grpo-cpu-seed0 rag-seed0
          expel-seed0 memrl-seed0 skillrl-seed0 reflexion-cpu-seed0 mem0-cpu-seed0 gigpo-cpu-seed0)
fi
for row in "${rows[@]}"; do
    case "$row" in
        random-seed*) seed=${row#random-seed}; run_row "$row" random "run.seeds=[$seed]" "learn.seed=$seed" ;;
        grpo-cpu-seed0) run_row "$row" grpo --preset cpu ;;
        reflexion-cpu-seed0|mem0-cpu-seed0|gigpo-cpu-seed0)
            run_row "$row" "${row%-cpu-seed0}" --preset cpu "${ISOLATED[@]}" ;;
        skillrl-seed0) run_row "$row" skillrl ;;
        *-seed0) run_row "$row" "${row%-seed0}" "${ISOLATED[@]}" ;;
        *) echo "unknown row $row" >&2; exit 2 ;;
    esac
done
