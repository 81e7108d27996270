"""The ``arena`` command line: ``run``, ``plugins``, ``show``, ``verify``, ``leaderboard``, ``compare``,
``data``, ``warmstart``."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from arena.core.config.compose import ConfigError
from arena.core.config.registry import RegistrationError, UnknownNameError
from arena.core.contract.errors import RanksLost
from arena.core.contract.results import Results
from arena.core.host.allocator import compact_allocator
from arena.core.services.progress import Reporter
from arena.core.storage.rundir import RunDir, RunDirError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

def make_console(stderr: bool = False) -> Console:
    """A rich console that does not squeeze tables to 80 columns when its output is a file or a
    pipe (rich's default there): ``$COLUMNS`` if set, else 160."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, width=width)


console = make_console(stderr=True)
USER_ERRORS = (ConfigError, UnknownNameError, RunDirError, RegistrationError, ValueError, RanksLost)


@click.group()
@click.version_option(package_name="arena")
def cli() -> None:
    """Arena: compare experience-driven LLM-agent methods under one protocol."""


@cli.command(context_settings={"ignore_unknown_options": False})
@click.option("--method", "-m", help="Registered method name (see `arena plugins`).")
@click.option("--env", "-e", "env_name", default=None, help="Environment name (default: household).")
@click.option("--preset", default=None, help="One of the method's presets (see `arena plugins`).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option("--out", type=click.Path(file_okay=False), help="Run directory (default: runs/<time>-<method>-<env>).")
@click.option("--resume", type=click.Path(file_okay=False, exists=True), help="Finish an interrupted run.")
@click.option("--allow-version-change", is_flag=True,
              help="Resume a run started by another Arena version or commit (recorded in results.json).")
@click.option("--repair", is_flag=True,
              help="With --resume: move damaged lines of episodes.jsonl aside and play those episodes "
                   "again (after learning only; recorded in results.json).")
@click.option("--move-here", is_flag=True,
              help="With --resume: go on with a run started on another machine, whose record "
                   "key this machine lacks (its lines are checked by their hashes; recorded in "
                   "results.json).")
@click.argument("overrides", nargs=-1)
def run(method: str | None, env_name: str | None, preset: str | None, config_file: str | None,
        out: str | None, resume: str | None, allow_version_change: bool, repair: bool,
        move_here: bool, overrides: tuple[str, ...]) -> None:
    """Learn on train, evaluate frozen on the test splits, write results.

    OVERRIDES are OmegaConf dotlist items, e.g. eval.limit=20 run.seeds=[0,1].
    """
    from arena.core import protocol

    if method is None and resume is None:
        raise click.UsageError("Name a method with --method NAME (see `arena plugins`), or --resume RUN_DIR.")
    if launched_by_torchrun():  # rank 0 runs the harness; the others train when it says
        from arena.core.rl import ranks

        if ranks.join().rank != 0:
            ranks.follow()
            _leave_as_a_following_rank()
        ranks.stop_cleanly_on_sigterm()
    started = time.perf_counter()
    _name_run_dir(resume or out)
    try:
        with progress_reporter() as reporter:
            path, results = protocol.run(method, env_name, config_file=config_file, overrides=list(overrides),
                                         out=out, resume=resume, reporter=reporter, preset=preset,
                                         allow_version_change=allow_version_change, repair=repair,
                                         move_here=move_here)
    except USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if launched_by_torchrun():
            from arena.core.rl import ranks

            ranks.release()
    print_summary(results, path)
    console.print(f"Finished in {time.perf_counter() - started:.1f} s. Results: {path / 'results.json'}")
    print_next_steps(path)


@contextmanager
def progress_reporter() -> Iterator[Reporter]:
    """How a long command shows its phases: bars on a terminal; in a log file or a pipe,
    timestamped lines every ``ARENA_PROGRESS_INTERVAL_S`` seconds (bars draw nothing there)."""
    from arena.console import LineReporter, RichReporter, bars

    with bars(console) if console.is_terminal else nullcontext() as progress:
        yield (RichReporter(progress) if progress is not None else
               LineReporter(interval_s=float(os.environ.get("ARENA_PROGRESS_INTERVAL_S", 10))))


def launched_by_torchrun() -> bool:
    """Started by torchrun (its env names this process's rank), without importing torch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _leave_as_a_following_rank() -> None:
    """A rank other than 0 whose work ended (rank 0 said stop; the group is left): exit 0 now.
    It holds nothing to save (rank 0 writes the run), and the interpreter's teardown could still
    abort it ("terminate called without an active exception": a process-group thread destroyed
    while joinable, seen on gloo after a resumed run had written its results), which torchrun
    reports as a failed run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def print_next_steps(path: Path) -> None:
    """What a finished run is for: looking at it, ranking it, comparing it."""
    console.print("Next:")
    for command, why in ((f"arena show {path}", "this summary again"),
                         (f"arena leaderboard {path} OTHER_RUN...", "a board with other runs"),
                         (f"arena compare {path} OTHER_RUN", "a paired test against another run")):
        console.print(escape(f"  {command}   ({why})"), soft_wrap=True)


def print_summary(results: Results, path: Path) -> None:
    table = Table(title=f"{results.method} on {results.env} ({results.track}) — {path}")
    for column in ("split", "tasks", "episodes", "success", "95% CI", "progress", "valid act.", "steps"):
        table.add_column(column, justify="right" if column != "split" else "left")
    for split, summary in results.splits.items():
        low, high = summary.ci95
        table.add_row(
            split, str(summary.n_tasks), str(summary.n_episodes),
            f"{summary.success_rate:.1%}", f"[{low:.1%}, {high:.1%}]",
            f"{summary.progress_rate:.1%}", f"{summary.valid_action_rate:.1%}",
            f"{summary.mean_steps:.1f}",
        )
    console.print(table)
    console.print(
        "cost: " + "; ".join(
            f"{phase} {c.episodes} episodes, {c.env_steps} steps, {c.llm_calls} LLM calls, "
            f"{c.tokens_in + c.tokens_out} tokens, {c.wall_s:.0f} s"
            for phase, c in (("learn", results.cost.learn), ("evaluate", results.cost.evaluate))
        )
    )
    if not results.valid:
        console.print("[bold red]INVALID RUN[/]: " + " | ".join(results.violations))
    if results.limited:
        console.print("[yellow]Limited run (eval.limit set): not comparable with full runs.[/]")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (keys methods, envs, backends).")
def plugins(as_json: bool) -> None:
    """List registered methods, environments and LLM backends."""
    from arena.core.config.plugins import get_plugins

    loaded = get_plugins()
    listing: dict[str, list[dict[str, Any]]] = {
        kind: [
            {
                "name": e.name, "package": e.package, "version": e.version, "plugin": e.plugin,
                "description": e.description, "hooks": list(e.hooks),
                "configs": [str(path) for path in e.configs],
                "presets": sorted(e.presets),
            }
            for e in registry.entries()
        ]
        for kind, registry in (("methods", loaded.methods), ("envs", loaded.envs),
                               ("backends", loaded.backends))
    }
    if loaded.skipped:
        listing["skipped"] = [{"plugin": k, "reason": v} for k, v in loaded.skipped.items()]
    if as_json:
        click.echo(json.dumps(listing, indent=2))
        return
    out = make_console()
    for kind in ("methods", "envs", "backends"):
        table = Table(title=kind)
        for column in ("name", "package", "version", "hooks", "presets", "description"):
            table.add_column(column)
        for item in listing[kind]:  # escaped: "pip install 'arena[alfworld]'" is not markup
            table.add_row(*(escape(cell) for cell in (
                item["name"], item["package"], item["version"], ", ".join(item["hooks"]) or "-",
                ", ".join(item["presets"]) or "-", item["description"])))
        out.print(table)
    for skipped in listing.get("skipped", []):
        out.print(escape(f"skipped plugin {skipped['plugin']}: {skipped['reason']}"))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print results.json as it is.")
def show(run_dir: str, as_json: bool) -> None:
    """Summarise a finished run (or how far an unfinished one got)."""
    directory = RunDir(run_dir)
    try:
        results = directory.read_results()
    except RunDirError as exc:
        if not (Path(run_dir) / "config.yaml").exists():
            raise click.ClickException(
                f"{run_dir} is not an Arena run directory (no config.yaml)."
            ) from exc
        done = directory.count_episodes()
        raise click.ClickException(f"{exc} ({done} episodes recorded so far)") from exc
    from arena.report.runs import ReportError, load_run

    try:
        loaded = load_run(run_dir)  # the record's chain: a changed episodes.jsonl is named, not shown
    except ReportError as exc:
        raise click.ClickException(str(exc)) from exc
    for problem in loaded.record_problems:  # results.json or state.json edited: shown invalid
        console.print(escape(f"INVALID: {problem}"))
    if as_json:
        click.echo(json.dumps(results.to_json(), indent=2))
        return
    results = loaded.results
    print_summary(results, Path(run_dir))
    print_next_steps(Path(run_dir))


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Board folder (default: leaderboards/<env>/ for runs of one environment).")
@click.option("--allow-mixed", is_flag=True,
              help="Put runs of different protocols in one table (rows flagged with the differences).")
@click.option("--sort", default="success", show_default=True,
              type=click.Choice(["success", "test_seen", "test_unseen", "progress", "learn_cost", "method"]),
              help="Row order (invalid runs always last).")
@click.option("--require-isolation", is_flag=True,
              help="Refuse a row any of whose runs did not run its method isolated "
                   "(run.isolation=process); nothing is written then.")
@click.option("--control", "controls", multiple=True, metavar="ROW",
              help="A control row, named as the board prints it (base, random, grpo (cpu)); repeatable. "
                   "Every other row is compared with each, and a memory method with its memory reset, "
                   "paired by task (the board's section 'Learning: each row against its controls').")
def leaderboard(run_dirs: tuple[str, ...], out: str | None, allow_mixed: bool, sort: str,
                require_isolation: bool, controls: tuple[str, ...]) -> None:
    """Build a leaderboard (README.md, index.html, leaderboard.json, plots) from finished runs.
    A folder of `arena experiment` among them is shown in the board's section of experiments."""
    from arena.report import ReportError, build_tables, load_runs, write_board
    from arena.report.aggregate import unisolated_rows
    from arena.report.experiments import ExperimentError, is_experiment, load_experiment
    from arena.report.learning import learning_report

    runs: list[Path | str] = [path for path in run_dirs if not is_experiment(path)]
    if not runs:
        raise click.UsageError("Give at least one run: an experiment is shown beside the runs of a board.")
    try:
        tables = build_tables(load_runs(runs), allow_mixed=allow_mixed, sort=sort)
        experiments = [load_experiment(path) for path in run_dirs if is_experiment(path)]
        learning = learning_report(tables, controls)
    except (ReportError, ExperimentError) as exc:
        raise click.ClickException(str(exc)) from exc
    refused = unisolated_rows(tables) if require_isolation else []
    if refused:
        rows = "; ".join(f"{row.name} / {row.model} ("
                         + ", ".join(f"{label}: {row.isolation['runs'][label]}" for label in labels) + ")"
                         for row, labels in refused)
        raise click.ClickException(
            f"--require-isolation: {len(refused)} row(s) ran their method in Arena's process, or "
            f"before Arena recorded how (unknown): {rows}. Rerun those runs with "
            "run.isolation=process, learning included (`arena run --method NAME ... "
            "run.isolation=process`), or leave them out. Nothing was written.")
    envs = [table.env for table in tables]
    if out is None:
        if len(envs) > 1:
            raise click.UsageError(f"The runs cover several environments ({', '.join(envs)}): "
                                   "choose a folder with --out.")
        out = str(Path("leaderboards") / envs[0])
    try:
        written = write_board(tables, out, experiments, learning)
    except OSError as exc:
        raise click.ClickException(f"Cannot write the leaderboard to {out}: {exc.strerror or exc}. "
                                   "Choose a folder you can write with --out.") from exc
    for table in tables:
        console.print(escape(f"{table.env}: {len(table.rows)} rows ({', '.join(row.name for row in table.rows)})"))
    for report in experiments:
        console.print(escape(f"experiment {report.name} over {report.source}: {len(report.arms)} arms"))
    if learning is not None:
        compared = sorted({(line.env, line.row, line.against) for line in learning.comparisons})
        console.print(escape(f"learning: {len(compared)} row pairs against {', '.join(learning.controls)}, "
                             "memory resets and variants"))
        for verdict in learning.verdicts:
            console.print(escape(f"  {verdict.text}"))
    console.print(f"Wrote {len(written)} files to {out}: README.md, index.html, leaderboard.json, plots/")


@cli.command()
@click.option("--state", "state_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="A submitted run directory whose learning has ended: its learned state is evaluated.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The new run directory of the board's evaluation.")
@click.argument("overrides", nargs=-1)
def evaluate(state_dir: str, out: str, overrides: tuple[str, ...]) -> None:
    """Evaluate a submitted learned state with the board's own settings (e.g. eval.salt=secret
    run.isolation=process; eval.experience.source=none makes it the state's memory reset, a row of
    its own on the board): learning is not rerun; the state must hash to what its learning ended
    with; the board plays every test episode."""
    from arena.report.evaluate_state import EvaluateError, evaluate_state

    _name_run_dir(out)  # resumed, like any run, with `arena run --resume OUT`
    try:
        with progress_reporter() as reporter:
            path, results = evaluate_state(state_dir, out, list(overrides), reporter=reporter)
    except EvaluateError as exc:
        raise click.ClickException(str(exc)) from exc
    print_summary(results, path)
    print_next_steps(path)


@cli.command()
@click.argument("name")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The experiment's folder: one run directory per arm, and experiment.json. Given "
                   "again, unfinished arms are resumed.")
@click.option("--fraction", "fractions", multiple=True, type=float,
              help="poison: a share of poison items in the store (repeat; default 0, 0.1, 0.3).")
@click.option("--model", "model", multiple=True,
              help="transfer: the model to transfer to, as llm.KEY=VALUE (repeat).")
@click.option("--change", "change", multiple=True,
              help="stale, conflict: the changed world, as env.KEY=VALUE (e.g. env.dialect=put; repeat).")
@click.option("--set", "board", multiple=True,
              help="An evaluation setting every arm shares, KEY=VALUE (run.seeds, eval.salt, ...).")
@click.option("--reuse", "reuse", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Another experiment's folder over the same source: its finished arms of the same "
                   "settings stand in for this one's (stale's learned_world is relevance's own; repeat).")
def experiment(name: str, run_dir: str, out: str, fractions: tuple[float, ...], model: tuple[str, ...],
               change: tuple[str, ...], board: tuple[str, ...], reuse: tuple[str, ...]) -> None:
    """Run experiment NAME (relevance, poison, transfer, stale, conflict) over RUN_DIR's learned
    state: one evaluation per arm (conflict's first two arms learn again on the changed world),
    each against its control, paired, per split and task type (docs/experiments.md)."""
    from arena.report.experiments import DEFAULT_FRACTIONS, ExperimentError, make_plan, run_experiment
    from arena.report.runs import ReportError

    try:
        plan = make_plan(name, Path(run_dir), fractions=fractions or DEFAULT_FRACTIONS, model=model,
                         change=change, board=board)
        with progress_reporter() as reporter:
            summary = run_experiment(plan, out, reuse=reuse, reporter=reporter)
    except (ExperimentError, ReportError, *USER_ERRORS) as exc:
        raise click.ClickException(str(exc)) from exc
    except (KeyboardInterrupt, Terminated) as exc:
        again = " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["experiment"] else \
            f"experiment {name} {run_dir} --out {out} ..."
        console.print(escape(f"{'Interrupted' if isinstance(exc, KeyboardInterrupt) else 'Terminated'}. The "
                             f"finished arms and episodes are saved; run `arena {again}` again (the same "
                             "options and --out) to finish the rest."), soft_wrap=True)  # one line to copy
        sys.exit(130 if isinstance(exc, KeyboardInterrupt) else 143)
    for row in summary["comparisons"]:
        if row["task_type"] != "all":
            continue
        low, high = row["ci95"]
        console.print(escape(
            f"{row['split']}: {row['arm']} {row['success_arm']:.1%} vs {row['control']} "
            f"{row['success_control']:.1%}: {row['difference']:+.1%} [{low:+.1%}, {high:+.1%}], "
            f"p = {row['p_value']:.3g}, {row['pairs']} pairs, same items shown in {row['same_experience']:.0%}"
            + (f"; also differs in {', '.join(row['other_differences'])}" if row['other_differences'] else "")
            + (f"; INVALID: {', '.join(row['invalid'])} (arena show {out}/ARM says why)"
               if row.get("invalid") else "")))
    phase = summary.get("second_phase")
    if phase:
        console.print(escape(f"second learning phase: {phase['episodes']} episodes, store "
                             f"{phase['items_before']} -> {phase['items_after']} items"
                             + (f". {phase['note']}" if "note" in phase else "")))
    for arm, folder in summary.get("reused", {}).items():
        console.print(escape(f"{arm}: the arm played in {Path(out) / folder} (--reuse)"))
    console.print(escape(f"Wrote {Path(out) / 'experiment.json'}; each arm: arena show {out}/ARM"))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--keep", "keep", type=click.Path(file_okay=False), default=None,
              help="Replay into this new folder and keep it (default: a temporary folder, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print verification.json as written.")
def verify(run_dir: str, keep: str | None, as_json: bool) -> None:
    """Replay RUN_DIR's frozen evaluation from its saved learned state in a fresh process and
    compare every episode; writes RUN_DIR/verification.json. Exit 0 verified, 1 unverified (the
    record was changed, or the method played differently), 3 cannot be verified."""
    from arena.report.verification import VERIFICATION, VerifyError
    from arena.report.verify import verify_run

    try:
        outcome = verify_run(run_dir, keep=keep)
    except (VerifyError, RunDirError) as exc:  # not even a verification.json could be written
        console.print(escape(f"cannot verify {run_dir}: {exc}"))
        sys.exit(3)
    if as_json:
        click.echo((Path(run_dir) / VERIFICATION).read_text().rstrip())
    else:
        colour = {"verified": "green", "unverified": "bold red"}.get(outcome.status, "yellow")
        label = "NOT VERIFIABLE" if outcome.status == "unverifiable" else outcome.status.upper()
        console.print(f"[{colour}]{label}[/]: " + escape(outcome.reason))
        for entry in outcome.differing[:20]:
            step = entry.get("first_difference")
            where = (f"; step {step['step']}: recorded {step['recorded_action']!r}, replayed "
                     f"{step['replayed_action']!r}") if step else ""
            console.print(escape(f"  {entry['episode']}: {entry['difference']}{where}"), soft_wrap=True)
        if len(outcome.differing) > 20:
            console.print(f"  ... and {len(outcome.differing) - 20} more (see {VERIFICATION})")
        for note in outcome.notes:
            console.print(escape(f"note: {note}"), soft_wrap=True)
        console.print(escape(f"Wrote {Path(run_dir) / VERIFICATION}"))
    sys.exit(outcome.exit_code)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
def slim(run_dir: str) -> None:
    """Drop the optimizer state from the trainer checkpoints of RUN_DIR, a run whose learning has
    finished: its evaluation, resume and `arena verify` read only the weights, and an RL run
    becomes a third of its size, small enough to move to another machine. It can then no longer
    learn further (`run.continue_from` refuses to train it): slim a copy to keep the full run."""
    from arena.core.rl.checkpointed import slim_run

    try:
        slimmed = slim_run(run_dir)
    except (RunDirError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    for checkpoint, before, after in slimmed:
        console.print(escape(f"{checkpoint}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB"), soft_wrap=True)
    if not slimmed:
        console.print(escape(f"{run_dir}: no checkpoint with an optimizer state; nothing to do"))


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--sqlite", "sqlite_file", type=click.Path(dir_okay=False),
              help="The database file to write (tables runs, splits, episodes, steps, experiences, metrics).")
@click.option("--dataset", "dataset_dir", type=click.Path(file_okay=False),
              help="The folder of a Hugging Face dataset to write: parquet files of the episodes (and the "
                   "learned items) with a dataset card stating the protocol.")
@click.option("--inspect", "inspect_dir", type=click.Path(file_okay=False),
              help="The folder of Inspect evaluation logs to write (a run's episodes as samples, step by "
                   "step), to read in `inspect view --log-dir DIR`.")
@click.option("--force", is_flag=True, help="Replace the file or folder if it exists.")
def export(run_dirs: tuple[str, ...], sqlite_file: str | None, dataset_dir: str | None, inspect_dir: str | None,
           force: bool) -> None:
    """Write finished runs into one SQLite database (to query them with SQL or pandas), a Hugging
    Face dataset (to share and reload their episodes with `datasets`) or Inspect logs (to read
    them step by step in `inspect view`)."""
    from arena.report import ReportError

    if sum(target is not None for target in (sqlite_file, dataset_dir, inspect_dir)) != 1:
        raise click.UsageError("Choose one export: --sqlite FILE, --dataset DIR or --inspect DIR.")
    try:
        if sqlite_file is not None:
            from arena.report.export import export_sqlite

            target, counts = sqlite_file, export_sqlite(list(run_dirs), sqlite_file, force=force)
        elif dataset_dir is not None:
            from arena.report.dataset import export_dataset

            target, counts = str(dataset_dir), export_dataset(list(run_dirs), str(dataset_dir), force=force)
        else:
            from arena.report.inspect_log import export_inspect

            target, counts = str(inspect_dir), export_inspect(list(run_dirs), str(inspect_dir), force=force)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(escape(f"Wrote {target}: " + ", ".join(f"{n} {table}" for table, n in counts.items())))


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: any free one).")
def view(run_dirs: tuple[str, ...], port: int) -> None:
    """Browse runs in a local, read-only web page: episodes by split, task type, status, seed and
    variant, each step by step; two runs side by side; learning curves."""
    from arena.report import ReportError
    from arena.report.viewer import Viewer, make_server

    try:
        viewer = Viewer(list(run_dirs))
    except ReportError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        server = make_server(viewer, port)
    except OSError as exc:
        raise click.ClickException(f"Cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}); "
                                   "choose another --port (0: any free one).") from exc
    bound = server.server_address[1]
    console.print(escape(f"Viewing {len(viewer.runs)} run(s) at http://127.0.0.1:{bound}/ (Ctrl-C to stop)"))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.server_close()


@cli.command()
@click.argument("run_a", type=click.Path(exists=True))
@click.argument("run_b", required=False, type=click.Path(exists=True))
@click.option("--variant", default=None,
              help="Compare with this variant (e.g. without_skill): of RUN_B, or of RUN_A when RUN_B is omitted.")
@click.option("--allow-mixed", is_flag=True, help="Pair runs of different protocols anyway.")
@click.option("--split", "splits", multiple=True,
              help="Compare only this split (repeatable), e.g. a run of test_seen alone with one of both test splits.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare(run_a: str, run_b: str | None, variant: str | None, allow_mixed: bool, splits: tuple[str, ...],
            as_json: bool) -> None:
    """Paired test of RUN_A against RUN_B (or against a variant of RUN_A) on the same tasks and seeds."""
    from arena.report import ReportError, compare_runs, load_run

    if run_b is None and variant is None:
        raise click.UsageError("Give a second run, or --variant NAME to compare a run with its variant.")
    try:
        first = load_run(run_a)
        second = load_run(run_b) if run_b is not None else None
        comparison = compare_runs(first, second, variant_b=variant or "default", allow_mixed=allow_mixed,
                                  splits=list(splits) or None)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(comparison, indent=2))
        return
    compared: list[dict[str, Any]] = comparison["splits"]
    table = Table(title=escape(f"A = {comparison['a']}   B = {comparison['b']}"))
    table.add_column("")
    for split in compared:
        table.add_column(split["split"], justify="right")
    rows = {
        "pairs (tasks)": [f"{s['pairs']} ({s['tasks']})" for s in compared],
        "success A": [f"{s['success_a']:.1%}" for s in compared],
        "success B": [f"{s['success_b']:.1%}" for s in compared],
        "A - B": [f"{s['difference']:+.1%}" for s in compared],
        "95% CI": [f"[{s['ci95'][0]:+.1%}, {s['ci95'][1]:+.1%}]" for s in compared],
        "A only / B only": [f"{s['a_only']} / {s['b_only']}" for s in compared],
        "p": [f"{s['p_value']:.4g}" for s in compared],
    }
    for name, cells in rows.items():
        table.add_row(name, *cells)
    out = Console()
    out.print(table)
    out.print(escape(f"test: {comparison['test']}\ninterval: {comparison['interval']}"))
    for split in compared:
        if split["note"]:
            out.print(f"{split['split']}: {split['note']}")
    if comparison["mixed_fields"]:
        out.print(f"[yellow]Mixed protocols: {', '.join(comparison['mixed_fields'])}[/]")
    if comparison["dtype_note"]:
        out.print(f"[yellow]{escape('Mixed dtypes: ' + comparison['dtype_note'])}[/]")


@cli.group()
def data() -> None:
    """Install the data that an environment needs (nothing is downloaded at run time)."""


@data.command("alfworld")
@click.option("--from", "source", default=None,
              help="Folder or base URL holding train.tar.xz, valid_seen.tar.xz, valid_unseen.tar.xz. "
                   "Without it: show what is installed and what is missing.")
@click.option("--to", "dest", type=click.Path(file_okay=False), default=None,
              help="Data folder (default: $ALFWORLD_DATA, else ~/.local/share/arena/alfworld).")
@click.option("--checksums", type=click.Path(exists=True, dir_okay=False), default=None,
              help="SHA256SUMS file to verify against instead of Arena's pinned checksums.")
@click.option("--force", is_flag=True, help="Replace splits that are already installed.")
def data_alfworld(source: str | None, dest: str | None, checksums: str | None, force: bool) -> None:
    """Unpack ALFWorld's game archives into the data folder, verifying their checksums."""
    from arena.envs.alfworld import data as alfworld_data

    root, chosen_by = (Path(dest).expanduser(), "--to") if dest else alfworld_data.resolve_data_dir(None)
    if source is not None:
        sums = alfworld_data.parse_checksums(Path(checksums).read_text()) if checksums else None
        try:
            alfworld_data.install(source, root, checksums=sums, force=force, log=click.echo)
        except alfworld_data.AlfworldDataError as exc:
            raise click.ClickException(str(exc)) from exc
    summary, complete = alfworld_data.describe(root, chosen_by)
    click.echo(summary)
    if not complete:
        raise click.exceptions.Exit(1)


@cli.command("new-method")
@click.argument("name")
@click.option("--path", "path", type=click.Path(file_okay=False), default=None,
              help="Folder to write the package into (default: ./arena-NAME).")
def new_method(name: str, path: str | None) -> None:
    """Write a method package: pyproject with the `arena` entry point, every hook stubbed, tests."""
    from arena.templates import TemplateError, create_method_package

    try:
        written = create_method_package(name, path)
    except TemplateError as exc:
        raise click.ClickException(str(exc)) from exc
    root = written[0].parent
    click.echo(f"Wrote {len(written)} files to {root}. Next:\n"
               f"  cd {root} && pip install -e . && python -m pytest\n"
               f"  arena run --method {name.replace('-', '_')}")



@cli.command()
@click.argument("recipe", required=False)
@click.option("--model", default="embedded", show_default=True,
              help="The base model (embedded, tiny or a local Hugging Face folder).")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Also copy the built warm start here (e.g. leaderboards/<board>/base) to commit it.")
def warmstart(recipe: str | None, model: str, out: str | None) -> None:
    """Build (or find in the cache) the warm-start base of RECIPE: behaviour cloning of the model
    on the expert's train demonstrations. Runs use it with llm.warmstart=RECIPE."""
    from arena.backends.transformers_backend import resolve_model
    from arena.warmstart import build, recipe_names

    if recipe is None:
        click.echo("Recipes (arena/warmstart/recipes/): " + ", ".join(recipe_names()))
        click.echo("Build one with `arena warmstart NAME`; use it with `arena run ... llm.warmstart=NAME`.")
        return
    try:
        folder, _ = resolve_model(model)
        warm = build.resolve(recipe, folder)
        if out is not None:
            build.copy_to(warm, Path(out))
    except (*USER_ERRORS, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    shown = warm.describe()
    click.echo(f"Warm start '{shown['recipe']}' in {warm.folder}" + (f" (copied to {out})" if out else ""))
    click.echo(f"  adapter sha256 {shown['adapter_sha256']}; {shown['demonstrations']} demonstrations, "
               f"{shown['examples']} examples, {shown['steps']} steps, final loss {shown['final_loss']}")
    click.echo(f"  use it: arena run --method NAME llm.warmstart={out or recipe}")

class Terminated(BaseException):
    """SIGTERM (a job scheduler, ``kill``): unwinds like Ctrl-C so the run stops cleanly."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


#: Write errors that mean "no room": the run stops with the resume command, not a traceback.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: The directory of the run this process plays, where the command named it (--out, --resume):
#: the stop hints then give the exact command.
_named_run_dir: Path | None = None


def _name_run_dir(path: str | None) -> None:
    global _named_run_dir
    _named_run_dir = Path(path).resolve() if path else None


def _resume_hint() -> str:
    if _named_run_dir is not None:
        run_dir, found = str(_named_run_dir), ""
    else:
        run_dir, found = "RUN_DIR", " (the run directory `arena run` printed, or the newest under runs/)"
    return f"Finished episodes are saved; continue with `arena run --resume {run_dir}`{found}."


def main() -> None:
    """The console script. Ctrl-C and SIGTERM end a run cleanly, say how to resume it and exit
    130 and 143; click's own handling would print only "Aborted!"."""
    signal.signal(signal.SIGTERM, _terminate)
    compact_allocator()  # before torch and the episodes' threads start
    try:
        code = cli.main(standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort):
        console.print(f"Interrupted. {_resume_hint()}", soft_wrap=True)
        sys.exit(130)
    except Terminated:
        console.print(f"Terminated. {_resume_hint()}", soft_wrap=True)
        sys.exit(143)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        console.print(f"The disk is full ({exc.strerror}). Free some space, then continue: {_resume_hint()}",
                      soft_wrap=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
