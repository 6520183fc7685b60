"""`areal-graph trace RUN_DIR`: where did the time go? A table per span name, category, worker.

Reads the Chrome trace that every run writes (open the same file in chrome://tracing or
https://ui.perfetto.dev for the timeline) and sums it up: count, total, mean, p50, p95 and
share of the run's wall time (spans run concurrently, so shares can add up past 100%); then
the median training step split into compute per process and overhead (step_split.py).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

GROUPINGS = {"name": "span", "cat": "category", "worker": "worker", "node": "node"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trace",
        help="summarise where a run spent its time (per span, category, worker)",
        description=(
            "Summarise the trace of a run: for each span name, category and worker, the count, total, "
            "mean, median and 95th percentile duration and the share of the run's wall time. "
            "RUN_DIR is a run directory (its trace.json is read) or a trace file. For the timeline, "
            "open the same file in chrome://tracing or https://ui.perfetto.dev."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory or trace .json file")
    p.add_argument("--by", nargs="+", choices=sorted(GROUPINGS), default=["name", "cat", "worker"],
                   help="which tables to print (default: name cat worker)")
    p.add_argument("--top", type=int, default=25, help="rows per table, largest total first (default 25)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from areal_graph.runtime.observability.run_dir import TRACE_FILENAME
    from areal_graph.runtime.observability.step_split import step_split, summarize_steps
    from areal_graph.runtime.observability.tracing import complete_spans, load_trace

    console = Console()
    path = args.run_dir / TRACE_FILENAME if args.run_dir.is_dir() else args.run_dir
    if not path.exists():
        Console(stderr=True).print(f"[red]{path}: no trace file (is {args.run_dir} a run directory?)[/]")
        return 1
    try:
        spans = complete_spans(load_trace(path))
    except (ValueError, OSError) as err:
        Console(stderr=True).print(f"[red]{path}: cannot read the trace: {err}[/]")
        return 1
    if not spans:
        console.print(f"{path}: the trace holds no spans yet")
        return 0
    wall = _wall_seconds(spans)
    tables = {by: summarize(spans, by, wall) for by in args.by}
    steps = summarize_steps(step_split(spans))
    if args.json:
        console.print_json(json.dumps({"trace": str(path), "wall_s": wall, "spans": len(spans), "by": tables,
                                       "per_step": steps}))
        return 0
    console.print(f"[bold]{path}[/]: {len(spans)} spans over {wall:.2f} s of wall time")
    for by, rows in tables.items():
        console.print(_table(rows[: args.top], GROUPINGS[by], wall, len(rows)))
    if steps:
        console.print(_step_table(steps))
    return 0


def _step_table(s: dict[str, Any]):
    """The median training step: compute per process, their union, and what is left (overhead)."""
    from rich.table import Table

    t = Table(title=f"the median training step ({s['steps']} steps; compute = engine busy time, model "
                    "forward/backward, rewards, controller nodes)", title_justify="left")
    t.add_column("part")
    t.add_column("median", justify="right")
    t.add_column("% of step", justify="right")
    t.add_row("step (wall)", _fmt(s["wall_s"]), "100.0")
    for proc, sec in s["by_process_s"].items():
        t.add_row(f"  compute on {proc}", _fmt(sec), f"{100 * sec / s['wall_s']:.1f}")
    t.add_row("compute (union, overlaps once)", _fmt(s["compute_s"]), f"{100 * s['compute_s'] / s['wall_s']:.1f}")
    t.add_row("overhead (RPC, serialisation, bookkeeping, weight sync, waiting)", _fmt(s["overhead_s"]),
              f"{100 * s['overhead_share']:.1f}")
    return t


def summarize(spans: list[dict[str, Any]], by: str, wall_s: float) -> list[dict[str, Any]]:
    """Rows {key, count, total_s, mean_s, p50_s, p95_s, share}, largest total first."""
    groups: dict[str, list[float]] = {}
    for s in spans:
        groups.setdefault(_key(s, by), []).append(float(s.get("dur", 0.0)) / 1e6)
    rows = []
    for key, durs in groups.items():
        durs.sort()
        total = math.fsum(durs)
        rows.append({
            "key": key, "count": len(durs), "total_s": total, "mean_s": total / len(durs),
            "p50_s": _percentile(durs, 50), "p95_s": _percentile(durs, 95),
            "share": total / wall_s if wall_s > 0 else 0.0,
        })
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


def _wall_seconds(spans: list[dict[str, Any]]) -> float:
    start = min(float(s["ts"]) for s in spans)
    end = max(float(s["ts"]) + float(s.get("dur", 0.0)) for s in spans)
    return (end - start) / 1e6


def _table(rows: list[dict[str, Any]], title: str, wall: float, n_all: int):
    from rich.table import Table

    t = Table(title=f"time per {title}" + (f" (top {len(rows)} of {n_all})" if len(rows) < n_all else ""),
              title_justify="left")
    t.add_column(title)
    for col in ("count", "total", "mean", "p50", "p95", "% wall"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["key"], str(r["count"]), _fmt(r["total_s"]), _fmt(r["mean_s"]), _fmt(r["p50_s"]),
                  _fmt(r["p95_s"]), f"{100 * r['share']:.1f}")
    return t


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"
