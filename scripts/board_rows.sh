# Shared by the board scripts (sourced): run or resume one row of a board into $RUNS/<row>.
# Needs RUNS, COMMON (the board's common arguments) and WARM (its warm-start base).
# A row parked beside the board (BOARD/unfinished/ROW, see park_rows) goes on from there: it is
# put back in RUNS and resumed with --move-here (its record may be signed by another machine's
# key; results.json then names the move).
run_row() {  # run_row ROW METHOD [ARGS...]
    local row=$1 method=$2; shift 2
    local out="$RUNS/$row" parked="${BOARD:-}/unfinished/$row"
    if [[ -f "$out/results.json" ]]; then echo "[board] $row: done" >&2; return; fi
    if [[ ! -d "$out" && -n "${BOARD:-}" && -d "$parked" ]]; then
        echo "[board] $row: put back from $parked" >&2
        cp -a "$parked" "$out"
    fi
    if [[ -d "$out" ]]; then
        echo "[board] $row: resuming" >&2
        resume_run "$out"
    else
        echo "[board] $row: arena run --method $method ${COMMON[*]} llm.warmstart=$WARM $*" >&2
        arena run --method "$method" "${COMMON[@]}" "llm.warmstart=$WARM" --out "$out" "$@"
    fi
}

# resume_run DIR: `arena run --resume DIR --move-here` with the Arena commit that started DIR (a
# resume under another commit is refused, so that a row's phases keep one version): where that
# is not this checkout's HEAD, from a worktree of it under WORKTREES (default: beside this
# checkout), made once; the arena command on PATH then imports that worktree's code.
resume_run() {
    local dir started wt
    dir=$(realpath "$1")
    started=$(python3 scripts/board_state.py started-commit "$dir")
    if [[ -z $started || $started == *-dirty || $started == "$(git rev-parse HEAD 2>/dev/null)" || -n ${RESUME_ARGS:-} ]]; then
        arena run --resume "$dir" --move-here ${RESUME_ARGS:-}
        return
    fi
    wt="${WORKTREES:-$(dirname "$PWD")/arena-worktrees}/${started:0:12}"
    [[ -d $wt ]] || git worktree add --detach "$wt" "$started" >&2
    echo "[board] $(basename "$dir"): resumed with the commit that started it, ${started:0:12}, from $wt" >&2
    (cd "$wt" && PYTHONPATH="$wt${PYTHONPATH:+:$PYTHONPATH}" arena run --resume "$dir" --move-here)
}

# needs_reset ROW: ROW-seedS is a finished run of one of RESET_METHODS (the board script's memory
# methods) whose memory reset ROW-none-seedS has not finished: the reset evaluates ROW's learned
# state (its store/, method/), which the board's committed small files do not hold.
needs_reset() {
    local row=$1 method=${1%-seed*}
    [[ $row != *-none-seed* && " ${RESET_METHODS[*]:-} " == *" $method "* ]] &&
        [[ ! -f "$RUNS/$method-none-seed${row##*-seed}/results.json" ]]
}

# --park: copy every unfinished run of RUNS whole (its store, method state and record) to
# BOARD/unfinished/ROW, to be committed: a session's machine is not always kept, and a row runs
# for longer than a session. A finished run stays parked while its memory reset is to run
# (needs_reset); once that has finished, or for any other finished row, the parked copy is
# removed. A run that holds trained weights (an RL row's trainer checkpoints) is never parked:
# the repository keeps no model weights (the board's warm-start base aside), so an RL row goes on
# only where its machine is kept. A run larger than PARK_MAX_MB (default 25: a memory method's
# store) is left out too, naming its size: every parked copy stays in the repository's history.
park_rows() {
    local run row size
    for run in "$RUNS"/*/; do
        run=${run%/} row=$(basename "$run")
        if [[ -f "$run/results.json" ]] && ! needs_reset "$row"; then rm -rf "$BOARD/unfinished/$row"; continue; fi
        # A live `arena run` holds an exclusive flock on its run.lock (arena.core.storage.rundir).
        if [[ -f "$run/run.lock" ]] && ! flock --shared --nonblock "$run/run.lock" true; then
            echo "[board] $row is still running: stop it first (kill -TERM its arena process)" >&2
            return 1
        fi
        rm -rf "$BOARD/unfinished/$row"
        if [[ -n $(find "$run" -name trainer_state.json -print -quit) ]]; then
            echo "[board] $row not parked: it holds trained weights, which the repository does not keep;" \
                 "it goes on only where $run is kept" >&2
            continue
        fi
        mkdir -p "$BOARD/unfinished"
        cp -a "$run" "$BOARD/unfinished/$row" && rm -f "$BOARD/unfinished/$row/run.lock"
        size=$(du -sm "$BOARD/unfinished/$row" | cut -f1)
        if (( size > ${PARK_MAX_MB:-25} )); then
            rm -rf "$BOARD/unfinished/$row"
            echo "[board] $row not parked: $size MB (over PARK_MAX_MB=${PARK_MAX_MB:-25}); it goes on only" \
                 "where $run is kept" >&2
            continue
        fi
        echo "[board] $row parked: $(du -sh "$BOARD/unfinished/$row" | cut -f1) in $BOARD/unfinished/$row" >&2
    done
}
