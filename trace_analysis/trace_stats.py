"""Where the time went, from a timeline: busy and idle share per process, utilisation over time,
what bounded each training step, and each graph node's total time.

Why these numbers: an asynchronous run is worth it exactly when it removes idle time, so the
questions are "how much of the run was each process doing work?" and "what was each step
waiting for?". Definitions (the page and the text summary quote them):

- **busy**: the union of a process's own work spans: compute (step_split.is_compute: the
  engine's busy intervals, model forward/backward, reward scoring, nodes the controller
  computes itself), a worker's own housekeeping (category "worker": loading, publishing
  weights, checkpoints) and an inference server swapping weights (category "weights" on a
  process other than the controller). Calls in flight, requests queued and waits are not work.
- **in a span**: the union of every span drawn on the process (calls in flight included).
- **bounded by**: each `step` span is walked back from its end along the spans the controller
  recorded (categories controller, node, weights, eval: waiting for the batch, training-side
  node calls, weight sync): the latest-ending one before the current point is on the
  critical path. Waiting for the batch counts as "waiting for generation" when a
  generation-side call finished during the wait (else the batch was already buffered). The
  label with the most seconds bounded the step; stretches covered by no span are controller
  overhead.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from areal_graph.trace_analysis.step_split import is_compute, union_seconds
from areal_graph.trace_analysis.trace_model import Timeline, merge_intervals

Interval = tuple[float, float]
OVERHEAD = "controller overhead"
WEIGHT_SYNC = "weight sync"
WAIT_GENERATION = "waiting for generation"
WAIT_BUFFERED = "waiting (batch already buffered)"
CONTROLLER = "controller"
# what the controller records on a step's path: waits and housekeeping, node calls, weight sync, evaluation
CHAIN_CATEGORIES = frozenset({"controller", "node", "weights", "eval"})


def is_busy(span: dict[str, Any]) -> bool:
    """A span of work done by the process it is drawn on (see the module docstring)."""
    if is_compute(span):
        return True
    cat = span.get("cat")
    return cat == "worker" or (cat == "weights" and span.get("process") != CONTROLLER)


def busy_intervals(tl: Timeline) -> dict[str, list[Interval]]:
    """process -> its busy intervals in seconds (merged, sorted)."""
    out: dict[str, list[Interval]] = {p: [] for p in tl.processes}
    for s in tl.spans:
        if is_busy(s) and s["dur"] > 0:
            out.setdefault(s["process"], []).append((s["ts"] / 1e6, (s["ts"] + s["dur"]) / 1e6))
    return {p: merge_intervals(v) for p, v in out.items()}


def training_window(tl: Timeline) -> Interval | None:
    """(start, end) in seconds from the first step's start to the last step's end, or None without steps."""
    steps = [s for s in tl.spans if s["cat"] == "step"]
    if not steps:
        return None
    return (min(s["ts"] for s in steps) / 1e6, max(s["ts"] + s["dur"] for s in steps) / 1e6)


def _clipped(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def covered(tl: Timeline, intervals: list[Interval]) -> list[Interval]:
    """`intervals` (sorted, merged) within the time the trace covers (Timeline.windows): the part
    of a span outside it (a trace read in windows, a gap between a resumed run's parts) is not
    counted against a wall time that leaves it out."""
    spans = [(a / 1e6, b / 1e6) for a, b in merge_intervals(tl.windows)]
    out: list[Interval] = []
    for lo, hi in spans:
        out.extend(_clipped(intervals, lo, hi))
    return out


def process_shares(tl: Timeline) -> list[dict[str, Any]]:
    """Per process: busy seconds, busy share of the run and of the training steps, idle share, in-a-span share."""
    wall = tl.wall_s
    window = training_window(tl)
    busy = busy_intervals(tl)
    spans_of: dict[str, list[Interval]] = {}
    for s in tl.spans:
        spans_of.setdefault(s["process"], []).append((s["ts"] / 1e6, (s["ts"] + s["dur"]) / 1e6))
    rows = []
    for proc in tl.processes:
        ivs = covered(tl, busy.get(proc, []))
        row: dict[str, Any] = {
            "process": proc,
            "busy_s": union_seconds(ivs),
            "busy_share": union_seconds(ivs) / wall if wall > 0 else 0.0,
            "in_span_share": union_seconds(covered(tl, merge_intervals(spans_of.get(proc, [])))) / wall
            if wall > 0
            else 0.0,
            "busy_share_steps": None,
            "idle_share_steps": None,
        }
        steps_time = covered(tl, [window]) if window is not None else []  # the steps' time the trace holds
        if sum(b - a for a, b in steps_time) > 0:
            share = union_seconds(_clipped(ivs, *window)) / sum(b - a for a, b in steps_time)  # type: ignore[misc]
            row["busy_share_steps"], row["idle_share_steps"] = share, 1.0 - share
        rows.append(row)
    return rows


def utilisation(tl: Timeline, bins: int = 200) -> dict[str, Any]:
    """Busy share of every process in `bins` equal slices of the run: {"t_s": [...], "by_process": {p: [...]}}."""
    if bins <= 0:
        raise ValueError(f"utilisation: bins must be positive, got {bins}")
    t0, t1 = tl.start_us / 1e6, tl.end_us / 1e6
    width = (t1 - t0) / bins if t1 > t0 else 1.0
    series = {}
    for proc, ivs in busy_intervals(tl).items():
        cover = [0.0] * bins
        for a, b in ivs:
            first, last = int((a - t0) // width), min(int((b - t0) // width), bins - 1)
            for k in range(max(first, 0), last + 1):
                lo, hi = t0 + k * width, t0 + (k + 1) * width
                cover[k] += max(0.0, min(b, hi) - max(a, lo))
        series[proc] = [min(c / width, 1.0) for c in cover]
    return {"t_s": [(k + 0.5) * width for k in range(bins)], "bin_s": width, "by_process": series}


# ---------------------------------------------------------------------- critical path
def guess_sides(tl: Timeline) -> tuple[set[str], set[str]]:
    """(generation nodes, training nodes) from call counts, for a trace without its workflow.

    A training-side node is called once per step; the generation side once per prompt group,
    which is more often unless a step trains a single group. Prefer the plan (`graph.plan`)."""
    steps = sum(1 for s in tl.spans if s["cat"] == "step")
    calls = Counter(s["args"].get("node") for s in tl.spans if s["cat"] == "node" and s["args"].get("node"))
    training = {n for n, c in calls.items() if steps and c <= steps + 1}
    return set(calls) - training, training


def step_bounds(tl: Timeline, generation: Iterable[str], training: Iterable[str]) -> list[dict[str, Any]]:
    """Per step: wall seconds, seconds per critical-path label, and the label that bounded it."""
    gen, train = set(generation), set(training)
    chain = sorted(
        (
            s
            for s in tl.spans
            if _recorded_by_controller(s)
            and s["dur"] > 0
            and s["cat"] in CHAIN_CATEGORIES
            and (s["cat"] != "node" or s["args"].get("node") in train)
        ),
        key=lambda s: s["ts"],
    )
    starts = [s["ts"] for s in chain]
    gen_calls = sorted(
        (s for s in tl.spans if s["cat"] == "node" and s["args"].get("node") in gen), key=lambda s: s["ts"] + s["dur"]
    )
    gen_ends = [s["ts"] + s["dur"] for s in gen_calls]
    rows = []
    for step in (s for s in tl.spans if s["cat"] == "step"):
        lo, hi = step["ts"], step["ts"] + step["dur"]
        inside = [
            s
            for s in chain[bisect.bisect_left(starts, lo - 1) : bisect.bisect_right(starts, hi + 1)]
            if s["ts"] + s["dur"] <= hi + 1
        ]
        seconds = _walk_back(inside, lo, hi, gen_calls, gen_ends)
        wall = step["dur"] / 1e6
        bound = max(seconds, key=lambda label: seconds[label]) if seconds else OVERHEAD
        rows.append(
            {
                "step": step["args"].get("step"),
                "ts_us": lo,
                "wall_s": wall,
                "seconds": seconds,
                "bound_by": bound,
                "bound_share": seconds.get(bound, 0.0) / wall if wall > 0 else 0.0,
            }
        )
    return rows


def _recorded_by_controller(s: dict[str, Any]) -> bool:
    return s["args"].get("process", s["process"]) == CONTROLLER


def _walk_back(
    inside: list[dict[str, Any]], lo: float, hi: float, gen_calls: list[dict[str, Any]], gen_ends: list[float]
) -> dict[str, float]:
    """Seconds per label along the critical path of one step."""
    seconds: dict[str, float] = defaultdict(float)
    t = hi
    while t > lo:
        cands = [s for s in inside if s["ts"] + s["dur"] <= t + 1 and s["ts"] < t]
        if not cands:
            seconds[OVERHEAD] += (t - lo) / 1e6
            break
        best = max(cands, key=lambda s: (s["ts"] + s["dur"], -s["ts"]))
        end = min(best["ts"] + best["dur"], t)
        seconds[OVERHEAD] += max(t - end, 0.0) / 1e6
        seconds[_label(best, gen_calls, gen_ends)] += (end - max(best["ts"], lo)) / 1e6
        t = best["ts"]
    return {k: v for k, v in seconds.items() if v > 0}


def _label(s: dict[str, Any], gen_calls: list[dict[str, Any]], gen_ends: list[float]) -> str:
    if s["cat"] == "node":
        return f"{s['args'].get('node', s['name'])} on {s['process']}"
    if s["cat"] == "weights":
        return WEIGHT_SYNC
    if s["name"].startswith("wait"):
        # a generation-side call finished during the wait: the batch was completed by generation
        j = bisect.bisect_right(gen_ends, s["ts"] + s["dur"] + 1) - 1
        return WAIT_GENERATION if j >= 0 and gen_ends[j] >= s["ts"] - 1 else WAIT_BUFFERED
    return f"{s['name']} on {s['process']}"


def summarize_bounds(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many steps each label bounded, and its median share of those steps."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["bound_by"], []).append(r["bound_share"])
    return {
        "steps": len(rows),
        "bounded_by": [
            {"label": k, "steps": len(v), "median_share": statistics.median(v)}
            for k, v in sorted(by.items(), key=lambda kv: -len(kv[1]))
        ],
    }


# ---------------------------------------------------------------------- per graph node
def node_totals(tl: Timeline, nodes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per graph node: calls, total seconds of its calls, and busy share (the union of its calls over the run)."""
    wall = tl.wall_s
    calls: dict[str, list[Interval]] = {n: [] for n in nodes}
    for s in tl.spans:
        node = s["args"].get("node")
        if s["cat"] == "node" and node in calls:
            calls[node].append((s["ts"] / 1e6, (s["ts"] + s["dur"]) / 1e6))
    return {
        n: {
            "calls": len(v),
            "total_s": sum(b - a for a, b in v),
            "busy_share": union_seconds(covered(tl, merge_intervals(v))) / wall if wall > 0 else 0.0,
        }
        for n, v in calls.items()
    }
