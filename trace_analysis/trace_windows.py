"""Reading a run's trace in bounded memory and time, however large it is.

Why: a trace parsed whole costs ~10x its size in memory (a 114 MB trace took 1.26 GB and
12.7 s), so a trace of a gigabyte (a run from before `runtime.trace_max_mb`, or one given a
large budget) would not fit. Beyond `max_bytes`, the files are read in *windows* instead, by
seeking, never scanning what is skipped: the first quarter of the budget from the start of the
run, the last quarter from its end, and the other half as evenly spaced windows between, the
same shape the writer's budget keeps (runtime/observability/trace_segments.py). Each window
becomes a part of the timeline of its own, so durations are measured over the time the windows cover and a gap
between them is not counted as idle time (Timeline.wall_s).

A window starts at the first event line after its offset and ends at the last complete line
(the writer puts one event per line); the metadata that names processes and threads is at the
end of each file and is read from there for every window of that file. What was read and what
was dropped (by this reader or by the writer's budget) is said in notes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_graph.runtime.observability.trace_segments import read_index
from areal_graph.trace_analysis.trace_read import TraceFile, read_trace_file, trace_files

DEFAULT_READ_MB = 48  # what `areal-graph trace` reads of a run at most (--read-mb)
MIDDLE_WINDOWS = 8  # evenly spaced windows between the first and last steps
_META_TAIL = 1 << 20  # the end of a file searched for its metadata events


@dataclass(frozen=True)
class Window:
    """`length` bytes of `path` from `offset` (the whole file when offset 0 and length its size)."""

    path: Path
    offset: int
    length: int
    size: int  # the file's size

    @property
    def whole(self) -> bool:
        return self.offset == 0 and self.length >= self.size


def plan_windows(sizes: list[tuple[Path, int]], max_bytes: int) -> list[Window]:
    """Windows over the files (taken as one byte stream, in order) holding at most ~`max_bytes`.

    Everything when it fits; else the first and last quarter of the budget and MIDDLE_WINDOWS
    evenly spaced windows sharing the other half. Pure: tested on sizes alone."""
    total = sum(n for _, n in sizes)
    if total <= max_bytes:
        return [Window(p, 0, n, n) for p, n in sizes if n > 0]
    edge = max_bytes // 4
    mid = (max_bytes - 2 * edge) // MIDDLE_WINDOWS
    spans = [(0, edge)]
    gap = (total - 2 * edge) / MIDDLE_WINDOWS
    for k in range(MIDDLE_WINDOWS):  # centred in each of MIDDLE_WINDOWS equal stretches of the middle
        centre = edge + gap * (k + 0.5)
        spans.append((int(centre - mid / 2), mid))
    spans.append((total - edge, edge))
    out: list[Window] = []
    starts, pos = [], 0
    for _, n in sizes:
        starts.append(pos)
        pos += n
    for lo, length in spans:
        hi = lo + length
        for (path, n), at in zip(sizes, starts):
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                out.append(Window(path, a - at, b - a, n))
    return out


def read_window(w: Window) -> TraceFile:
    """The complete events of one window, with the file's metadata (process and thread names)."""
    if w.whole:
        return read_trace_file(w.path)
    with open(w.path, "rb") as f:
        f.seek(w.offset)
        raw = f.read(w.length)
        if w.offset > 0:  # from the first line that starts after the offset
            nl = raw.find(b"\n")
            raw = raw[nl + 1 :] if nl >= 0 else b""
        ends_in_file = w.offset + w.length < w.size
        if ends_in_file:  # up to the last complete line
            raw = raw[: raw.rfind(b"\n") + 1]
        meta = _metadata(f, w.size) if ends_in_file else []
    events, bad = _events(raw.decode("utf-8", errors="replace"))
    tf = TraceFile(w.path, events + meta, len(raw), closed=True, window=(w.offset, w.length))
    if bad:
        tf.bytes_skipped, tf.regions_skipped = bad, 1
        tf.notes.append(f"{w.path.name}: {bad} unparsable bytes skipped in a window at {w.offset}")
    return tf


def _events(text: str) -> tuple[list[dict[str, Any]], int]:
    """Events of complete lines (`{...},` each), the array's brackets and the tail included."""
    lines = [ln.strip().rstrip(",") for ln in text.splitlines()]
    lines = [ln for ln in lines if ln.startswith("{")]
    try:
        events = json.loads("[" + ",".join(lines) + "]")
        return [e for e in events if isinstance(e, dict)], 0
    except json.JSONDecodeError:
        out, bad = [], 0
        for ln in lines:
            try:
                e = json.loads(ln)
            except json.JSONDecodeError:
                bad += len(ln.encode("utf-8", errors="replace"))
                continue
            if isinstance(e, dict):
                out.append(e)
        return out, bad


def _metadata(f: Any, size: int) -> list[dict[str, Any]]:
    """The metadata ("M") events in the last MB of an open trace file (where the writer puts them)."""
    f.seek(max(size - _META_TAIL, 0))
    tail = f.read().decode("utf-8", errors="replace")
    out = []
    for ln in tail.splitlines():
        ln = ln.strip().rstrip(",")
        if ln.startswith("{") and '"ph":"M"' in ln.replace(" ", ""):
            try:
                e = json.loads(ln)
            except json.JSONDecodeError:
                continue
            if isinstance(e, dict) and e.get("ph") == "M":
                out.append(e)
    return out


def read_trace_parts(
    run: str | os.PathLike, max_bytes: int = DEFAULT_READ_MB * 2**20
) -> tuple[list[TraceFile], list[str]]:
    """The parts of a run's trace to build a timeline from, read within `max_bytes`, and notes
    on what was left out (by this reader, or by the run's trace budget)."""
    files = trace_files(run)
    sizes = [(p, p.stat().st_size) for p in files]
    windows = plan_windows(sizes, max_bytes)
    parts = [read_window(w) for w in windows]
    notes = []
    total = sum(n for _, n in sizes)
    if not all(w.whole for w in windows):
        read = sum(w.length for w in windows)
        notes.append(
            f"the trace is {_mb(total)}: read {_mb(read)} of it, streamed in bounded "
            f"memory (the first and last {_mb(max_bytes // 4)} and {MIDDLE_WINDOWS} windows "
            "evenly spaced between; --read-mb reads more); times and shares are over what was read"
        )
    notes.extend(budget_notes(Path(run)))
    return parts, notes


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 10 * 2**20 else f"{n / 2**20:.1f} MB"


def budget_notes(run: Path) -> list[str]:
    """What the run's trace budget (runtime.trace_max_mb) dropped, from trace_segments/index.json."""
    index = read_index(run) if run.is_dir() else None
    if not index:
        return []
    segs = [s for s in index.get("segments", []) if isinstance(s, dict)]
    dropped = [s for s in segs if not s.get("kept", True)]
    if not dropped:
        return []
    steps = [v for s in dropped for k in ("first_step", "last_step") if isinstance(v := s.get(k), int)]
    where = f"between steps {min(steps)} and {max(steps)}" if steps else "in the middle of the run"
    return [
        f"the run's trace budget (runtime.trace_max_mb = {index.get('max_bytes', 0) / 2**20:g} MB) dropped "
        f"{len(dropped)} of {len(segs)} segments {where} ({sum(int(s.get('bytes', 0)) for s in dropped) / 2**20:,.1f} "
        f"MB, {sum(int(s.get('spans', 0)) for s in dropped):,} spans): the first steps, the last steps and an "
        "evenly spaced sample between are in full (trace_segments/index.json lists every segment)"
    ]
