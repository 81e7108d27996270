# Shared by the board scripts (sourced): run or resume one row of a board into $RUNS/<row>.
# Needs RUNS, COMMON (the board's common arguments) and WARM (its warm-start base).
run_row() {  # run_row ROW METHOD [ARGS...]
    local row=$1 method=$2; shift 2
    local out="$RUNS/$row"
    if [[ -f "$out/results.json" ]]; then echo "[board] $row: done" >&2; return; fi
    if [[ -d "$out" ]]; then
        echo "[board] $row: resuming" >&2
        arena run --resume "$out" ${RESUME_ARGS:-}
    else
        echo "[board] $row: arena run --method $method ${COMMON[*]} llm.warmstart=$WARM $*" >&2
        arena run --method "$method" "${COMMON[@]}" "llm.warmstart=$WARM" --out "$out" "$@"
    fi
}
