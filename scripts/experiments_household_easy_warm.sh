#!/usr/bin/env bash
# The experiments of docs/experiments.md on the household `easy` warm-start board, with the
# embedded model. The source is the board's `rag` row learned again (the same settings, evaluated
# on one task per split only: every arm is evaluated on the full splits, or on LIMIT tasks each);
# its learning must be the committed row's, episode by episode. Each experiment runs in WORK/<name> (its
# arms are whole run directories); an arm that finished is copied, small files only, into
# BOARD/experiments/<name>/, and copied back before the next session resumes the rest.
# Usage: [LIMIT=N] bash scripts/experiments_household_easy_warm.sh [NAME ... | source] (default: all
# five). LIMIT=N evaluates every arm on the first N tasks of each split, round-robin over task
# types, into NAME-firstN (a smaller, separate experiment); unset: the full splits, into NAME.
# LEARN=N: the source is rag learned on N episodes instead of the row's 12 (a store with more
# items than rag's k = 3 and more than one task type: with the row's 3 trajectories, all of one
# type, every arm is shown the same 3 items), into NAME[-firstN]-learnN.
# An arm another experiment over the same source played with the same settings is reused, not
# played again (`arena experiment --reuse`): stale's learned-world arms are relevance's, poison's
# clean arm relevance's own, conflict's old and none stale's changed-world arms.
# One at a time: two share 2 cores badly.
set -euo pipefail
cd "$(dirname "$0")/.."
BOARD=leaderboards/household-easy-warm
WORK="${WORK:-/work/exp/household-easy-warm}"
SMALL=(results.json episodes.jsonl config.yaml state.json metrics.jsonl)
LIMIT="${LIMIT:-null}"
LEARN="${LEARN:-}"
SUFFIX=""; [[ $LIMIT != null ]] && SUFFIX="-first$LIMIT"
SOURCE="$BOARD/experiments/sources/rag-seed0"  # committed whole: store/, trajectories, state
BUDGET=()
if [[ -n $LEARN ]]; then
    SOURCE="$BOARD/experiments/sources/rag-learn$LEARN-seed0"; SUFFIX="$SUFFIX-learn$LEARN"
    BUDGET=("learn.budget.episodes=$LEARN")
fi
mkdir -p "$WORK"

if [[ ! -f "$SOURCE/results.json" ]]; then
    rm -rf "$SOURCE"
    arena run --method rag --env household env.level=easy eval.limit=1 llm.dtype=float32 \
        "llm.warmstart=$BOARD/base" run.isolation=process eval.salt=public "${BUDGET[@]}" --out "$SOURCE"
fi
[[ -n $LEARN ]] || python - "$SOURCE" "$BOARD/runs/rag-seed0" <<'EOF'
# The same learning as the board's row, episode by episode (the state digest's definition has
# changed since the row ran, so the two digests differ and are not compared).
import json, sys
keys = ("task_id", "variant", "success", "steps", "tokens_in", "tokens_out", "experience_ids", "derived_experience_ids")
def learning(path):
    records = [json.loads(line) for line in open(f"{path}/episodes.jsonl")]
    return [tuple(str(r.get(k)) for k in keys) for r in records if r["phase"] == "learn"]
def items(path):
    return json.load(open(f"{path}/results.json"))["state"]["memory_items"]
source, row = sys.argv[1:]
if learning(source) != learning(row) or items(source) != items(row):
    sys.exit("the source did not learn what the board's rag row learned: compare their learning episodes")
print(f"[experiments] the source learned what the board's rag row learned ({len(learning(source))} "
      f"episodes, {items(source)} items)", file=sys.stderr)
EOF

restore() {  # restore NAME: the arms an earlier session finished, from the board into WORK/NAME
    local work="$WORK/$1" kept="$BOARD/experiments/$1"
    [[ -f "$kept/experiment.json" ]] || return 0
    mkdir -p "$work"
    [[ -f "$work/experiment.json" ]] || cp "$kept/experiment.json" "$work/"
    for arm in "$kept"/*/; do
        if [[ -f "$arm/results.json" && ! -d "$work/$(basename "$arm")" ]]; then cp -r "$arm" "$work/"; fi
    done
}

REUSE=()
reuse() {  # reuse NAME...: the experiments whose finished arms stand in for arms of the same settings
    REUSE=()
    for other in "$@"; do
        restore "$other$SUFFIX"
        if [[ -f "$WORK/$other$SUFFIX/experiment.json" ]]; then REUSE+=(--reuse "$WORK/$other$SUFFIX"); fi
    done
}

run_experiment() {  # run_experiment NAME ARGS...
    local name=$1$SUFFIX; shift
    local work="$WORK/$name" kept="$BOARD/experiments/$name"
    mkdir -p "$work"
    restore "$name"  # what an earlier session finished
    echo "[experiments] arena experiment $* --out $work --set eval.limit=$LIMIT" >&2
    local status=0
    arena experiment "$@" --out "$work" --set "eval.limit=$LIMIT" || status=$?
    for arm in "$work"/*/; do
        [[ -f "$arm/results.json" ]] || continue
        mkdir -p "$kept"
        cp "$work/experiment.json" "$kept/"  # the plan (with its comparisons once every arm ended)
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
        # learned_world and learned_world_none: relevance's own and none, where it ran
        stale) reuse relevance; run_experiment stale stale "$SOURCE" --change env.dialect=put "${REUSE[@]}" ;;
        # rag learned 3 trajectories: 25 % and 50 % of the poisoned store are 1 and 3 items.
        poison) reuse relevance stale
                run_experiment poison poison "$SOURCE" --fraction 0.25 --fraction 0.5 "${REUSE[@]}" ;;
        # old and none: stale's changed_world and changed_world_none
        conflict) reuse stale; run_experiment conflict conflict "$SOURCE" --change env.dialect=put "${REUSE[@]}" ;;
        *) echo "unknown experiment $name" >&2; exit 2 ;;
    esac
done
