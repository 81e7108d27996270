"""The board as Markdown (README.md), one self-contained HTML page and leaderboard.json.

The outputs hold no timestamp, so rebuilding a board from the same runs gives the same files.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import arena
from arena.core.contract.types import EpisodeResult
from arena.report.aggregate import WARMSTART_FIELD, Row, Table
from arena.report.experiments import ExperimentReport
from arena.report.learning import ALL_TYPES as ALL_TASK_TYPES
from arena.report.learning import (
    CLAIM_P_VALUE,
    MEMORY_RESET,
    SEEDS_FOR_A_CLAIM,
    Learning,
    RowComparison,
    Standing,
    Verdict,
)
from arena.report.plots import Plot, table_plots
from arena.report.runs import Run

BOARD_SCHEMA_VERSION = 1

NOTES = [
    "Success: share of test episodes solved, with its 95 % Wilson interval over tasks (each task's "
    "success averaged over its seeds first, so seeds never pass for extra tasks; the harness's own "
    "interval, identical to results.json for a row of one run).",
    "Progress, valid actions and steps are given per split, in the order of the success columns.",
    "Cost is per run (the mean over a row's runs): learning episodes and tokens, and wall-clock "
    "hours of learning + evaluation on the device the model ran on (CPU-h or GPU-h).",
    "Rows pool the runs of one method, preset and model with different seeds. Invalid runs are "
    "shown last and never ranked.",
]


# -- formatting -------------------------------------------------------------------------------


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def success_cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    low, high = summary["ci95"]
    return f"{pct(summary['success_rate'])} [{100 * low:.1f}, {100 * high:.1f}]"


def count(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def size(n_bytes: float) -> str:
    for limit, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n_bytes >= limit:
            return f"{n_bytes / limit:.1f} {suffix}"
    return f"{n_bytes:.0f} B"


def per_split(row: Row, splits: list[str], metric: str, percent: bool) -> str:
    """One metric for every split, "a / b" in the order of the success columns."""
    values = []
    for split in splits:
        summary = row.splits.get(split)
        values.append("-" if summary is None else f"{float(summary[metric]) * (100 if percent else 1):.1f}")
    return " / ".join(values) + (" %" if percent else "")


def hours_cell(row: Row) -> str:
    cost = row.cost
    return f"{cost['learn_hours']:.3g} + {cost['eval_hours']:.3g} {cost['device']}-h"


def memory_cell(row: Row) -> str:
    cost = row.cost
    parts = [f"{count(cost['memory_items'])} items, {size(cost['memory_bytes'])}"]
    parts.extend(f"{name.replace('_', ' ')} {count(value)}" for name, value in cost["method_state"].items())
    return "; ".join(parts)


def protocol_line(table: Table) -> str:
    protocol = table.protocol
    parts = []
    if "env_version" in protocol:
        parts.append(f"env version {protocol['env_version']}")
    if "eval.splits" in protocol:
        parts.append("splits " + ", ".join(protocol["eval.splits"]))
    for key in ("eval.max_steps", "eval.max_invalid_actions", "eval.source_pool"):
        if key in protocol:
            parts.append(f"{key} {protocol[key]}")
    parts.extend(f"{key} {value}" for key, value in protocol.items() if key.startswith("env."))
    if "track" in protocol:
        parts.append(f"track {protocol['track']}")
    if WARMSTART_FIELD in protocol:
        parts.append(f"warm-start base {protocol[WARMSTART_FIELD]} (docs/warmstart.md)")
    if "limited" in protocol:
        parts.append(f"limited (eval.limit={protocol.get('eval.limit')})" if protocol["limited"]
                     else "full evaluation (no eval.limit)")
    hashes = [f"{k.split('.', 1)[1]} {str(v)[:12]}" for k, v in protocol.items() if k.startswith("split_hashes.")]
    if hashes:
        parts.append("split hashes " + ", ".join(hashes))
    line = "; ".join(parts)
    if table.mixed_fields:
        line += f". MIXED protocols (--allow-mixed): rows differ in {', '.join(table.mixed_fields)}"
    return line


def provenance_line(row: Row) -> str:
    p = row.provenance
    where = f"; ran on {'; '.join(p['machines'])}" if p.get("machines") else ""
    commits = ("; commits " + "; ".join(f"{phase} {', '.join(shas)}" for phase, shas in p["phase_commits"].items())
               if p.get("phase_commits") else "")
    updates = f"; policy updates in {' and '.join(p['updates'])}" if p.get("updates") else ""
    return (f"arena {', '.join(p['arena_version'])}; git {', '.join(p['git_sha'])}; "
            f"model {', '.join(p['model'])} (weights {', '.join(p['weights_sha256'])}; "
            f"{', '.join(p['dtype'])}){updates}{where}{commits}; "
            f"seeds {', '.join(map(str, p['seeds']))}; runs {', '.join(p['runs'])}")


#: Said below a table one of whose runs went through ``arena verify``.
VERIFY_NOTE = ("Verified: `arena verify` replayed the run's frozen evaluation from its saved learned "
               "state in a fresh process and every episode matched; unverified: its record was changed "
               "or an episode played differently on replay; not verified: never checked, or its learned "
               "state could not be restored (docs/security.md).")


def shows_verification(table: Table) -> bool:
    return any(row.verification is not None for row in table.rows)


def verification_cell(row: Row) -> str:
    if row.verification is None:
        return "not verified"
    runs = row.verification.get("runs", {})
    status = str(row.verification["status"])
    done = sum(1 for state in runs.values() if state == "verified")
    return status if len(runs) < 2 or done in (0, len(runs)) else f"{status} ({done} of {len(runs)} runs)"


#: Said below every table: what the Isolation column means.
ISOLATION_NOTE = ("Isolation: process when the method's hooks ran in a worker process of their own "
                  "(run.isolation=process: no reach into the harness, the record or the run directory, "
                  "docs/security.md); in process when they ran in Arena's process, with its full "
                  "reach; unknown (in process) for runs made before Arena recorded it. `arena "
                  "leaderboard --require-isolation` refuses a board with a row that was not isolated.")


#: How each isolation mode of a run reads on a page.
ISOLATION_NAMES = {"process": "process", "in_process": "in process", "unknown": "unknown (in process)"}


def isolation_cell(row: Row) -> str:
    """How the row's methods ran; a mixed row counts its runs of each kind."""
    isolation, named = row.isolation, ISOLATION_NAMES
    if isolation["mode"] != "mixed":
        return named.get(str(isolation["mode"]), str(isolation["mode"]))
    counts: dict[str, int] = {}
    for mode in isolation["runs"].values():
        counts[mode] = counts.get(mode, 0) + 1
    return "mixed: " + ", ".join(f"{named.get(mode, mode)} {n}" for mode, n in sorted(counts.items()))


def main_columns(table: Table) -> list[str]:
    splits = table.splits
    joined = " / ".join(splits)
    return (["#", "Method", "Model", "Track", "Seeds"] + [f"{s} success [95 % CI]" for s in splits]
            + [f"Progress ({joined})", f"Valid actions ({joined})", f"Steps ({joined})",
               "Learn episodes", "Learn tokens", "Hours (learn + eval)", "Memory", "Isolation"]
            + (["Verified"] if shows_verification(table) else []) + ["Flags"])


def main_cells(table: Table, rank: int, row: Row) -> list[str]:
    splits = table.splits
    return ([str(rank) if row.valid else "-", row.name, row.model, row.track,
             ", ".join(map(str, row.seeds))]
            + [success_cell(row.splits.get(s)) for s in splits]
            + [per_split(row, splits, "progress_rate", True), per_split(row, splits, "valid_action_rate", True),
               per_split(row, splits, "mean_steps", False), count(row.cost["learn_episodes"]),
               count(row.cost["learn_tokens"]), hours_cell(row), memory_cell(row), isolation_cell(row)]
            + ([verification_cell(row)] if shows_verification(table) else [])
            + ["; ".join(row.flags) or "-"])


EXPERIMENTS_NOTE = (
    "Each experiment (arena experiment, docs/experiments.md) evaluates one run's learned state "
    "again per arm (conflict's first two arms learn again first), each arm changing one factor the "
    "harness applies; every arm is paired with its "
    "control task by task: the difference in success with its paired bootstrap interval and the "
    "exact sign-flip p-value. Same items shown: the share of pairs in which the arm was shown the "
    "experience items its control was shown; near 100 % for a factor on experience, the arm tests "
    "nothing (a store with one task type's items has no other type's to give). Arms are never "
    "ranked in the tables above.")


def notes(tables: list[Table]) -> list[str]:
    """The board's notes; the one on verification only where a table shows it."""
    return NOTES + ([VERIFY_NOTE] if any(shows_verification(table) for table in tables) else [])


def page_notes(tables: list[Table]) -> list[str]:
    """The notes of README.md and index.html: the board's, and what the Isolation column means
    (leaderboard.json says it per row, in ``isolation``)."""
    return notes(tables) + [ISOLATION_NOTE]


def type_columns(table: Table, split: str) -> list[str]:
    return ["Method", "Model"] + table.task_types[split]


def type_cells(table: Table, split: str, row: Row) -> list[str]:
    by_type = row.splits.get(split, {}).get("by_task_type", {})
    return [row.name, row.model] + [success_cell(by_type.get(t)) for t in table.task_types[split]]


def variant_lines(row: Row) -> list[str]:
    lines = []
    for split, variants in row.variants.items():
        for name, summary in variants.items():
            lines.append(f"{split} {name}: {success_cell(summary)} "
                         f"(primary {success_cell(row.splits.get(split))})")
    return lines


# -- reliability over seeds (pass^k) and the learning section ---------------------------------

PASS_K_NOTE = ("tau-bench's pass^k, for rows of several seeds: a task won on c "
               "of its n seeds counts C(c, k) / C(n, k), the chance that k of its seeds drawn at random "
               "all win it, averaged over tasks; pass^1 is the success rate, pass^n the share of tasks "
               "won on every seed. Rows of one seed have none.")


def reliable_rows(table: Table) -> list[Row]:
    return [row for row in table.rows if row.pass_k]


def pass_k_columns(table: Table) -> list[str]:
    return ["Method", "Model", "Seeds"] + [f"{split} pass^k, k = 1..n" for split in table.splits]


def pass_k_cells(table: Table, row: Row) -> list[str]:
    def cell(split: str) -> str:
        values = row.pass_k.get(split)
        return "-" if not values else " / ".join(pct(values[k]) for k in sorted(values, key=int))

    return [row.name, row.model, str(len(row.seeds))] + [cell(split) for split in table.splits]


LEARNING_TITLE = "Learning: each row against its controls"
LEARNING_NOTE = (
    "Learning measured as the papers measure it: each row against the control rows the board names "
    "(--control: the base model for the RL methods, the random policy for every method) and a memory "
    "method against its own memory reset (its learned state evaluated again with no experience shown: "
    "arena evaluate --state RUN eval.experience.source=none). Paired by task, seeds pooled: the "
    "difference is the mean over tasks of A's success rate minus B's, in points, with its paired "
    "bootstrap 95 % interval over tasks; tasks better / worse count the tasks A won more / less often "
    "than B; p is the exact sign-flip test over tasks of n_B * wins_A - n_A * wins_B (exact McNemar "
    "with one seed each). Invalid rows are marked: their difference is no claim. A row that played a "
    "variant of every test episode (Evolving-RL without its card) is also paired with that variant.")
VERDICTS_NOTE = (
    "What the board says of each row: its success per split and, against each control and its memory "
    "reset, the difference in points paired by task with its exact p-value. A difference at "
    f"p < {CLAIM_P_VALUE} (marked ▲ above, ▼ below; per comparison, not corrected for the board's number of "
    f"comparisons) is a claim once the row has {SEEDS_FOR_A_CLAIM} learning seeds ('1 of {SEEDS_FOR_A_CLAIM}': "
    "seeds run of those a claim needs); an unmarked difference means the test found none, not that the rows "
    "are equal. leaderboard.json's verdicts say the same in a sentence per row.")
LEARNING_COLUMNS = ["Method", "Against", "Split", "Success A / B", "Difference [95 % CI]",
                    "Tasks better / worse", "p (exact paired)", "Seeds A / B"]


def learning_cells(line: RowComparison, with_type: bool = False) -> list[str]:
    result = line.result
    low, high = result.ci95
    method = line.row + (" (INVALID: " + ", ".join(line.invalid) + ")" if line.invalid else "")
    return ([line.task_type] if with_type else []) + [
        method, line.against, line.split, f"{pct(result.success_a)} / {pct(result.success_b)}",
        f"{result.difference * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}]",
        f"{result.a_better} / {result.b_better}", f"{result.p_value:.3g}", f"{line.seeds_a} / {line.seeds_b}"]


def table_verdicts(learning: Learning | None, table: Table) -> list[Verdict]:
    return [verdict for verdict in (learning.verdicts if learning else []) if verdict.env == table.env]


def _verdict_layout(verdicts: list[Verdict]) -> dict[str, list[str]]:
    """split -> what the verdicts compare with on it (each control, the memory reset), in the
    order they name them."""
    return {split: list(dict.fromkeys(s.against for v in verdicts for s in v.standings if s.split == split))
            for split in dict.fromkeys(s.split for v in verdicts for s in v.standings)}


def verdict_columns(verdicts: list[Verdict]) -> list[str]:
    """Row, seeds, then per split its success and one column per control (and memory reset)."""
    columns = ["Row", "Seeds"]
    for split, against in _verdict_layout(verdicts).items():
        columns += [split] + [f"vs {'its reset' if name == MEMORY_RESET else name}" for name in against]
    return columns


def _standing_cell(standing: Standing | None) -> str:
    if standing is None:
        return "-"
    if standing.invalid:
        return "invalid"
    mark = ("▲ " if standing.difference > 0 else "▼ ") if standing.claimed else ""
    return f"{mark}{standing.difference * 100:+.1f} (p {standing.p_value:.2g})"


def verdict_rows(verdicts: list[Verdict]) -> list[list[str]]:
    """The verdicts as a table, a row's line short enough for a README to quote every row: the
    figures of its sentence, cell by cell (verdict_columns); "-" where it has no such comparison."""
    rows = []
    for verdict in verdicts:
        needed = verdict.seeds + verdict.seeds_needed
        cells = [verdict.row, f"{verdict.seeds} of {needed}" if verdict.seeds_needed else str(verdict.seeds)]
        for split, against in _verdict_layout(verdicts).items():
            of_split = {s.against: s for s in verdict.standings if s.split == split}
            first = next(iter(of_split.values()), None)
            cells.append(pct(first.success) if first else "-")
            cells += [_standing_cell(of_split.get(name)) for name in against]
        rows.append(cells)
    return rows


def learning_rows(learning: Learning | None, table: Table, overall: bool) -> list[list[str]]:
    return [learning_cells(line, with_type=not overall) for line in (learning.comparisons if learning else [])
            if line.env == table.env and (line.task_type == ALL_TASK_TYPES) == overall]


# -- Markdown ---------------------------------------------------------------------------------


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table's lines; a cell's ``|`` is escaped and its newlines folded, so any text
    (a violation, a protocol) keeps the table whole."""
    lines = ["| " + " | ".join(_md_cell(c) for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines.extend("| " + " | ".join(_md_cell(c) for c in cells) + " |" for cells in rows)
    return lines


# -- experiments (arena experiment) -------------------------------------------------------------

EXPERIMENT_COLUMNS = ["Arm", "Control", "Split", "Arm success", "Control success",
                      "Difference [95 % CI]", "p (exact paired)", "Pairs", "Same items shown", "Also differs in"]


def experiment_title(report: ExperimentReport) -> str:
    return f"{report.name}: {report.method} on {report.env}, run {report.source} ({report.folder})"


def experiment_line(report: ExperimentReport) -> str:
    options = "; ".join(f"{key} {value}" for key, value in sorted(report.options.items()))
    phase = report.second_phase
    learned = (f"; second learning phase: {phase['episodes']} episodes, store {phase['items_before']} -> "
               f"{phase['items_after']} items" + (f" ({phase['note']})" if phase.get("note") else "")
               if phase else "")
    poison = "; ".join(f"{arm}: {p['poison_items']} poison items beside {p['clean_items']} learned, "
                       f"{p['from_another_type']} of another task type" for arm, p in report.poisoned.items())
    reused = "; ".join(f"{arm} is the arm {folder} (reused: the same source and settings)"
                       for arm, folder in report.reused.items())
    played = ("every arm on the full test splits" if report.limit is None else
              f"every arm on the first {report.limit} tasks of each split (eval.limit, round-robin over task types)")
    return (f"Factor: {', '.join(report.factor)}; arms {', '.join(report.arms)}; {played}"
            + (f"; {options}" if options else "") + (f"; {poison}" if poison else "")
            + (f"; {reused}" if reused else "") + learned)


def experiment_cells(row: dict[str, Any], with_type: bool = False) -> list[str]:
    low, high = row["ci95"]
    return ([row["task_type"]] if with_type else []) + [
        row["arm"], row["control"], row["split"], pct(row["success_arm"]), pct(row["success_control"]),
        f"{row['difference'] * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}]", f"{row['p_value']:.3g}",
        str(row["pairs"]), _same_items(row),
        ", ".join([*row["other_differences"], *(f"INVALID {arm}" for arm in row.get("invalid", []))]) or "-"]


def _same_items(row: dict[str, Any]) -> str:
    """The share of pairs shown the same experience items (and, if fewer, in the same order)."""
    same, ordered = row.get("same_experience", 0.0), row.get("same_experience_order", 0.0)
    return pct(same) + (f" ({pct(ordered)} in order)" if ordered != same else "")


def experiment_rows(report: ExperimentReport, overall: bool) -> list[list[str]]:
    return [experiment_cells(row, with_type=not overall) for row in report.comparisons
            if (row["task_type"] == "all") == overall]


def markdown(tables: list[Table], plots: dict[str, list[Plot]],
             experiments: list[ExperimentReport] | None = None, learning: Learning | None = None) -> str:
    lines = ["# Arena leaderboard", ""]
    for table in tables:
        lines += [f"## {table.env}", "", f"Protocol: {protocol_line(table)}. Sorted by {table.sort}.", ""]
        lines += markdown_table(main_columns(table),
                                [main_cells(table, rank, row) for rank, row in enumerate(table.rows, 1)])
        lines.append("")
        if reliable_rows(table):
            lines += ["### Reliability over seeds", "", PASS_K_NOTE, ""]
            lines += markdown_table(pass_k_columns(table), [pass_k_cells(table, row) for row in reliable_rows(table)])
            lines += [""]
        if learning_rows(learning, table, overall=True):
            lines += [f"### {LEARNING_TITLE}", "", LEARNING_NOTE, ""]
            lines += markdown_table(LEARNING_COLUMNS, learning_rows(learning, table, overall=True))
            verdicts = table_verdicts(learning, table)
            lines += ["", VERDICTS_NOTE, ""] + markdown_table(verdict_columns(verdicts), verdict_rows(verdicts))
            lines += ["", "<details>", "<summary>per task type</summary>", ""]
            lines += markdown_table(["Task type", *LEARNING_COLUMNS], learning_rows(learning, table, overall=False))
            lines += ["", "</details>", ""]
        for split in table.splits:
            lines += ["<details>", f"<summary>{split}: success per task type</summary>", ""]
            lines += markdown_table(type_columns(table, split), [type_cells(table, split, row) for row in table.rows])
            lines += ["", "</details>", ""]
        variant_rows = [(row, variant_lines(row)) for row in table.rows if row.variants]
        if variant_rows:
            lines += ["Variants evaluated beside the primary result:", ""]
            lines += [f"- {row.name} / {row.model}: {'; '.join(v)}" for row, v in variant_rows]
            lines.append("")
        lines += ["Provenance:", ""]
        lines += [f"- {row.name} / {row.model}: {provenance_line(row)}" for row in table.rows]
        lines.append("")
        for plot in plots.get(table.env, []):
            lines += [f"![{plot.title}](plots/{plot.name}.png)", ""]
    if experiments:
        lines += ["## Experiments", "", EXPERIMENTS_NOTE, ""]
    for report in experiments or []:
        lines += [f"### {experiment_title(report)}", "", experiment_line(report) + ".", ""]
        lines += markdown_table(EXPERIMENT_COLUMNS, experiment_rows(report, overall=True))
        lines += ["", "<details>", "<summary>per task type</summary>", ""]
        lines += markdown_table(["Task type", *EXPERIMENT_COLUMNS], experiment_rows(report, overall=False))
        lines += ["", "</details>", ""]
    lines += ["Notes:", ""] + [f"- {note}" for note in page_notes(tables)] + [""]
    return "\n".join(lines)


# -- HTML -------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem;color:#1b1b1b;max-width:110rem}
h1{font-size:1.5rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ccc}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5rem 0;font-size:.85rem}
th,td{border:1px solid #d0d0d0;padding:.25rem .45rem;text-align:left;vertical-align:top}
th{background:#f2f4f7;cursor:pointer;user-select:none}
tr.invalid td{color:#8a1c1c;background:#fff4f4}
td.num{text-align:right;white-space:nowrap}
.protocol,.note{font-size:.85rem;color:#444}
details{margin:.4rem 0}summary{cursor:pointer;font-weight:600}
figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #e0e0e0}
ul.provenance{font-size:.8rem;color:#333}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
form.filters{display:flex;flex-wrap:wrap;gap:.4rem 1rem;align-items:center;font-size:.85rem;margin:.5rem 0}
form.filters label{display:flex;gap:.3rem;align-items:center}
[hidden]{display:none!important}
"""

# Click a header to sort its table by that column: cells by their leading number (1.5k, 2M and
# 3G as such; "-" last either way), text alphabetically. The filters of a section hide the rows
# (and the other splits' success columns) that do not match every chosen value.
JS = """
function sortKey(text) {
  var m = /^([-+]?\\d+(?:\\.\\d+)?)\\s*([kMG](?![A-Za-z]))?/.exec(text);
  return m ? parseFloat(m[1]) * ({k: 1e3, M: 1e6, G: 1e9}[m[2]] || 1) : null;
}
document.querySelectorAll('table.sortable').forEach(function (table) {
  var headers = table.querySelectorAll('th');
  headers.forEach(function (header, column) {
    header.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var ascending = header.getAttribute('aria-sort') !== 'ascending';
      headers.forEach(function (other) { other.removeAttribute('aria-sort'); });
      header.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
      rows.sort(function (a, b) {
        var x = a.cells[column].textContent.trim(), y = b.cells[column].textContent.trim();
        var nx = sortKey(x), ny = sortKey(y);
        if (nx === null && ny !== null) return 1;
        if (ny === null && nx !== null) return -1;
        var order = (nx !== null && nx !== ny) ? nx - ny : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
document.querySelectorAll('form.filters').forEach(function (form) {
  var section = form.closest('section');
  function apply() {
    var chosen = {};
    form.querySelectorAll('select').forEach(function (select) { chosen[select.name] = select.value; });
    var lines = section.querySelectorAll('tr[data-filtered]'), shown = 0;
    lines.forEach(function (row) {
      row.hidden = !Object.keys(chosen).every(function (name) {
        var value = row.getAttribute('data-' + name);
        return !chosen[name] || value === null || value.split('|').indexOf(chosen[name]) >= 0;
      });
      if (!row.hidden && row.closest('table.breakdown')) shown += 1;
    });
    section.querySelectorAll('[data-column-split]').forEach(function (cell) {
      cell.hidden = !!chosen.split && cell.getAttribute('data-column-split') !== chosen.split;
    });
    form.querySelector('output').textContent = shown + ' of ' +
      section.querySelectorAll('table.breakdown tbody tr').length + ' breakdown lines shown';
  }
  form.addEventListener('change', apply);
  apply();
});
"""

# Nothing may be fetched: the page is one file, and the policy makes any stray request fail loudly.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


def _h(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _attributes(values: dict[str, str]) -> str:
    """A row's filter values as data attributes, which the page's script reads."""
    return "".join(f' data-{name}="{_h(value)}"' for name, value in values.items())


def _html_table(columns: list[str], rows: list[list[str]], classes: list[str] | None = None,
                row_data: list[dict[str, str]] | None = None, column_splits: list[str | None] | None = None,
                kind: str = "") -> str:
    """A sortable table; cells that start with a number are right-aligned. ``row_data``: each
    row's values for the section's filters; ``column_splits``: the split a column shows, for the
    split filter to hide it."""
    def split_of(column: int) -> str:
        split = column_splits[column] if column_splits else None
        return "" if split is None else f' data-column-split="{_h(split)}"'

    head = "".join(f"<th{split_of(i)}>{_h(c)}</th>" for i, c in enumerate(columns))
    body = []
    for index, cells in enumerate(rows):
        row_class = f' class="{classes[index]}"' if classes and classes[index] else ""
        filtered = " data-filtered" + _attributes(row_data[index]) if row_data else ""
        tds = "".join(f'<td class="num"{split_of(i)}>{_h(c)}</td>' if c[:1].isdigit()
                      else f"<td{split_of(i)}>{_h(c)}</td>" for i, c in enumerate(cells))
        body.append(f"<tr{row_class}{filtered}>{tds}</tr>")
    # In its own scrolling frame: a wide table scrolls instead of running off the page.
    return (f'<div class="scroll"><table class="{" ".join(filter(None, ["sortable", kind]))}"><thead><tr>{head}'
            f'</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


# -- the page's filters and breakdown (index.html alone: README.md and leaderboard.json keep theirs)

#: The task type of a breakdown line over every task type of its split.
ALL_TYPES = "(all types)"
#: What a reader filters a board's section by: (the rows' data attribute, the control's label).
FILTERS = (("split", "Split"), ("type", "Task type"), ("level", "Level"), ("seed", "Seed"),
           ("isolation", "Isolation"))
BREAKDOWN_COLUMNS = ["Method", "Model", "Split", "Task type", "Level", "Seed", "Isolation", "Episodes",
                     "Success", "Progress", "Steps"]
FILTER_NOTE = ("Filters: the breakdown shows the test episodes of each row by split, task type, level, "
               "seed and isolation (each line's success is its episodes' share solved, without an "
               "interval); level, seed and isolation also filter the rows above, and split hides the "
               "other splits' success columns. Click any header to sort by it.")


def run_level(run: Run) -> str:
    """The environment's level the run played (``env.level``); "-" for an environment without
    one (BabyAI's levels are its task types)."""
    level = run.results.protocol.env.get("level")
    return "-" if level is None else str(level)


def run_isolation(run: Run) -> str:
    """How the run's method ran, worded as the Isolation column words it."""
    return ISOLATION_NAMES.get(run.isolation, run.isolation)


def row_filter_values(row: Row) -> dict[str, str]:
    """A main row's levels, seeds and isolation modes ("|" between several), for the filters."""
    return {"level": "|".join(sorted({run_level(run) for run in row.runs})),
            "seed": "|".join(str(seed) for seed in row.seeds),
            "isolation": "|".join(sorted({run_isolation(run) for run in row.runs}))}


def breakdown(table: Table) -> list[tuple[dict[str, str], list[str], bool]]:
    """(filter values, cells, valid) of one line per row, split, task type (and all types),
    level, seed and isolation: the row's primary test episodes of that seed, pooled over its
    runs. Runs kept without episodes.jsonl have no line."""
    lines = []
    order = {split: index for index, split in enumerate(table.splits)}
    for row in table.rows:
        groups: dict[tuple[str, str, str, int, str], list[EpisodeResult]] = defaultdict(list)
        for run in row.runs:
            for episode in run.evaluated() if run.episodes is not None else []:
                for task_type in (ALL_TYPES, episode.task_type):
                    groups[(episode.split, task_type, run_level(run), episode.seed, run_isolation(run))].append(episode)
        for key in sorted(groups, key=lambda k: (order.get(k[0], len(order)), k[1] != ALL_TYPES, k[1:])):
            split, task_type, level, seed, isolation = key
            episodes = groups[key]
            n = len(episodes)
            cells = [row.name, row.model, split, task_type, level, str(seed), isolation, str(n),
                     pct(sum(e.success for e in episodes) / n), pct(sum(e.progress for e in episodes) / n),
                     f"{sum(e.steps for e in episodes) / n:.1f}"]
            values = {"split": split, "type": task_type, "level": level, "seed": str(seed), "isolation": isolation}
            lines.append((values, cells, row.valid))
    return lines


def filter_form(table: Table, values: list[dict[str, str]]) -> str:
    """One select per filter, its options the values the section's rows hold; task type starts on
    all types (one breakdown line per row, split and seed)."""
    controls = []
    for name, label in FILTERS:
        found = {value for entry in values for value in entry.get(name, "").split("|") if value}
        choices = ([split for split in table.splits if split in found] if name == "split" else
                   sorted(found, key=lambda v: (len(v), v)) if name == "seed" else sorted(found))
        options = ['<option value="">any</option>'] + [
            f'<option value="{_h(v)}"{" selected" if name == "type" and v == ALL_TYPES else ""}>{_h(v)}</option>'
            for v in choices]
        controls.append(f'<label>{_h(label)} <select name="{name}">{"".join(options)}</select></label>')
    return f'<form class="filters">{"".join(controls)}<output></output></form>'


def html_page(tables: list[Table], plots: dict[str, list[Plot]],
              experiments: list[ExperimentReport] | None = None, learning: Learning | None = None) -> str:
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_h(CSP)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Arena leaderboard</title>", f"<style>{CSS}</style></head><body>",
        "<h1>Arena leaderboard</h1>",
    ]
    for table in tables:
        parts.append(f'<section class="board" id="{_h(table.env)}"><h2>{_h(table.env)}</h2>')
        parts.append(f'<p class="protocol">Protocol: {_h(protocol_line(table))}. Sorted by {_h(table.sort)}.</p>')
        rows = [main_cells(table, rank, row) for rank, row in enumerate(table.rows, 1)]
        row_values = [row_filter_values(row) for row in table.rows]
        lines = breakdown(table)
        parts.append(filter_form(table, row_values + [values for values, _, _ in lines]))
        parts.append(f'<p class="note">{_h(FILTER_NOTE)}</p>')
        success_columns = [f"{s} success [95 % CI]" for s in table.splits]
        parts.append(_html_table(main_columns(table), rows,
                                 ["" if row.valid else "invalid" for row in table.rows], row_values,
                                 [table.splits[success_columns.index(c)] if c in success_columns else None
                                  for c in main_columns(table)]))
        if reliable_rows(table):
            parts.append('<h3>Reliability over seeds</h3>')
            parts.append(_html_table(pass_k_columns(table), [pass_k_cells(table, row) for row in reliable_rows(table)],
                                     kind="reliability"))
            parts.append(f'<p class="note">{_h(PASS_K_NOTE)}</p>')
        if learning_rows(learning, table, overall=True):
            parts.append(f'<h3>{_h(LEARNING_TITLE)}</h3><p class="note">{_h(LEARNING_NOTE)}</p>')
            parts.append(_html_table(LEARNING_COLUMNS, learning_rows(learning, table, overall=True), kind="learning"))
            verdicts = table_verdicts(learning, table)
            parts.append(f'<p class="note">{_h(VERDICTS_NOTE)}</p>')
            parts.append(_html_table(verdict_columns(verdicts), verdict_rows(verdicts), kind="verdicts"))
            parts.append('<details class="task-types"><summary>per task type</summary>')
            parts.append(_html_table(["Task type", *LEARNING_COLUMNS], learning_rows(learning, table, overall=False),
                                     kind="learning"))
            parts.append("</details>")
        parts.append('<details class="breakdown" open><summary>Breakdown by split, task type, level, seed '
                     'and isolation</summary>')
        parts.append(_html_table(BREAKDOWN_COLUMNS, [cells for _, cells, _ in lines],
                                 ["" if valid else "invalid" for _, _, valid in lines],
                                 [values for values, _, _ in lines], kind="breakdown"))
        parts.append("</details>")
        for split in table.splits:
            parts.append(f'<details class="task-types"><summary>{_h(split)}: success per task type</summary>')
            parts.append(_html_table(type_columns(table, split),
                                     [type_cells(table, split, row) for row in table.rows]))
            parts.append("</details>")
        variant_rows = [(row, variant_lines(row)) for row in table.rows if row.variants]
        if variant_rows:
            parts.append("<details open><summary>Variants evaluated beside the primary result</summary><ul>")
            parts.extend(f"<li>{_h(row.name)} / {_h(row.model)}: {_h('; '.join(v))}</li>" for row, v in variant_rows)
            parts.append("</ul></details>")
        parts.append('<details><summary>Provenance</summary><ul class="provenance">')
        parts.extend(f"<li><b>{_h(row.name)} / {_h(row.model)}</b>: {_h(provenance_line(row))}</li>"
                     for row in table.rows)
        parts.append("</ul></details>")
        for plot in plots.get(table.env, []):
            encoded = base64.b64encode(plot.png).decode("ascii")
            parts.append(f'<figure><img class="plot" alt="{_h(plot.title)}" src="data:image/png;base64,{encoded}">'
                         f"<figcaption>{_h(plot.title)}</figcaption></figure>")
        parts.append("</section>")
    if experiments:
        parts.append(f'<section class="experiments" id="experiments"><h2>Experiments</h2>'
                     f'<p class="note">{_h(EXPERIMENTS_NOTE)}</p>')
        for report in experiments:
            parts.append(f"<h3>{_h(experiment_title(report))}</h3>"
                         f'<p class="protocol">{_h(experiment_line(report))}.</p>')
            parts.append(_html_table(EXPERIMENT_COLUMNS, experiment_rows(report, overall=True)))
            parts.append('<details class="task-types"><summary>per task type</summary>')
            parts.append(_html_table(["Task type", *EXPERIMENT_COLUMNS], experiment_rows(report, overall=False)))
            parts.append("</details>")
        parts.append("</section>")
    parts.append('<ul class="note">' + "".join(f"<li>{_h(n)}</li>" for n in page_notes(tables)) + "</ul>")
    parts.append(f"<script>{JS}</script></body></html>")
    return "\n".join(parts) + "\n"


# -- leaderboard.json and writing -------------------------------------------------------------


def board_json(tables: list[Table], experiments: list[ExperimentReport] | None = None,
               learning: Learning | None = None) -> dict[str, Any]:
    board = {"schema_version": BOARD_SCHEMA_VERSION, "arena_version": arena.__version__,
             "notes": notes(tables), "tables": [table.to_json() for table in tables]}
    if experiments:  # absent otherwise, so boards made before keep their files
        board["experiments"] = [report.to_json() for report in experiments]
    if learning is not None:  # only on a board built with --control, for the same reason
        board.update(learning.to_json())
    return board


def write_board(tables: list[Table], out: Path | str,
                experiments: list[ExperimentReport] | None = None, learning: Learning | None = None) -> list[Path]:
    """Write README.md, index.html, leaderboard.json and plots/*.png into ``out``.

    Everything is rendered before anything is written, and each file is replaced whole (written
    next to it, then renamed), so a folder that cannot be written keeps the board it had.
    """
    out = Path(out)
    plots = {table.env: table_plots(table) for table in tables}
    files: list[tuple[Path, bytes]] = [
        (out / "plots" / f"{plot.name}.png", plot.png) for env_plots in plots.values() for plot in env_plots]
    for name, text in (("README.md", markdown(tables, plots, experiments, learning)),
                       ("index.html", html_page(tables, plots, experiments, learning)),
                       ("leaderboard.json", json.dumps(board_json(tables, experiments, learning), indent=2) + "\n")):
        files.append((out / name, text.encode()))
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for path, data in files:
        partial = path.with_name(f".{path.name}.partial")
        try:
            partial.write_bytes(data)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return [path for path, _ in files]
