#!/usr/bin/env bash
# The household `medium` board (world 2.0) on its warm-start base (docs/warmstart.md): every row
# under one protocol (full test splits, the environment's step limit, float32, every method
# isolated on the board's public draw) and one learning budget, B = 72 train episodes learned
# from: what `grpo --preset cpu` plays (3 iterations x 3 tasks x groups of 8; its 48 greedy valid
# episodes only draw the learning curve).
# docs/board_budget.md says what each row spends B on and why each override is arithmetic on B.
# Rows already finished are skipped; an interrupted one is resumed.
# Usage: bash scripts/board_household_medium_warm.sh [ROW ...] (default: all rows) | --commit |
# --seeds-needed | --park. One run at a time: two share 2 cores badly.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-/work/runs/household-medium-warm}"
BOARD="${BOARD:-leaderboards/household-medium-warm}"  # another folder for tests
COMMON=(--env household env.level=medium eval.limit=null llm.dtype=float32)
ISOLATED=(run.isolation=process eval.salt=public)
mkdir -p "$RUNS"

if [[ -f "$BOARD/base/manifest.json" ]]; then WARM="$BOARD/base"; else WARM=household-medium; fi

# shellcheck source=board_rows.sh
source scripts/board_rows.sh  # from the repository root (the cd above)

# ROW-seedS: the row's method and budget overrides at seed S (run.seeds=[S] learn.seed=S: the test
# tasks are the board's public draw whatever S; greedy evaluation; S varies what learning samples,
# and runs of one row with different seeds pool into the row).
row_args() {  # row_args ROW -> METHOD ARGS...
    case "$1" in
        base) echo base ;;
        random) echo random ;;
        rag|memrl) echo "$1 learn.budget.episodes=72" ;;
        mem0|reflexion) echo "$1 --preset cpu learn.budget.episodes=72" ;;
        expel) echo "expel method.train_tasks=24 learn.budget.episodes=72" ;;
        grpo|gigpo) echo "$1 --preset cpu" ;;
        evolving_rl) echo "evolving_rl --preset cpu method.n_skills=7" ;;
        # Evolving-RL's ablation at the board's budget (item 5): the row with one role untrained.
        evolving_rl_solver_only) echo "evolving_rl --preset cpu method.n_skills=7 method.train_extractor=false" ;;
        evolving_rl_extractor_only) echo "evolving_rl --preset cpu method.n_skills=7 method.train_solver=false" ;;
        skillrl) echo "skillrl method.rl.steps=5" ;;
        *) return 1 ;;
    esac
}

# ROW-none-seedS: the memory reset of a memory method's row (item 5 of issue 55, the papers'
# "memory reset" control): the learned state of ROW-seedS evaluated again with no experience
# shown (eval.experience.source=none), every other setting the row's; paired with the row itself.
RESET_METHODS=(rag memrl expel mem0 reflexion skillrl)  # the rows with a memory reset (park_rows)
run_reset() {  # run_reset ROW-none-seedS
    local row=$1 source="$RUNS/${1/-none-/-}" out="$RUNS/$1"
    if [[ -f "$out/results.json" ]]; then echo "[board] $row: done" >&2; return; fi
    local parked  # the reset and its source, each put back from BOARD/unfinished where parked
    for parked in "$1" "${1/-none-/-}"; do
        if [[ ! -d "$RUNS/$parked" && -d "$BOARD/unfinished/$parked" ]]; then
            echo "[board] $row: $parked put back from $BOARD/unfinished/$parked" >&2
            cp -a "$BOARD/unfinished/$parked" "$RUNS/$parked"
        fi
    done
    if [[ ! -f "$source/results.json" ]]; then echo "[board] $row: $source has not finished" >&2; return 1; fi
    if [[ -d "$out" ]]; then resume_run "$out"; return; fi
    echo "[board] $row: arena evaluate --state $source eval.experience.source=none ${ISOLATED[*]}" >&2
    arena evaluate --state "$source" --out "$out" eval.experience.source=none "${ISOLATED[@]}"
}

# --commit: copy every finished row's small files beside the board (runs/, the ablation's arms
# under ablation/) and rebuild it, each row against base and random (and a memory method against
# its reset, which the board pairs by itself).
commit_board() {
    local run dest small=(results.json episodes.jsonl config.yaml state.json metrics.jsonl verification.json violations.jsonl)
    for run in "$RUNS"/*/; do
        run=${run%/}
        [[ -f "$run/results.json" ]] || { echo "[board] $(basename "$run"): not finished, left out" >&2; continue; }
        case "$(basename "$run")" in
            evolving_rl_*) dest="$BOARD/ablation/$(basename "$run")" ;;
            *) dest="$BOARD/runs/$(basename "$run")" ;;
        esac
        mkdir -p "$dest"
        for file in "${small[@]}"; do [[ -f "$run/$file" ]] && cp "$run/$file" "$dest/"; done
    done
    arena leaderboard "$BOARD"/runs/*/ --control base --control random --out "$BOARD"
}
# --seeds-needed: the runs still missing for the rows whose claims wait for more learning seeds
# (the committed board's verdicts, `seeds_needed`), each seed of a memory method (RESET_METHODS)
# with its memory reset; run them with: bash THIS_SCRIPT $(bash THIS_SCRIPT --seeds-needed)
seeds_needed() {
    python3 scripts/board_state.py seeds-needed "$BOARD/leaderboard.json" "$RUNS" "${RESET_METHODS[@]}"
}
if [[ "${1:-}" == --commit ]]; then commit_board; exit; fi
if [[ "${1:-}" == --seeds-needed ]]; then seeds_needed; exit; fi
if [[ "${1:-}" == --park ]]; then park_rows; exit; fi

# The rows that train a policy. Their trainer's precision is `auto`: bf16 autocast on a CPU that
# computes bf16 natively, float32 on one that does not, so the same row would learn in two
# precisions on two machines (docs/board_budget.md). Every RL row has learned in bf16 autocast so
# far, so an RL row learns only where that is native; its evaluation goes on anywhere.
RL_METHODS=(grpo gigpo evolving_rl evolving_rl_solver_only evolving_rl_extractor_only skillrl)
check_learns_in_bf16() {  # check_learns_in_bf16 ROW METHOD: refuses where ROW would learn in float32
    local row=$1 method=$2
    [[ " ${RL_METHODS[*]} " == *" $method "* ]] || return 0
    if python3 scripts/board_state.py learn-done "$RUNS/$row"; then
        return 0  # learned: its evaluation runs in the board's float32 on any machine
    fi
    if ! python3 scripts/board_state.py bf16-native; then
        echo "[board] $row not started: this CPU computes no bf16 natively (or python3 has no torch:" \
             "activate Arena's virtualenv), so its policy updates would run in float32 where the board's" \
             "other RL rows ran in bf16 autocast. Run it on a CPU with AVX-512 or AMX; run the memory rows here." >&2
        return 1
    fi
}
refused=0

rows=("$@")
if [[ ${#rows[@]} -eq 0 ]]; then
    rows=(base-seed0 random-seed0 random-seed1 random-seed2)
    for method in rag memrl mem0 reflexion expel grpo gigpo evolving_rl skillrl; do rows+=("$method-seed0"); done
fi
for row in "${rows[@]}"; do
    if [[ $row == *-none-seed* ]]; then run_reset "$row"; continue; fi
    name=${row%-seed*} seed=${row##*-seed}
    if ! read -r -a args <<<"$(row_args "$name")" || [[ ${#args[@]} -eq 0 ]]; then echo "unknown row $row" >&2; exit 2; fi
    check_learns_in_bf16 "$row" "$name" || { refused=1; continue; }
    run_row "$row" "${args[@]}" "run.seeds=[$seed]" "learn.seed=$seed" "${ISOLATED[@]}"
done
exit $refused
