"""A run's trace as one timeline: spans, flows, instants and counters, named and merged across parts.

Why a model between the file and the pictures: the text summary, the PNGs and the HTML page
all need the same things (which process and which track a span belongs to, where a flow
arrow starts and ends, what was lost), and all of them must cope with damaged input. This
module turns standard Chrome trace events into that, from any number of files read in order:

- complete spans ("X") and begin/end pairs ("B"/"E"); a "B" never ended (a process killed
  mid-span) becomes a span up to the end of its file, marked `open`;
- flow events ("s"/"t"/"f", matched by id) bound to the span they point into (enclosing
  slice, or the next slice for an "f" without `"bp": "e"`);
- instant ("i"/"I") and counter ("C") events; metadata ("M") naming processes and threads.

Processes and threads are identified by *name*, so parts written by different tracers (each
numbering its own pids) merge, and a file that lost its metadata tail gets its names back
from the span args (`worker`/`process`, `node`/category: the rule runtime/observability/tracing.py
lays tracks out by). Thread names "requests #3" are lane 3 of track "requests".
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from areal_graph.trace_analysis.trace_read import TraceFile
from areal_graph.trace_analysis.trace_windows import DEFAULT_READ_MB, read_trace_parts

_LANE_RE = re.compile(r"^(.*) #(\d+)$")
PROFILE_CATEGORY = "profile"
INSTANT_PHASES = ("i", "I", "R")
FLOW_PHASES = ("s", "t", "f")
_FLOW_ORDER = {"s": 0, "t": 1, "f": 2}
_NAMING_PHASES = ("X", "B", "E", *INSTANT_PHASES)  # events whose args/category name their process and thread


@dataclass
class FlowPoint:
    ts: float  # microseconds
    process: str
    thread: str
    span: int | None  # index into Timeline.spans of the span it binds to, None when none does


@dataclass
class Flow:
    id: str
    name: str
    cat: str
    points: list[FlowPoint]


@dataclass
class Timeline:
    """Everything drawable from a run's trace files, times in microseconds (wall clock)."""

    spans: list[dict[str, Any]]
    flows: list[Flow] = field(default_factory=list)
    instants: list[dict[str, Any]] = field(default_factory=list)
    counters: list[dict[str, Any]] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    files: list[TraceFile] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each file
    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    # measurement records, not work drawn on a timeline (category "profile": the engine's step log,
    # CPU seconds per process): the performance model reads them (perfmodel/costs.py), views do not
    profiles: list[dict[str, Any]] = field(default_factory=list)

    @property
    def start_us(self) -> float:
        return min((w[0] for w in self.windows), default=0.0)

    @property
    def end_us(self) -> float:
        return max((w[1] for w in self.windows), default=0.0)

    @property
    def wall_s(self) -> float:
        """Seconds covered by the trace's files (a gap between parts of a resumed run not counted)."""
        return sum(b - a for a, b in merge_intervals(self.windows)) / 1e6


def load_timeline(run: str | os.PathLike, max_read_bytes: int = DEFAULT_READ_MB * 2**20) -> Timeline:
    """The timeline of a run directory (all its trace parts, oldest first) or of one trace file,
    read in bounded memory: past `max_read_bytes`, in windows (trace_windows.py, which says so)."""
    parts, notes = read_trace_parts(run, max_read_bytes)
    tl = build_timeline(parts)
    tl.notes[:0] = notes
    return tl


def build_timeline(files: Iterable[TraceFile]) -> Timeline:
    tl = Timeline(spans=[])
    seen_procs: dict[str, None] = {}
    raw_flows: dict[str, list[tuple[dict[str, Any], str, str]]] = {}
    for part, tf in enumerate(files):
        tl.files.append(tf)
        tl.notes.extend(tf.notes)
        _add_part(tl, part, tf.events, seen_procs, raw_flows, trimmed=tf.window is not None)
    tl.spans.sort(key=lambda s: (s["ts"], -s["dur"]))
    for i, s in enumerate(tl.spans):
        s["index"] = i
    _assign_depths(tl.spans)
    tl.flows = _bind_flows(tl.spans, raw_flows)
    tl.processes = list(seen_procs)
    tl.notes.extend(_notes(tl))
    return tl


# ---------------------------------------------------------------------- one file
def _add_part(
    tl: Timeline,
    part: int,
    events: list[dict[str, Any]],
    seen_procs: dict[str, None],
    raw_flows: dict[str, list[tuple[dict[str, Any], str, str]]],
    trimmed: bool = False,
) -> None:
    events = [e for e in events if _well_formed(e, tl.counts)]
    pname, tname = _names(events, tl.counts)
    for pid in sorted(pname, key=lambda p: _sort_key(events, p)):
        seen_procs.setdefault(pname[pid], None)
    timed = [e for e in events if e["ph"] != "M"]
    t_end = max((float(e["ts"]) + float(e.get("dur") or 0) for e in timed), default=0.0)
    t_start = min((float(e["ts"]) for e in timed), default=t_end)
    if timed and trimmed:  # a window of a file: the time it covers is where its spans start, not
        # where a long span that began long before (an evaluation, a slow request) started
        starts = sorted(float(e["ts"]) for e in timed)
        t_start, t_end = starts[len(starts) // 100], starts[-1 - len(starts) // 100]
    if timed:
        tl.windows.append((t_start, t_end))
    open_b: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        ph = e.get("ph")
        where = (pname.get(e.get("pid"), f"pid {e.get('pid')}"), tname.get((e.get("pid"), e.get("tid")), "main"))
        if ph == "X" and e.get("cat") == PROFILE_CATEGORY:
            tl.profiles.append(_span(e, float(e.get("dur") or 0), where, part))
        elif ph == "X":
            tl.spans.append(_span(e, float(e.get("dur") or 0), where, part))
        elif ph == "B":
            open_b.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif ph == "E":
            stack = open_b.get((e.get("pid"), e.get("tid")))
            if not stack:
                tl.counts["unmatched_end"] += 1
                continue
            b = stack.pop()
            span = _span(b, float(e["ts"]) - float(b["ts"]), where, part)
            span["args"].update(e.get("args") or {})
            tl.spans.append(span)
        elif ph in FLOW_PHASES:
            fid = f"{part}:{e.get('id', e.get('id2', e.get('bind_id')))}"
            raw_flows.setdefault(fid, []).append((e, *where))
        elif ph in INSTANT_PHASES:
            tl.instants.append(
                {
                    "ts": float(e["ts"]),
                    "name": str(e.get("name", "?")),
                    "cat": str(e.get("cat") or ""),
                    "scope": e.get("s", "t"),
                    "process": where[0],
                    "thread": where[1],
                    "args": dict(e.get("args") or {}),
                }
            )
        elif ph == "C":
            values = {k: float(v) for k, v in (e.get("args") or {}).items() if isinstance(v, (int, float))}
            name = str(e.get("name", "counter")) + (f" {e['id']}" if "id" in e else "")
            tl.counters.append({"ts": float(e["ts"]), "name": name, "process": where[0], "values": values})
        elif ph != "M":
            tl.counts[f"phase {ph}"] += 1
    for (pid, tid), stack in open_b.items():
        for b in stack:  # begun, never ended: the process died (or the file was cut) inside it
            span = _span(b, t_end - float(b["ts"]), (pname.get(pid, f"pid {pid}"), tname.get((pid, tid), "main")), part)
            span["open"] = True
            span["args"]["unterminated"] = True
            tl.spans.append(span)
            tl.counts["unterminated"] += 1


def _well_formed(e: dict[str, Any], counts: Counter) -> bool:
    ph = e.get("ph")
    if not isinstance(ph, str):
        counts["malformed"] += 1
        return False
    if ph == "M":
        return True
    ts, dur = e.get("ts"), e.get("dur", 0)
    ok = isinstance(ts, (int, float)) and isinstance(dur, (int, float, type(None)))
    if not ok:
        counts["malformed"] += 1
    return ok


def _sort_key(events: list[dict[str, Any]], pid: Any) -> tuple[float, str]:
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_sort_index" and e.get("pid") == pid:
            return (float((e.get("args") or {}).get("sort_index", 0)), str(pid))
    return (float(pid) if isinstance(pid, (int, float)) else 1e18, str(pid))


def _names(events: list[dict[str, Any]], counts: Counter) -> tuple[dict[Any, str], dict[tuple[Any, Any], str]]:
    """pid -> process name, (pid, tid) -> thread name; from metadata, else recovered from span args."""
    pname: dict[Any, str] = {}
    tname: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") != "M":
            continue
        name = (e.get("args") or {}).get("name")
        if e.get("name") == "process_name" and name is not None:
            pname[e.get("pid")] = str(name)
        elif e.get("name") == "thread_name" and name is not None:
            tname[(e.get("pid"), e.get("tid"))] = str(name)
    by_pid: dict[Any, Counter] = {}
    by_tid: dict[tuple[Any, Any], Counter] = {}
    for e in events:
        if e.get("ph") not in _NAMING_PHASES:  # flow and counter events carry no names of their own
            continue
        args = e.get("args") or {}
        by_pid.setdefault(e.get("pid"), Counter())[
            str(args.get("worker") or args.get("process") or f"pid {e.get('pid')}")
        ] += 1
        by_tid.setdefault((e.get("pid"), e.get("tid")), Counter())[str(args.get("node") or e.get("cat") or "main")] += 1
    for pid, votes in by_pid.items():
        if pid not in pname:
            pname[pid] = votes.most_common(1)[0][0]
            counts["recovered_process_names"] += 1
    lanes: Counter = Counter()
    for key in sorted(by_tid, key=lambda k: str(k[1]).zfill(12)):
        if key in tname:
            continue
        base = by_tid[key].most_common(1)[0][0]
        lanes[(key[0], base)] += 1
        n = lanes[(key[0], base)]
        tname[key] = base if n == 1 else f"{base} #{n}"
        counts["recovered_thread_names"] += 1
    return pname, tname


def _span(e: dict[str, Any], dur: float, where: tuple[str, str], part: int) -> dict[str, Any]:
    process, thread = where
    m = _LANE_RE.match(thread)
    track, lane = (m.group(1), int(m.group(2)) - 1) if m else (thread, 0)
    args = dict(e.get("args") or {})
    return {
        "name": str(e.get("name", "?")),
        "cat": str(e.get("cat") or ""),
        "ph": "X",
        "ts": float(e["ts"]),
        "dur": max(dur, 0.0),
        "pid": e.get("pid"),
        "tid": e.get("tid"),
        "args": args,
        "process": process,
        "thread": thread,
        "track": track,
        "lane": lane,
        "depth": 0,
        "part": part,
        "open": False,
    }


# ---------------------------------------------------------------------- across files
def _assign_depths(spans: list[dict[str, Any]]) -> None:
    """Nesting depth of spans on one thread (Chrome stacks properly nested spans)."""
    stacks: dict[tuple[str, str], list[float]] = {}
    for s in spans:  # sorted by start, longest first
        stack = stacks.setdefault((s["process"], s["thread"]), [])
        end = s["ts"] + s["dur"]
        while stack and stack[-1] <= s["ts"]:
            stack.pop()
        s["depth"] = len(stack)
        stack.append(end)


def _bind_flows(spans: list[dict[str, Any]], raw: dict[str, list[tuple[dict[str, Any], str, str]]]) -> list[Flow]:
    by_thread: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in spans:
        by_thread.setdefault((s["process"], s["thread"]), []).append(s)
    starts = {k: [s["ts"] for s in v] for k, v in by_thread.items()}
    flows = []
    for fid, points in raw.items():
        points.sort(key=lambda p: (_FLOW_ORDER[p[0]["ph"]], float(p[0]["ts"])))
        first = points[0][0]
        out = []
        for e, process, thread in points:
            ts = float(e["ts"])
            key = (process, thread)
            idx = _bound_span(
                by_thread.get(key, []), starts.get(key, []), ts, next_slice=e["ph"] == "f" and e.get("bp") != "e"
            )
            out.append(FlowPoint(ts, process, thread, idx))
        flows.append(Flow(fid.split(":", 1)[1], str(first.get("name", "")), str(first.get("cat") or ""), out))
    flows.sort(key=lambda f: f.points[0].ts)
    return flows


def _bound_span(thread_spans: list[dict[str, Any]], starts: list[float], ts: float, next_slice: bool) -> int | None:
    """The span a flow point binds to: the next slice from ts, or the innermost slice enclosing ts."""
    if next_slice:
        j = bisect.bisect_left(starts, ts)
        if j < len(thread_spans):
            return thread_spans[j]["index"]
    j = bisect.bisect_right(starts, ts) - 1
    best = None
    for k in range(j, max(j - 256, -1), -1):  # look back a bounded way for an enclosing span
        s = thread_spans[k]
        if s["ts"] <= ts <= s["ts"] + s["dur"] and (best is None or s["depth"] > best["depth"]):
            best = s
    return best["index"] if best is not None else None


def merge_intervals(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping intervals covering exactly what `windows` cover."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(windows):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _notes(tl: Timeline) -> list[str]:
    """What is missing or odd, in words (the file-level damage notes come from trace_read)."""
    c, notes = tl.counts, []
    if c["unterminated"]:
        notes.append(
            f"{c['unterminated']} spans were begun and never ended (a process stopped inside them): "
            "drawn up to the end of their file and marked unterminated"
        )
    if c["unmatched_end"]:
        notes.append(f"{c['unmatched_end']} end events without a matching begin skipped")
    if c["recovered_process_names"] or c["recovered_thread_names"]:
        notes.append(
            f"process/thread names missing from the file (its metadata tail was lost): "
            f"{c['recovered_process_names']} process and {c['recovered_thread_names']} thread names "
            "recovered from the span args"
        )
    if c["malformed"]:
        notes.append(f"{c['malformed']} events without a phase or a numeric timestamp skipped")
    for key in sorted(k for k in c if k.startswith("phase ")):
        notes.append(f"{c[key]} events of {key} (not drawn)")
    errors = [s for s in tl.spans if "error" in s["args"]]
    if errors:
        t0, kinds = tl.start_us, Counter(str(s["args"]["error"]) for s in errors)
        firsts: dict[str, dict[str, Any]] = {}
        for s in errors:
            firsts.setdefault(str(s["args"]["error"]), s)
        shown = "; ".join(
            f"{kind} x{n} (first: {firsts[kind]['name']} on {firsts[kind]['process']} at "
            f"{(firsts[kind]['ts'] - t0) / 1e6:.2f} s)"
            for kind, n in kinds.most_common()
        )
        notes.append(f"{len(errors)} spans ended in an error: {shown}")
    unbound = sum(1 for f in tl.flows for p in f.points if p.span is None)
    if unbound:
        notes.append(f"{unbound} flow-event ends point at no span (drawn at their own time and thread)")
    if len(tl.windows) > 1:
        names = list(dict.fromkeys(f.path.name for f in tl.files))
        shown = ", ".join(names) if len(names) <= 6 else f"{', '.join(names[:3])}, ..., {', '.join(names[-2:])}"
        notes.append(f"{len(tl.windows)} trace parts read in order ({shown})")
    return notes
