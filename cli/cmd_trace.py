"""`areal-graph trace RUN [RUN_B ...]`: where did the time go? Tables, an offline timeline page, PNGs.

Reads the Chrome trace every run writes (all its parts, oldest first; a file cut off
mid-write or a run whose worker died is read as far as it goes, and what is missing is
listed) and sums it up: count, total, mean, p50, p95 and share of the run's wall time per
span name, category and worker (spans run concurrently, so shares can add up past 100%);
the median training step split into compute per process and overhead (step_split.py);
busy and idle share per process, what bounded each step, the staleness of what was trained
and how full the micro-batches were (trace_stats.py, trace_metrics.py).

`--html OUT.html` writes one self-contained page (no network needed) with the zoomable
timeline, flow arrows, and the workflow graph with each node's time; given two runs it
draws them one above the other on one time axis. `--png DIR` writes utilisation.png and
learning_curve.png.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

GROUPINGS = {"name": "span", "cat": "category", "worker": "worker", "node": "node"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trace",
        help="where a run spent its time: tables, an offline HTML timeline (--html), PNGs (--png)",
        description=(
            "Summarise the trace of a run: for each span name, category and worker, the count, total, "
            "mean, median and 95th percentile duration and the share of the run's wall time; busy and idle "
            "share per process; what bounded each training step; staleness of what was trained; micro-batch "
            "packing. RUN is a run directory (its trace.json, and trace.partN.json of earlier parts, are read) "
            "or a trace file. Damaged traces (cut off mid-write, a worker killed) are read as far as they go "
            "and what is missing is listed. Several RUNs are summarised one after the other and, with "
            "--html, drawn one above the other on one time axis (each from its own start)."
        ),
        epilog="Example: areal-graph trace runs/grpo_sync-A runs/ppo_async-B --html compare.html --png plots/",
    )
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory or trace .json file")
    p.add_argument(
        "--by",
        nargs="+",
        choices=sorted(GROUPINGS),
        default=["name", "cat", "worker"],
        help="which tables to print (default: name cat worker)",
    )
    p.add_argument("--top", type=int, default=25, help="rows per table, largest total first (default 25)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    p.add_argument(
        "--html",
        type=Path,
        metavar="OUT.html",
        help="write the timeline page (self-contained: opens offline in any browser)",
    )
    p.add_argument("--png", type=Path, metavar="DIR", help="write utilisation.png and learning_curve.png into DIR")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="name a run on the page and in the tables (repeat once per RUN, in order; default: the directory's name)",
    )
    p.add_argument(
        "--span-budget",
        type=int,
        default=50_000,
        metavar="N",
        help="most spans the page draws one by one; past it, short neighbouring spans are merged "
        "into blocks and the page says so (default 50000)",
    )
    p.add_argument(
        "--read-mb",
        type=int,
        default=48,
        metavar="MB",
        help="most MB of a run's trace read (default 48): a larger trace is read in windows, the first "
        "and last steps and evenly spaced ones between, in bounded memory and time, and the "
        "output says so",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from areal_graph.cli.console import output_console
    from areal_graph.trace_analysis.trace_run import load_run
    from areal_graph.trace_analysis.trace_summary import summarize_run

    console, err = output_console(), Console(stderr=True)
    options = None
    if args.html is not None:  # before the tables: a bad option is said first, not after seconds of output
        from areal_graph.trace_analysis.trace_view import PageOptions

        try:
            options = PageOptions(span_budget=args.span_budget)
        except ValueError:
            err.print(
                f"[red]--span-budget must be an integer >= 100 (spans drawn on the page), got {args.span_budget}[/]"
            )
            return 2
    if args.label and len(args.label) != len(args.runs):
        err.print(
            f"[red]--label was given {len(args.label)} time(s) for {len(args.runs)} run(s): "
            "give one per RUN, in order[/]"
        )
        return 2
    if args.read_mb < 1:
        err.print(f"[red]--read-mb must be at least 1 (MB of each run's trace read), got {args.read_mb}[/]")
        return 2
    runs = []
    for k, path in enumerate(args.runs):
        try:
            runs.append(load_run(path, args.label[k] if args.label else None, args.read_mb * 2**20))
        except (FileNotFoundError, ValueError, OSError) as exc:
            err.print(f"[red]cannot read the trace: {exc}[/]", soft_wrap=True)
            return 1
    summaries = [summarize_run(r) for r in runs]
    reports = [_report(r, s, args) for r, s in zip(runs, summaries)]
    if args.json:
        console.print_json(json.dumps(reports[0] if len(reports) == 1 else {"runs": reports}, default=str))
    else:
        for rep, summary in zip(reports, summaries):
            _print_report(console, rep, summary, args)
    rc = 0
    said = err if args.json else console  # with --json, stdout holds the JSON alone
    if options is not None:
        rc |= _write_html(said, err, runs, summaries, args.html, options)
    if args.png is not None:
        rc |= _write_pngs(said, err, runs, args.png)
    return rc


def _report(run: Any, summary: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON report of one run: the span tables and the median step, then the summary's sections."""
    from areal_graph.trace_analysis.trace_stats import training_window

    spans = run.timeline.spans
    wall = run.timeline.wall_s
    window = training_window(run.timeline)
    files = summary["files"]
    shown = files if len(files) <= 4 else [*files[:2], f"... {len(files) - 3} more ...", files[-1]]
    return {
        "trace": ", ".join(shown),
        "label": run.label,
        "wall_s": wall,
        "spans": len(spans),
        # what `areal-graph simulate --json` predicts: first step's start to last step's end
        "steps_window_s": (window[1] - window[0]) if window else None,
        "by": {by: summarize(spans, by, wall) for by in args.by},
        "per_step": summary["median_step"],
        **{
            k: summary[k]
            for k in (
                "notes",
                "processes",
                "critical_path",
                "staleness",
                "packing",
                "nodes",
                "fused",
                "flows",
                "mismatch",
            )
        },
    }


def _print_report(console: Any, rep: dict[str, Any], summary: dict[str, Any], args: argparse.Namespace) -> None:
    console.print(
        f"[bold]{rep['label']}[/] ({rep['trace']}): {rep['spans']} spans over {rep['wall_s']:.2f} s "
        "of wall time"
        + (
            f"; steps window {rep['steps_window_s']:.2f} s (first step's start to last step's end)"
            if rep.get("steps_window_s")
            else ""
        ),
        highlight=False,
    )
    for note in rep["notes"]:
        console.print(f"  [yellow]note:[/] {note}", highlight=False)
    if not rep["spans"]:
        console.print("  the trace holds no spans yet")
        return
    for by, rows in rep["by"].items():
        console.print(_table(rows[: args.top], GROUPINGS[by], rep["wall_s"], len(rows)))
    if rep["per_step"]:
        console.print(_step_table(rep["per_step"]))
    console.print(_process_table(summary["processes"]))
    if summary["critical_path"]["steps"]:
        console.print(_bounds_table(summary["critical_path"]))
    for line in (
        _staleness_lines(summary["staleness"])
        + _packing_lines(summary["packing"])
        + _speculation_lines(summary["speculation"])
        + _shadow_lines(summary.get("speculation_shadow", {"available": False}))
    ):
        console.print(line, highlight=False)
    for part in _mismatch_parts(summary["mismatch"]):
        console.print(part, highlight=False)


def _write_html(
    console: Any, err: Any, runs: list[Any], summaries: list[dict[str, Any]], html: Any, options: Any
) -> int:
    from areal_graph.trace_analysis.trace_view import write_page

    try:
        t0 = time.perf_counter()
        path = write_page(html, runs, options, summaries)
    except OSError as exc:
        err.print(f"[red]cannot write {html}: {exc.strerror or exc}[/]")
        return 1
    console.print(
        f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB in {time.perf_counter() - t0:.2f} s); "
        "open it in any browser, no network needed",
        highlight=False,
    )
    return 0


def _write_pngs(console: Any, err: Any, runs: list[Any], outdir: Path) -> int:
    from areal_graph.trace_analysis.trace_png import PlotsUnavailable, write_pngs

    try:
        written = write_pngs(runs, outdir)
    except PlotsUnavailable as exc:
        err.print(f"[red]{exc}[/]")
        return 1
    except OSError as exc:
        err.print(f"[red]cannot write to {outdir}: {exc.strerror or exc}[/]")
        return 1
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _process_table(rows: list[dict[str, Any]]):
    from rich.table import Table

    t = Table(
        title="busy and idle per process (busy: compute, a worker's own housekeeping, a server swapping "
        "weights; steps: first step's start to last step's end)",
        title_justify="left",
    )
    for col in ("process", "busy", "% run", "% steps", "idle % steps", "in a span % run"):
        t.add_column(col, justify="left" if col == "process" else "right")
    for r in rows:
        t.add_row(
            r["process"],
            _fmt(r["busy_s"]),
            _pct(r["busy_share"]),
            _pct(r["busy_share_steps"]),
            _pct(r["idle_share_steps"]),
            _pct(r["in_span_share"]),
        )
    return t


def _bounds_table(cp: dict[str, Any]):
    from rich.table import Table

    t = Table(
        title=f"what bounded each step (critical path of {cp['steps']} steps; node sides from the {cp['sides_from']})",
        title_justify="left",
    )
    t.add_column("bounded by")
    t.add_column("steps", justify="right")
    t.add_column("median % of the step", justify="right")
    for b in cp["bounded_by"]:
        t.add_row(b["label"], str(b["steps"]), _pct(b["median_share"]))
    return t


def _staleness_lines(st: dict[str, Any]) -> list[str]:
    if not st["counts"]:
        return [f"[bold]staleness[/]: {st['note']}"]
    top = max(st["counts"].values())
    lines = [
        f"[bold]staleness of what was trained[/] ({st['unit']}, from {st['source']}): mean {st['mean']:.2f}, "
        f"max {st['max']:g}"
    ]
    lines += [f"  {k:>6g} {'#' * max(1, round(30 * v / top))} {v}" for k, v in st["counts"].items()]
    if st["note"]:
        lines.append(f"  [dim]{st['note']}[/]")
    return lines


def _packing_lines(pk: dict[str, Any]) -> list[str]:
    if not pk["available"]:
        return [f"[bold]micro-batch packing[/]: not available: {pk['missing']}"]
    return [
        f"[bold]micro-batch packing[/]: median fill {_pct(pk['fill_median'])}% of the {pk['budget']}-token "
        f"budget (lowest {_pct(pk['fill_min'])}%), {pk['at_lower_bound']} of {pk['steps']} steps at the lower "
        f"bound of micro-batches ({pk['extra_microbatches']:.0f} extra in all); [dim]{pk['note']}[/]"
    ]


def _speculation_lines(sp: dict[str, Any]) -> list[str]:
    """Speculative decoding (docs/speculative_decoding.md), when the engine verified anything."""
    if not sp["available"]:
        return []
    by_rows = ", ".join(f"{k} rows {v:.2f}" for k, v in sp["by_rows"].items())
    acc = ", ".join(f"{k} {sp['accepted'][k]}/{sp['proposed'][k]}" for k in sp["proposed"] if sp["proposed"][k])
    return [
        f"[bold]speculative decoding[/]: {sp['verifying']} of {sp['forwards']} forwards verified proposals, "
        f"{sp['tokens_per_forward']:.2f} tokens per row and forward ({by_rows}); accepted of proposed: {acc or 'none'}"
    ]


def _shadow_lines(sh: dict[str, Any]) -> list[str]:
    """What speculation would have accepted while it was off (engines/inference/speculation/shadow.py)."""
    if not sh["available"]:
        return []
    accepted, proposed = sum(sh["accepted"].values()), sum(sh["proposed"].values())
    by_source = ", ".join(f"{k} {sh['accepted'][k]}/{sh['proposed'][k]}" for k in sh["proposed"] if sh["proposed"][k])
    per_forward = ", ".join(
        f"{v['tokens_per_forward']:.2f} at {k} row{'s' if k != '1' else ''}" for k, v in sh["by_rows"].items()
    )
    return [
        f"[bold]shadow speculation (off)[/]: would have accepted {accepted} of {proposed} proposed tokens "
        f"(by source {by_source}), tokens per forward {per_forward}"
    ]


def _step_table(s: dict[str, Any]):
    """The median training step: compute per process, their union, and what is left (overhead)."""
    from rich.table import Table

    which = f"step {s['step']}, " if s.get("step") is not None else ""
    t = Table(
        title=f"the median training step ({which}median wall of {s['steps']} steps; compute = engine busy "
        "time, model forward/backward, rewards, controller nodes)",
        title_justify="left",
    )
    t.add_column("part")
    t.add_column("time", justify="right")
    t.add_column("% of step", justify="right")
    t.add_row("step (wall)", _fmt(s["wall_s"]), "100.0")
    for proc, sec in s["by_process_s"].items():
        t.add_row(f"  compute on {proc}", _fmt(sec), f"{100 * sec / s['wall_s']:.1f}")
    t.add_row("compute (union, overlaps once)", _fmt(s["compute_s"]), f"{100 * s['compute_s'] / s['wall_s']:.1f}")
    t.add_row(
        "overhead (RPC, serialisation, bookkeeping, weight sync, waiting)",
        _fmt(s["overhead_s"]),
        f"{100 * s['overhead_share']:.1f}",
    )
    return t


def summarize(spans: list[dict[str, Any]], by: str, wall_s: float) -> list[dict[str, Any]]:
    """Rows {key, count, total_s, mean_s, p50_s, p95_s, share}, largest total first."""
    groups: dict[str, list[float]] = {}
    for s in spans:
        groups.setdefault(_key(s, by), []).append(float(s.get("dur", 0.0)) / 1e6)
    rows: list[dict[str, Any]] = []
    for key, durs in groups.items():
        durs.sort()
        total = math.fsum(durs)
        rows.append(
            {
                "key": key,
                "count": len(durs),
                "total_s": total,
                "mean_s": total / len(durs),
                "p50_s": _percentile(durs, 50),
                "p95_s": _percentile(durs, 95),
                "share": total / wall_s if wall_s > 0 else 0.0,
            }
        )
    rows.sort(key=lambda r: (-r["total_s"], r["key"]))
    return rows


def _key(span: dict[str, Any], by: str) -> str:
    if by == "name":
        return str(span.get("name", "?"))
    if by == "cat":
        return str(span.get("cat") or "-")
    if by == "worker":
        return str(span.get("process", "?"))
    return str((span.get("args") or {}).get("node") or "-")


def _percentile(sorted_vals: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_vals:
        return 0.0
    pos = (len(sorted_vals) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _table(rows: list[dict[str, Any]], title: str, wall: float, n_all: int):
    from rich.table import Table

    t = Table(
        title=f"time per {title}" + (f" (top {len(rows)} of {n_all})" if len(rows) < n_all else ""),
        title_justify="left",
    )
    t.add_column(title)
    for col in ("count", "total", "mean", "p50", "p95", "% wall"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r["key"],
            str(r["count"]),
            _fmt(r["total_s"]),
            _fmt(r["mean_s"]),
            _fmt(r["p50_s"]),
            _fmt(r["p95_s"]),
            f"{100 * r['share']:.1f}",
        )
    return t


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _gap(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def _mismatch_parts(mm: dict[str, Any]) -> list[Any]:
    """The train/inference mismatch over the run (windows of steps) and by response position."""
    from rich.table import Table

    if not mm["windows"]:
        return [f"[bold]train/inference mismatch[/]: {mm['note']}"]
    t = Table(
        title=f"train/inference mismatch |log pi_prox - log pi_behav| on the tokens trained ({mm['node']}, "
        f"{mm['steps']} steps; fresh: sampled by the weights trained, stale: by older ones)",
        title_justify="left",
    )
    for col in (
        "steps",
        "fresh mean",
        "fresh max",
        "stale mean",
        "stale max",
        "stale % tokens",
        "k3 KL",
        "% > tis 2",
        "% outside mask [0.5, 2]",
        "% outside icepop [0.5, 5]",
        "% seqs outside geo [0.999, 1.001]",
    ):
        t.add_column(col, justify="right")
    for w in mm["windows"]:
        a, f, s = w["all"], w["fresh"], w["stale"]
        t.add_row(
            f"{w['first']}-{w['last']}",
            _gap(f["abs_mean"]),
            _gap(f["abs_max"]),
            _gap(s["abs_mean"]),
            _gap(s["abs_max"]),
            _pct(s["share"]),
            _gap(a["k3"]),
            _pct(a["past_tis"]),
            _pct(a["past_token_mask"]),
            _pct(a["past_icepop"]),
            _pct(a["past_seq_mask"]),
        )
    parts: list[Any] = [t]
    if mm["positions"]:
        p = Table(title="mean |gap| by position in the response (tokens generated before it)", title_justify="left")
        for bucket in mm["positions"]:
            p.add_column(bucket, justify="right")
        p.add_row(*(_gap(v) for v in mm["positions"].values()))
        parts.append(p)
    parts.append(f"  {mm['verdict']}")
    return parts
