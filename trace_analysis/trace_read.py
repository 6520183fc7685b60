"""Reading Chrome trace files that may be damaged: cut off mid-write, garbled, or in parts.

Why a reader of its own: the runs worth looking at are often the ones that went wrong. A
controller killed mid-flush leaves a file cut at an arbitrary byte (inside an event, inside a
UTF-8 character, before the metadata tail that names processes); a resumed run from before
traces were appended left its earlier parts as `trace.partN.json`. Every complete event is
kept, and what could not be read is *counted* (bytes, regions) so the summary and the page can
say what is missing instead of silently showing less.

Both Chrome formats are read: the JSON Array Format (what areal-graph writes; the spec allows
the closing "]" to be missing) and the JSON Object Format (`{"traceEvents": [...]}`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_graph.runtime.observability.run_dir import TRACE_FILENAME
from areal_graph.runtime.observability.trace_segments import SEGMENTS_DIRNAME

_PART_RE = re.compile(r"^trace\.part(\d+)\.json$")
_SEGMENT_RE = re.compile(r"^seg-(\d+)\.json$")
_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


@dataclass
class TraceFile:
    """The events of one trace file and an account of what could not be read."""

    path: Path
    events: list[dict[str, Any]]
    bytes_total: int
    bytes_skipped: int = 0  # bytes of the file that held no readable event
    regions_skipped: int = 0  # separate unreadable stretches (1 for a file cut at the end)
    closed: bool = True  # the array's closing "]" was there
    non_events: int = 0  # array entries that are not JSON objects
    window: tuple[int, int] | None = None  # (offset, length) when only a window of the file was read
    notes: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        return bool(self.bytes_skipped or self.non_events or not self.closed)


def trace_files(run: str | os.PathLike) -> list[Path]:
    """The trace files of a run, oldest first: `trace.part1.json`, ..., `trace.json`, then the
    kept segments `trace_segments/seg-000001.json`, ...

    `run` is a run directory or a single trace file. Earlier parts are what a resumed run
    left behind before traces were appended to one file (see runtime/observability/run_dir.py);
    segments are what a run with a trace budget wrote after its head
    (runtime/observability/trace_segments.py)."""
    path = Path(run)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory or trace file")
    parts = sorted((int(m.group(1)), p) for p in path.iterdir() if (m := _PART_RE.match(p.name)))
    files = [p for _, p in parts]
    if (path / TRACE_FILENAME).is_file():
        files.append(path / TRACE_FILENAME)
    seg_dir = path / SEGMENTS_DIRNAME
    if seg_dir.is_dir():
        files.extend(sorted(p for p in seg_dir.iterdir() if _SEGMENT_RE.match(p.name)))
    if not files:
        raise FileNotFoundError(f"{path}: no {TRACE_FILENAME} (is it a run directory?)")
    return files


def read_trace_file(path: str | os.PathLike) -> TraceFile:
    """Every readable event of a Chrome trace file; damage is counted, never raised.

    Raises ValueError only when the file is not a Chrome trace at all (it does not start
    with "[" or with an object holding "traceEvents")."""
    path = Path(path)
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return _checked(TraceFile(path, whole, len(raw)))
    if isinstance(whole, dict):
        events = whole.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError(f"{path}: a JSON object without a 'traceEvents' list is not a Chrome trace")
        return _checked(TraceFile(path, events, len(raw)))
    start = _array_start(text, path)
    return _checked(_read_damaged(path, text, start, len(raw)))


def _array_start(text: str, path: Path) -> int:
    """Offset just past the "[" that opens the event array."""
    head = text.lstrip(_WS + "\ufeff")
    offset = len(text) - len(head)
    if head.startswith("["):
        return offset + 1
    if head.startswith("{"):
        m = re.search(r'"traceEvents"\s*:\s*\[', text)
        if m:
            return m.end()
    if not head:
        raise ValueError(f"{path}: the file is empty")
    raise ValueError(f"{path}: not a Chrome trace (it does not start with '[' or a traceEvents object)")


def _read_damaged(path: Path, text: str, pos: int, n_bytes: int) -> TraceFile:
    """Decode event by event; at an unreadable stretch, resume at the next line that opens an event."""
    out = TraceFile(path, [], n_bytes, closed=False)
    fast = _read_cut_tail(text, pos)
    if fast is not None:  # the common case: sound up to its last lines, then cut
        out.events, pos = fast
    end = len(text)
    while True:
        while pos < end and text[pos] in _WS + ",":
            pos += 1
        if pos >= end:
            break
        if text[pos] == "]":
            out.closed = True
            break
        try:
            event, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            nxt = text.find("\n{", pos + 1)
            stop = end if nxt < 0 else nxt + 1
            # the tail in raw bytes (a character cut in two was decoded as one replacement character)
            out.bytes_skipped += (
                n_bytes - len(text[:pos].encode("utf-8", errors="replace"))
                if stop == end
                else len(text[pos:stop].encode("utf-8", errors="replace"))
            )
            out.regions_skipped += 1
            pos = stop
            continue
        out.events.append(event)
    return out


def _read_cut_tail(text: str, pos: int) -> tuple[list[Any], int] | None:
    """(events, offset where they end) when everything up to one of the last two line breaks
    parses in one go (json.loads is far faster than decoding event by event)."""
    cut = text.rfind("\n", pos)
    for _ in range(2):
        if cut <= pos:
            return None
        try:
            events = json.loads("[" + text[pos:cut].rstrip(_WS).rstrip(",") + "]")
        except json.JSONDecodeError:
            cut = text.rfind("\n", pos, cut)
            continue
        return (events, cut) if isinstance(events, list) else None
    return None


def _checked(tf: TraceFile) -> TraceFile:
    """Drop array entries that are not events (counted), and write the notes that describe the damage."""
    events = [e for e in tf.events if isinstance(e, dict)]
    tf.non_events = len(tf.events) - len(events)
    tf.events = events
    name = tf.path.name
    if not tf.closed:
        tf.notes.append(f"{name}: the file ends without its closing ']' (cut off mid-write)")
    if tf.bytes_skipped:
        where = "at its end" if tf.regions_skipped == 1 else f"in {tf.regions_skipped} places"
        tf.notes.append(f"{name}: {tf.bytes_skipped} unparsable bytes skipped {where}")
    if tf.non_events:
        tf.notes.append(f"{name}: {tf.non_events} array entries that are not events skipped")
    return tf
