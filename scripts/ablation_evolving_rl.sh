#!/usr/bin/env bash
# Evolving-RL's ablation at small scale (docs/evolving_rl_ablation.md): co-evolution against
# solver_only and extractor_only, each at the household `easy` board's budget (the method's
# defaults) on the board's warm-start base, evaluated on the same balanced subset of both test
# splits (eval.limit tasks per split), each run into RUNS/<arm>. Finished arms are skipped; an
# interrupted one is resumed. One run at a time: two share 2 cores badly.
# Usage: bash scripts/ablation_evolving_rl.sh [ARM ...] (default: coevolve solver_only extractor_only).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-/work/runs/evolving-rl-ablation}"
LIMIT="${LIMIT:-16}"
COMMON=(--env household env.level=easy "eval.limit=$LIMIT" llm.dtype=float32
        llm.warmstart=leaderboards/household-easy-warm/base run.isolation=process eval.salt=public)
mkdir -p "$RUNS"
arms=("$@")
[[ ${#arms[@]} -eq 0 ]] && arms=(coevolve solver_only extractor_only)
for arm in "${arms[@]}"; do
    out="$RUNS/$arm"
    if [[ -f "$out/results.json" ]]; then echo "[ablation] $arm: done" >&2; continue; fi
    if [[ -d "$out" ]]; then arena run --resume "$out" ${RESUME_ARGS:-}; continue; fi
    case "$arm" in
        coevolve) preset=() ;;
        solver_only|extractor_only) preset=(--preset "$arm") ;;
        *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
    echo "[ablation] $arm: arena run --method evolving_rl ${preset[*]} ${COMMON[*]}" >&2
    arena run --method evolving_rl "${preset[@]}" "${COMMON[@]}" --out "$out"
done
