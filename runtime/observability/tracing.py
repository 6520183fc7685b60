"""Always-on tracing of what ran, when and where, as a Chrome trace (chrome://tracing, Perfetto).

Why always on: the questions asked of an async RL run ("was the trainer waiting for
rollouts?", "how long did weight sync stall generation?") are only answerable after the
fact. So recording a span must cost next to nothing: `span()` reads the clock twice and
appends one tuple to a list; formatting and file I/O happen in `flush()` (called every
`flush_every` spans, every `flush_interval_s` seconds, and at the end of a run).

File format: the JSON Array Format of the Chrome trace event spec. After every flush the
file is complete, valid JSON: the events so far, then the metadata events that name
processes and threads, then "]". The next flush truncates that tail, appends the new events
and writes the tail again, so a long run never rewrites its history. Readers here also accept
a file cut off mid-write (the spec allows the missing "]").

Mapping: one trace *process* (pid) per worker (the `worker=` of a span, else the recording
process's name), one *thread* (tid) per node (`node=`, else the span's category); spans of
one track that overlap in time (concurrent rollouts) are spread over lanes "rollout #1",
"rollout #2", ... because Chrome draws only properly nested spans on one thread.

Timestamps are wall-clock microseconds (time.time at tracer start plus a perf_counter
offset), so spans recorded in other processes (`SpanRecorder.take()` -> plain dicts sent
back over the wire -> `Tracer.merge`) line up with the controller's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from areal_graph.api.spans import SpanRecorder, _json_safe, _Raw, _Span

log = logging.getLogger(__name__)

class Tracer(SpanRecorder):
    """A SpanRecorder that writes a Chrome trace file (see module docstring)."""

    def __init__(self, path: str | os.PathLike | None, process: str = "controller", enabled: bool = True,
                 flush_every: int = 20_000, flush_interval_s: float = 30.0) -> None:
        super().__init__(process)
        self.path = Path(path) if path is not None else None
        self.enabled = enabled and self.path is not None
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self._merged: list[dict[str, Any]] = []
        self._io_lock = threading.Lock()
        self._body_end: int | None = None  # file offset where the metadata tail starts
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, str], int] = {}
        self._lane_ends: dict[tuple[int, str], list[float]] = {}
        self._last_flush = time.perf_counter()
        self.spans_written = 0

    def span(self, name: str, cat: str = "", worker: str | None = None, node: str | None = None,
             step: int | None = None, version: int | None = None, **args: Any):
        if not self.enabled:
            return _NULL_SPAN
        return _Span(self, name, cat, worker, node, step, version, args or None)

    def _append(self, raw: _Raw) -> None:
        if not self.enabled:
            return
        self._pending.append(raw)
        if len(self._pending) >= self.flush_every or raw[7] - self._last_flush > self.flush_interval_s:
            self._last_flush = raw[7]
            self.flush()

    def merge(self, spans: Iterable[dict[str, Any]]) -> None:
        """Add spans recorded by another process (dicts from `SpanRecorder.take()`)."""
        if not self.enabled:
            return
        spans = list(spans)
        for s in spans:
            missing = {"name", "start", "end"} - set(s)
            if missing:
                raise ValueError(f"Tracer.merge: span {s!r} lacks {sorted(missing)}")
        with self._lock:
            self._merged.extend(spans)

    def flush(self) -> None:
        """Write pending spans; afterwards the file is complete, valid Chrome-trace JSON."""
        if not self.enabled:
            return
        raws = self._swap()
        with self._lock:
            merged, self._merged = self._merged, []
        spans = [self._as_dict(r) for r in raws] + merged
        spans.sort(key=lambda s: s["start"])
        with self._io_lock:
            events = [self._event(s) for s in spans]
            self._write(events)
            self.spans_written += len(events)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "Tracer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ formatting
    def _event(self, s: dict[str, Any]) -> dict[str, Any]:
        proc = s.get("worker") or s.get("process") or self.process
        track = s.get("node") or s.get("cat") or "main"
        pid = self._pids.setdefault(proc, len(self._pids) + 1)
        start, end = float(s["start"]), float(s["end"])
        lanes = self._lane_ends.setdefault((pid, track), [])
        lane = next((i for i, e in enumerate(lanes) if e <= start), None)
        if lane is None:
            lane = len(lanes)
            lanes.append(end)
        else:
            lanes[lane] = end
        tname = track if lane == 0 else f"{track} #{lane + 1}"
        tid = self._tids.setdefault((pid, tname), len(self._tids) + 1)
        args = dict(s.get("args") or {})
        for k in ("node", "step", "version", "worker", "process"):
            if s.get(k) is not None:
                args[k] = s[k]
        return {"name": s["name"], "cat": s.get("cat") or "", "ph": "X", "ts": round(start * 1e6, 3),
                "dur": round(max(end - start, 0.0) * 1e6, 3), "pid": pid, "tid": tid, "args": _json_safe(args)}

    def _metadata(self) -> list[dict[str, Any]]:
        meta = []
        for name, pid in self._pids.items():
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for (pid, tname), tid in self._tids.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}})
        return meta

    def _write(self, events: list[dict[str, Any]]) -> None:
        assert self.path is not None
        if self._body_end is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "wb") as f:
                f.write(b"[\n")
                self._body_end = f.tell()
        body = "".join(json.dumps(e, separators=(",", ":")) + ",\n" for e in events).encode()
        tail = ",\n".join(json.dumps(m, separators=(",", ":")) for m in self._metadata())
        with open(self.path, "r+b") as f:
            f.seek(self._body_end)
            f.truncate()
            f.write(body)
            self._body_end = f.tell()
            f.write(tail.encode() + b"\n]\n")


class NullTracer(SpanRecorder):
    """Records nothing; the same interface as Tracer (for tests and tracing turned off)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("null")
        self.path = None
        self.enabled = False

    def span(self, *args: Any, **kwargs: Any):
        return _NULL_SPAN

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def merge(self, spans: Iterable[dict[str, Any]]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> "_NullSpan":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def set(self, **args: Any) -> None:
        pass


_NULL_SPAN = _NullSpan()


# ---------------------------------------------------------------------- reading
def load_trace(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Events of a Chrome trace file, also when it was cut off (no final "]", trailing comma)."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        body = text.rstrip().rstrip(",")
        if not body.endswith("]"):
            body += "]"
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            # cut mid-event: keep every complete line
            lines = [ln.rstrip().rstrip(",") for ln in text.splitlines()[1:]]
            data = []
            for ln in lines:
                try:
                    data.append(json.loads(ln))
                except json.JSONDecodeError:
                    continue
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a Chrome trace (expected a JSON array or an object with traceEvents)")
    return data


def complete_spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """"X" events with their process and thread names resolved (keys 'process', 'thread')."""
    pname = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = []
    for e in events:
        if e.get("ph") != "X":
            continue
        out.append(dict(e, process=pname.get(e.get("pid"), str(e.get("pid"))),
                        thread=tname.get((e.get("pid"), e.get("tid")), str(e.get("tid")))))
    return out
