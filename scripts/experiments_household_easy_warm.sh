#!/usr/bin/env bash
# The experiments of docs/experiments.md on the household `easy` warm-start board, with the
# embedded model. The source is the board's `rag` row learned again (the same settings, evaluated
# on one task per split only: every arm is evaluated on the full splits, --set eval.limit=null);
# its learned state must hash to the committed row's. Each experiment runs in WORK/<name> (its
# arms are whole run directories); an arm that finished is copied, small files only, into
# BOARD/experiments/<name>/, and copied back before the next session resumes the rest.
# Usage: bash scripts/experiments_household_easy_warm.sh [NAME ... | source] (default: all five).
# One at a time: two share 2 cores badly.
set -euo pipefail
cd "$(dirname "$0")/.."
BOARD=leaderboards/household-easy-warm
WORK="${WORK:-/work/exp/household-easy-warm}"
SOURCE="$BOARD/experiments/sources/rag-seed0"  # committed whole: store/, trajectories, state
SMALL=(results.json episodes.jsonl config.yaml state.json metrics.jsonl)
mkdir -p "$WORK"

if [[ ! -f "$SOURCE/results.json" ]]; then
    rm -rf "$SOURCE"
    arena run --method rag --env household env.level=easy eval.limit=1 llm.dtype=float32 \
        "llm.warmstart=$BOARD/base" run.isolation=process eval.salt=public --out "$SOURCE"
fi
python - "$SOURCE" "$BOARD/runs/rag-seed0" <<'EOF'
import json, sys
source, row = (json.load(open(f"{path}/state.json"))["digest_before_eval"] for path in sys.argv[1:])
if source != row:
    sys.exit(f"the source learned another state than the board's rag row ({source[:12]} != {row[:12]})")
print(f"[experiments] source learned the board's rag state ({source[:12]})", file=sys.stderr)
EOF

run_experiment() {  # run_experiment NAME ARGS...
    local name=$1; shift
    local work="$WORK/$name" kept="$BOARD/experiments/$name"
    mkdir -p "$work"
    if [[ -f "$kept/experiment.json" ]]; then  # what an earlier session finished
        cp "$kept/experiment.json" "$work/"
        for arm in "$kept"/*/; do
            [[ -f "$arm/results.json" && ! -d "$work/$(basename "$arm")" ]] && cp -r "$arm" "$work/"
        done
    fi
    echo "[experiments] arena experiment $* --out $work --set eval.limit=null" >&2
    local status=0
    arena experiment "$@" --out "$work" --set eval.limit=null || status=$?
    mkdir -p "$kept"
    cp "$work/experiment.json" "$kept/"
    for arm in "$work"/*/; do
        [[ -f "$arm/results.json" ]] || continue
        mkdir -p "$kept/$(basename "$arm")"
        for file in "${SMALL[@]}"; do
            [[ -f "$arm/$file" ]] && cp "$arm/$file" "$kept/$(basename "$arm")/"
        done
    done
    return $status
}

names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then names=(relevance transfer stale poison conflict); fi
if [[ ${names[0]} == source ]]; then exit 0; fi  # the source only
for name in "${names[@]}"; do
    case "$name" in
        relevance) run_experiment relevance relevance "$SOURCE" ;;
        transfer) run_experiment transfer transfer "$SOURCE" --model llm.warmstart=null ;;
        stale) run_experiment stale stale "$SOURCE" --change env.dialect=put ;;
        # rag learned 3 trajectories: 25 % and 50 % of the poisoned store are 1 and 3 items.
        poison) run_experiment poison poison "$SOURCE" --fraction 0.25 --fraction 0.5 ;;
        conflict) run_experiment conflict conflict "$SOURCE" --change env.dialect=put ;;
        *) echo "unknown experiment $name" >&2; exit 2 ;;
    esac
done
