"""Where each training step's wall time went: compute per process, and the rest (overhead).

A step (the controller's `step` span: from waiting for its batch to the new weights being
served) is split by the *compute* spans that fall inside it:

- the inference engine's busy intervals (`engine`, category "compute", from each server);
- node calls on worker processes that do the work themselves (the model host's forward and
  backward, reward scoring: worker spans of category "compute");
- node calls the controller runs itself (the advantage math, function nodes).

The union of those intervals is the step's compute time; everything else (RPC, (de)
serialisation, bookkeeping, weight sync, waiting on nothing) is overhead. Intervals of
different processes overlap in an asynchronous run, so each process's share is reported on
its own and the union once. Pure functions over the spans of a Chrome trace
(`tracing.complete_spans`); `areal-graph trace` prints the result.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

Interval = tuple[float, float]
LONG_S = 10.0  # compute intervals longer than this are checked against every step


def is_compute(span: dict[str, Any]) -> bool:
    if span.get("cat") == "compute":
        return True
    args = span.get("args") or {}
    return span.get("cat") == "node" and args.get("worker") == "controller"


def union_seconds(intervals: Iterable[Interval]) -> float:
    """Total length covered by `intervals` (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _clip(iv: Interval, lo: float, hi: float) -> Interval | None:
    a, b = max(iv[0], lo), min(iv[1], hi)
    return (a, b) if b > a else None


def _group(span: dict[str, Any]) -> str:
    """The process a compute span counts for ('controller' for its own nodes)."""
    proc = str(span.get("process") or "?")
    return "controller" if span.get("cat") == "node" else proc


def step_split(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step span: wall seconds, compute union, overhead, and compute per process."""
    compute = sorted(
        (
            (_group(s), (float(s["ts"]) / 1e6, (float(s["ts"]) + float(s.get("dur", 0))) / 1e6))
            for s in spans
            if is_compute(s)
        ),
        key=lambda gc: gc[1][0],
    )
    # Each step looks only at intervals that start within LONG_S before it (found by bisection),
    # plus the few longer ones: linear in the trace, not steps x spans.
    short = [gc for gc in compute if gc[1][1] - gc[1][0] <= LONG_S]
    long = [gc for gc in compute if gc[1][1] - gc[1][0] > LONG_S]
    starts = [gc[1][0] for gc in short]
    rows = []
    for s in sorted((s for s in spans if s.get("cat") == "step"), key=lambda s: float(s["ts"])):
        lo, hi = float(s["ts"]) / 1e6, (float(s["ts"]) + float(s.get("dur", 0))) / 1e6
        near = short[bisect.bisect_left(starts, lo - LONG_S) : bisect.bisect_right(starts, hi)] + long
        inside = [(g, c) for g, iv in near if (c := _clip(iv, lo, hi)) is not None]
        per: dict[str, list[Interval]] = {}
        for g, c in inside:
            per.setdefault(g, []).append(c)
        busy = union_seconds(c for _, c in inside)
        wall = hi - lo
        rows.append(
            {
                "step": (s.get("args") or {}).get("step"),
                "wall_s": wall,
                "compute_s": busy,
                "overhead_s": wall - busy,
                "overhead_share": (wall - busy) / wall if wall > 0 else 0.0,
                "by_process": {g: union_seconds(v) for g, v in sorted(per.items())},
            }
        )
    return rows


def summarize_steps(rows: list[dict[str, Any]], skip_first: int = 3) -> dict[str, Any]:
    """The median step: the step of median wall time (the lower one of an even count), whole,
    so its parts add up (a median per part would not: 100% compute beside 3% overhead). The
    first few steps (warm-up) are skipped when there are enough; a step redone after a resume
    counts once, as its last run. `overhead_share_all_steps` is the overhead of all those
    steps over their wall time."""
    latest: dict[Any, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        latest[row["step"] if row.get("step") is not None else ("row", i)] = row
    kept = list(latest.values())
    use = kept[skip_first:] if len(kept) > 2 * skip_first else kept
    if not use:
        return {}
    median = sorted(use, key=lambda r: r["wall_s"])[(len(use) - 1) // 2]
    return {
        "steps": len(use),
        "step": median.get("step"),
        "wall_s": median["wall_s"],
        "compute_s": median["compute_s"],
        "overhead_s": median["overhead_s"],
        "overhead_share": median["overhead_s"] / median["wall_s"] if median["wall_s"] > 0 else 0.0,
        "by_process_s": dict(sorted(median["by_process"].items())),
        "overhead_share_all_steps": sum(r["overhead_s"] for r in use) / max(sum(r["wall_s"] for r in use), 1e-12),
    }
