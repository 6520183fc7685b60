"""A run's timeline as the compact JSON the page's script draws from.

Why compact and columnar: a 200-step run has ~13k spans and a long one hundreds of
thousands; the page must load from one file and stay responsive. Spans travel as parallel
arrays (start, duration, row, name, colour, args), with names and args interned, times in
milliseconds from the run's start. Past `span_budget` spans, short spans that sit close
together on one row are merged into "N spans" blocks (the shortest first, until the budget
holds): the page says how many were merged and from which duration down. Flow arrows past
`flow_budget` are thinned evenly, and the page says so too.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from areal_graph.trace_analysis.speculation_summary import speculation_counters
from areal_graph.trace_analysis.trace_run import RunMaterial

_LANE_RE = re.compile(r"^(.*) #(\d+)$")
BOUND_TRACK = "step bounded by"
BOUND_CAT = "bound"  # category of the synthetic spans on that track
SPARSE_ROW_SPANS = 500  # rows with at most this many spans are never merged

# Fill colours: node kinds (a span of a graph node) first, then span categories.
KIND_COLOURS = {
    "rollout": "#3b82f6",
    "reward": "#f59e0b",
    "logprob": "#6366f1",
    "value": "#ec4899",
    "advantage": "#16a34a",
    "train": "#dc2626",
    "function": "#0d9488",
}
CATEGORY_COLOURS = {
    "compute": "#0ea5e9",
    "request": "#93c5fd",
    "weights": "#a855f7",
    "step": "#9ca3af",
    "controller": "#64748b",
    "worker": "#a8a29e",
    "eval": "#84cc16",
    "rollout": "#60a5fa",
    "node": "#38bdf8",
}
EXTRA_COLOURS = [
    "#f472b6",
    "#fb923c",
    "#facc15",
    "#4ade80",
    "#2dd4bf",
    "#818cf8",
    "#c084fc",
    "#e879f9",
    "#94a3b8",
    "#fda4af",
]


@dataclass(frozen=True)
class PageOptions:
    """What the page may hold; checked here because it comes from the command line."""

    span_budget: int = 50_000
    flow_budget: int = 20_000

    def __post_init__(self) -> None:
        for name in ("span_budget", "flow_budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 100:
                raise ValueError(f"PageOptions.{name} must be an integer >= 100, got {value!r}")


class _Interner:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[str, int] = {}

    def add(self, item: Any) -> int:
        key = item if isinstance(item, str) else json.dumps(item, sort_keys=True, default=str)
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = len(self.items)
            self.items.append(item)
        return idx


def run_payload(run: RunMaterial, summary: dict[str, Any], options: PageOptions) -> dict[str, Any]:
    tl = run.timeline
    t0 = tl.start_us
    kinds = {n.name: n.kind for n in run.spec.nodes.values()} if run.spec is not None else {}
    spans = list(tl.spans) + _bound_spans(summary)
    tracks, row_of = _rows(spans, tl.processes, _extra_places(run))
    kept, merged_from, agg = _aggregate(spans, row_of, options.span_budget)
    names, args, colours = _Interner(), _Interner(), _Interner()
    cols: dict[str, list[Any]] = {k: [] for k in ("t", "d", "r", "n", "c", "a", "k", "f")}
    for s in kept:
        cols["t"].append(round((s["ts"] - t0) / 1e3, 3))
        cols["d"].append(round(s["dur"] / 1e3, 3))
        cols["r"].append(row_of[_row_key(s)])
        cols["n"].append(names.add(s["name"]))
        cols["c"].append(colours.add(_colour_key(s, kinds)))
        cols["a"].append(args.add(_finite(s["args"])))
        node = s["args"].get("node")
        cols["k"].append(names.add(str(node)) if node in kinds else -1)
        cols["f"].append((1 if s.get("open") else 0) | (2 if s.get("aggregated") else 0))
    flows, flows_total = _flows(run, row_of, merged_from, t0, options.flow_budget)
    first_step = next((s["ts"] for s in tl.spans if s["cat"] == "step"), None)
    return {
        "label": run.label,
        "duration_ms": round((tl.end_us - t0) / 1e3, 3),
        "first_step_ms": round((first_step - t0) / 1e3, 3) if first_step is not None else 0.0,
        "tracks": tracks,
        "spans": cols,
        "names": names.items,
        "args": args.items,
        "colours": [{"key": k, "colour": _colour(k)} for k in colours.items],
        "flows": flows,
        "flows_total": flows_total,
        "instants": _instants(run, row_of, t0, names, args),
        "counters": _counters(run, row_of, t0),
        "aggregation": agg,
        "spans_total": len(spans),
    }


def _finite(obj: Any) -> Any:
    """JSON the browser can parse: NaN and infinities (which Python's json writes) become strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------------- rows
def _row_key(s: dict[str, Any]) -> tuple[str, str, int, int]:
    return (s["process"], s["track"], s["lane"], s["depth"])


def _rows(
    spans: list[dict[str, Any]], processes: list[str], extra: list[tuple[str, str, int, float]]
) -> tuple[list[dict[str, Any]], dict[tuple, int]]:
    """Tracks (process, track) in display order, each with its rows (lane, depth), and global row numbers.

    `extra` (process, track, lane, ts) are places that need a row without a span: the ends of
    flow arrows and instants on threads that hold no span, counters."""
    first: dict[tuple[str, str], float] = {}
    rows_of: dict[tuple[str, str], set[tuple[int, int]]] = {}
    places = [(s["process"], s["track"], s["lane"], s["depth"], s["ts"]) for s in spans]
    places += [(p, t, lane, 0, ts) for p, t, lane, ts in extra]
    for process, track, lane, depth, ts in places:
        key = (process, track)
        first[key] = min(first.get(key, ts), ts)
        rows_of.setdefault(key, set()).add((lane, depth))
    order = {p: i for i, p in enumerate(processes)}
    priority = {"step": 0, BOUND_TRACK: 1}
    keys = sorted(first, key=lambda k: (order.get(k[0], len(order)), k[0], priority.get(k[1], 2), first[k]))
    tracks: list[dict[str, Any]] = []
    row_of: dict[tuple, int] = {}
    for process, track in keys:
        lanes = sorted(rows_of[(process, track)])
        tracks.append({"process": process, "name": track, "row0": len(row_of), "rows": len(lanes)})
        for lane, depth in lanes:
            row_of[(process, track, lane, depth)] = len(row_of)
    return tracks, row_of


def _place(process: str, thread: str) -> tuple[str, str, int]:
    m = _LANE_RE.match(thread)
    return (process, m.group(1), int(m.group(2)) - 1) if m else (process, thread, 0)


def _extra_places(run: RunMaterial) -> list[tuple[str, str, int, float]]:
    tl = run.timeline
    out = [(*_place(p.process, p.thread), p.ts) for f in tl.flows for p in f.points if p.span is None]
    out += [(*_place(e["process"], e["thread"]), e["ts"]) for e in tl.instants if e["scope"] not in ("g", "p")]
    out += [(c["process"], f"{c['name']} (counter)", 0, c["ts"]) for c in _all_counters(tl)]
    return out


def _all_counters(tl: Any) -> list[dict[str, Any]]:
    """The trace's counters and those the page derives: speculative decoding's, per server."""
    return [*tl.counters, *speculation_counters(tl)]


def _bound_spans(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One span per step on a track of its own, named by what bounded it (trace_stats.step_bounds)."""
    out = []
    for r in summary["critical_path"]["per_step"]:
        secs = {k: round(v * 1e3, 2) for k, v in sorted(r["seconds"].items(), key=lambda kv: -kv[1])}
        out.append(
            {
                "name": r["bound_by"],
                "cat": BOUND_CAT,
                "ts": r["ts_us"],
                "dur": r["wall_s"] * 1e6,
                "args": {"step": r["step"], "bound_share": round(r["bound_share"], 3), "ms_by_part": secs},
                "process": "controller",
                "track": BOUND_TRACK,
                "lane": 0,
                "depth": 0,
                "open": False,
            }
        )
    return out


# ---------------------------------------------------------------------- colours
def _colour_key(s: dict[str, Any], kinds: dict[str, str]) -> str:
    if s["cat"] == BOUND_CAT:
        return f"bound:{s['name']}"
    node = s["args"].get("node")
    if node in kinds:
        return f"kind:{kinds[node]}"
    return f"cat:{s['cat'] or '-'}"


def _colour(key: str) -> str:
    group, _, name = key.partition(":")
    if group == "kind" and name in KIND_COLOURS:
        return KIND_COLOURS[name]
    if group == "cat" and name in CATEGORY_COLOURS:
        return CATEGORY_COLOURS[name]
    if group == "bound":
        if name.startswith("waiting for generation"):
            return KIND_COLOURS["rollout"]
        if name.startswith("waiting"):
            return "#cbd5e1"
        if name == "weight sync":
            return CATEGORY_COLOURS["weights"]
        if name == "controller overhead":
            return "#475569"
    return EXTRA_COLOURS[sum(map(ord, key)) % len(EXTRA_COLOURS)]


# ---------------------------------------------------------------------- budget
def _aggregate(
    spans: list[dict[str, Any]], row_of: dict[tuple, int], budget: int
) -> tuple[list[dict[str, Any]], dict[int, int], dict[str, Any]]:
    """(spans to draw, original index -> index of the block it went into, what was done)."""
    if len(spans) <= budget:
        return spans, {}, {"applied": False, "budget": budget}
    by_row: dict[int, list[int]] = {}
    for i, s in enumerate(spans):
        by_row.setdefault(row_of[_row_key(s)], []).append(i)
    # sparse rows cost little and the "bounded by" row must keep one span per step: never merged
    kept_rows = [r for r, idxs in by_row.items() if len(idxs) <= SPARSE_ROW_SPANS or spans[idxs[0]]["cat"] == BOUND_CAT]
    fixed = [i for r in kept_rows for i in by_row.pop(r)]
    arrays = []
    for idxs in by_row.values():
        idxs.sort(key=lambda i: spans[i]["ts"])
        ts = np.fromiter((spans[i]["ts"] for i in idxs), dtype=np.float64, count=len(idxs))
        dur = np.fromiter((spans[i]["dur"] for i in idxs), dtype=np.float64, count=len(idxs))
        arrays.append((ts, dur, np.maximum.accumulate(ts + dur)))
    extent = max(s["ts"] + s["dur"] for s in spans) - min(s["ts"] for s in spans)
    quantum = max(extent / 100_000, 1.0)
    room = budget - len(fixed)
    while _count_after_merging(arrays, quantum) > room and quantum <= extent:
        quantum *= 2  # counted with numpy; the merge itself runs once (twice if the count was short)
    kept, into = _merge_short(spans, by_row, quantum, fixed)
    while len(kept) > budget and quantum <= extent:
        quantum *= 2
        kept, into = _merge_short(spans, by_row, quantum, fixed)
    merged = sum(s.get("aggregated", 0) for s in kept)
    return (
        kept,
        into,
        {
            "applied": True,
            "budget": budget,
            "quantum_ms": round(quantum / 1e3, 3),
            "spans_in": len(spans),
            "spans_out": len(kept),
            "merged": merged,
        },
    )


def _count_after_merging(arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]], quantum: float) -> int:
    """How many spans `_merge_short` would leave: a short span joins the short one before it when
    the gap from the row's end so far is at most `quantum`."""
    total = 0
    for ts, dur, ends in arrays:
        short = dur < quantum
        joins = short[1:] & short[:-1] & (ts[1:] - ends[:-1] <= quantum)
        total += len(ts) - int(joins.sum())
    return total


def _merge_short(
    spans: list[dict[str, Any]], by_row: dict[int, list[int]], quantum: float, fixed: list[int]
) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Per row, runs of spans shorter than `quantum` with gaps under `quantum` become one block;
    the spans in `fixed` are kept as they are."""
    kept: list[dict[str, Any]] = [spans[i] for i in fixed]
    into: dict[int, int] = {i: k for k, i in enumerate(fixed)}

    def close(run: list[int]) -> None:
        if len(run) > 1:
            kept.append(_block([spans[i] for i in run]))
        elif run:
            kept.append(spans[run[0]])
        for i in run:
            into[i] = len(kept) - 1

    for idxs in by_row.values():
        run: list[int] = []
        run_end = float("-inf")
        for i in idxs:
            s = spans[i]
            end = s["ts"] + s["dur"]
            if s["dur"] >= quantum or s["ts"] - run_end > quantum:
                close(run)
                run, run_end = [], float("-inf")
            if s["dur"] >= quantum:
                close([i])
                continue
            run.append(i)
            run_end = max(run_end, end)
        close(run)
    order = sorted(range(len(kept)), key=lambda k: kept[k]["ts"])
    new_pos = {old: new for new, old in enumerate(order)}
    return [kept[k] for k in order], {i: new_pos[k] for i, k in into.items()}


def _block(members: list[dict[str, Any]]) -> dict[str, Any]:
    start = min(s["ts"] for s in members)
    end = max(s["ts"] + s["dur"] for s in members)
    names = Counter(s["name"] for s in members)
    first = members[0]
    return {
        **first,
        "name": f"{len(members)} spans",
        "ts": start,
        "dur": end - start,
        "aggregated": len(members),
        "open": any(s.get("open") for s in members),
        "args": {
            "merged_spans": len(members),
            "busy_ms": round(sum(s["dur"] for s in members) / 1e3, 3),
            "names": dict(names.most_common(5)),
            "node": first["args"].get("node"),
        },
    }


# ---------------------------------------------------------------------- flows and instants
def _flows(
    run: RunMaterial, row_of: dict[tuple, int], merged_from: dict[int, int], t0: float, budget: int
) -> tuple[list[list[float]], int]:
    """Arrow segments [t0_ms, row0, t1_ms, row1, span0, span1] (span -1 when unbound), evenly thinned to budget."""
    tl = run.timeline
    segments: list[list[float]] = []
    for flow in tl.flows:
        ends = [e for p in flow.points if (e := _flow_end(p, tl, row_of, merged_from, t0)) is not None]
        for a, b in zip(ends, ends[1:]):
            segments.append([a[0], a[1], b[0], b[1], a[2], b[2]])
    total = len(segments)
    if total > budget:
        step = total / budget
        segments = [segments[int(k * step)] for k in range(budget)]
    return segments, total


def _flow_end(
    p: Any, tl: Any, row_of: dict[tuple, int], merged_from: dict[int, int], t0: float
) -> tuple[float, int, int] | None:
    if p.span is not None:
        s = tl.spans[p.span]
        return (round((p.ts - t0) / 1e3, 3), row_of[_row_key(s)], merged_from.get(p.span, p.span))
    row = row_of.get((*_place(p.process, p.thread), 0))
    return None if row is None else (round((p.ts - t0) / 1e3, 3), row, -1)


def _instants(
    run: RunMaterial, row_of: dict[tuple, int], t0: float, names: _Interner, args: _Interner
) -> list[list[Any]]:
    """[t_ms, row (-1: the whole run), name, args] per instant event."""
    out = []
    for e in run.timeline.instants:
        row = -1 if e["scope"] in ("g", "p") else row_of.get((*_place(e["process"], e["thread"]), 0), -1)
        out.append([round((e["ts"] - t0) / 1e3, 3), row, names.add(e["name"]), args.add(_finite(e["args"]))])
    return out


def _counters(run: RunMaterial, row_of: dict[tuple, int], t0: float) -> list[dict[str, Any]]:
    """One entry per counter track: its row and {series: [[t_ms, value], ...]}."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for c in _all_counters(run.timeline):
        key = (c["process"], f"{c['name']} (counter)")
        entry = out.setdefault(key, {"row": row_of[(*key, 0, 0)], "name": c["name"], "series": {}})
        for k, v in c["values"].items():
            if math.isfinite(v):
                entry["series"].setdefault(k, []).append([round((c["ts"] - t0) / 1e3, 3), v])
    return list(out.values())
