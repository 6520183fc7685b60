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
"rollout #2", ... because Chrome draws only properly nested spans on one thread; spans of
one request (the same `rid` arg: its phases inside the request span) stay on its lane.

Flow events (ph "s" / "f") link a prompt group's generation to the train step that consumed
it: a span whose args carry `flow_out` / `flow_in` (lists of flow ids) gets them, on its own
pid and tid (see flows.py).

Timestamps are wall-clock microseconds (time.time at tracer start plus a perf_counter
offset), so spans recorded in other processes (`SpanRecorder.take()` -> plain dicts sent
back over the wire -> `Tracer.merge`) line up with the controller's. Processes on other
hosts may have clocks that differ: the executor measures each process's offset when it
connects (clocks.py) and shifts its spans before they are merged.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from areal_graph.api.process import release_freed_memory
from areal_graph.api.spans import NULL_SPAN, SpanRecorder, _json_safe, _Raw, _Span
from areal_graph.runtime.observability.disk_full import disk_full_message, is_disk_full
from areal_graph.runtime.observability.flows import flow_events
from areal_graph.runtime.observability.trace_segments import SegmentedTrace, TraceBudgetTooSmall, segment_bytes

log = logging.getLogger(__name__)
_HOLD_BACK_MAX_S = 60.0  # a horizon older than this is stale: the owner's spans are written anyway
_KEY_LANES_KEPT = 4096  # lane hints kept (one per recent request id)
_compact = json.JSONEncoder(separators=(",", ":")).encode  # one encoder for every event (no per-call setup)


class Tracer(SpanRecorder):
    """A SpanRecorder that writes a Chrome trace file (see module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike | None,
        process: str = "controller",
        enabled: bool = True,
        flush_every: int = 20_000,
        flush_interval_s: float = 30.0,
        append: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(process)
        self.path = Path(path) if path is not None else None
        self.enabled = enabled and self.path is not None
        # a size budget (runtime.trace_max_mb): the head, then rotating segments (trace_segments.py)
        self.segments = SegmentedTrace(self.path, max_bytes) if max_bytes and self.path is not None else None
        if self.segments is not None:  # a flush at most a quarter of a segment (~250 bytes a span)
            flush_every = max(50, min(flush_every, segment_bytes(max_bytes or 0) // 1000))
        # why the run must stop (the controller checks after each step): the budget cannot hold a
        # step, or the disk is full (disk_full.py)
        self.problem: str | None = None
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self._merged: list[dict[str, Any]] = []
        self._io_lock = threading.Lock()
        self._body_end: int | None = None  # file offset where the metadata tail starts
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, str], int] = {}
        self._lanes: dict[tuple[int, str], list[list[tuple[float, float, Any]]]] = {}  # per track: lanes of open spans
        self._key_lanes: dict[tuple[int, str, Any], int] = {}  # (pid, track, rid) -> its lane: a hint, recent ones only
        self._last_flush = time.perf_counter()
        self._flusher: threading.Thread | None = None  # runs the flushes that fall due, off the caller's thread
        self._flush_due = threading.Event()
        self._closing = False
        self._horizon: float | None = None  # the workers' spans are in up to here (merge)
        self._file: Path | None = self.path  # the file flushes append to (a segment, with a budget)
        self.spans_written = 0
        if append and self.path is not None and self.enabled and self.path.exists():
            self._continue_file()

    def span(
        self,
        name: str,
        cat: str = "",
        worker: str | None = None,
        node: str | None = None,
        step: int | None = None,
        version: int | None = None,
        **args: Any,
    ):
        if not self.enabled:
            return _NULL_SPAN
        return _Span(self, name, cat, worker, node, step, version, args or None)

    def _append(self, raw: _Raw) -> None:
        if not self.enabled:
            return
        self._pending.append(raw)
        if len(self._pending) >= self.flush_every or raw[7] - self._last_flush > self.flush_interval_s:
            self._last_flush = raw[7]
            self._flush_in_background()

    def _flush_in_background(self) -> None:
        """A flush that falls due runs in the tracer's one flush thread: formatting thousands of
        spans must not stall the event loop whose span happened to trigger it (the controller's).

        One long-lived thread, not a thread per flush: glibc gives new threads their own malloc
        arenas, and the memory a flush frees there is kept, so a thread per flush made the
        owner's RSS grow ~140 MB per 1,000 steps of the main job (bench_soak.py)."""
        self._flush_due.set()
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name="trace-flush", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        while True:
            self._flush_due.wait()
            self._flush_due.clear()
            if self._closing:
                return
            self._flush_logged()
            release_freed_memory()

    def _flush_logged(self) -> None:
        t0 = time.perf_counter()
        try:
            written = self._flush()
        except TraceBudgetTooSmall as err:  # the controller stops the run with this (a config error)
            self.problem = str(err)
            return
        except OSError as err:
            if not is_disk_full(err):
                log.exception("writing the trace %s failed", self._file)
                return
            if self.problem is None:
                self.problem = disk_full_message(
                    "the trace",
                    self._file or self.path or "",
                    self._run_dir(),
                    need_bytes=segment_bytes(self.segments.max_bytes) if self.segments is not None else None,
                )
            return
        except Exception:  # noqa: BLE001 - a trace that cannot be written must not stop the run
            log.exception("writing the trace %s failed", self._file)
            return
        # what tracing itself costs the controller, in the trace (written with the next flush)
        self._pending.append(
            ("trace_flush", "trace", None, "trace", None, None, t0, time.perf_counter(), {"spans": written})
        )

    def merge(self, spans: Iterable[dict[str, Any]], horizon: float | None = None) -> None:
        """Add spans recorded by another process (dicts from `SpanRecorder.take()`).

        `horizon`: the wall-clock time (`now()`) when they were asked for: every span the other
        processes finished before it is in. Until the next horizon, this tracer's own spans
        that end after it are held back, so the file stays (nearly) in time order: a stretch of
        it, a segment or a window read (trace_analysis/trace_windows.py), holds every process's
        spans of its time, not the controller's of now and the workers' of seconds ago."""
        if not self.enabled:
            return
        spans = list(spans)
        for s in spans:
            missing = {"name", "start", "end"} - set(s)
            if missing:
                raise ValueError(f"Tracer.merge: span {s!r} lacks {sorted(missing)}")
        with self._lock:
            self._merged.extend(spans)
            if horizon is not None:
                self._horizon = max(self._horizon or horizon, horizon)
            due = len(self._merged) >= self.flush_every
        if due:  # the workers' spans count too: a flush's size, and so its memory, stays bounded
            self._flush_in_background()

    def flush(self) -> None:
        """Write pending spans; afterwards the file is complete, valid Chrome-trace JSON."""
        self._flush()

    def _flush(self) -> int:
        """`flush`; returns how many spans it wrote."""
        if not self.enabled:
            return 0
        with self._io_lock:  # one flush at a time, batches in the order they were taken
            raws = self._swap()
            with self._lock:
                merged, self._merged = self._merged, []
                horizon = None if self._closing else self._horizon
            if horizon is not None and self.now() - horizon > _HOLD_BACK_MAX_S:
                horizon = None  # pulls stopped (workers gone): hold nothing back, or memory would grow
            if horizon is not None:  # own spans past the workers' horizon wait for the next flush
                later = [r for r in raws if self._to_wall(r[7]) > horizon]
                if later:
                    raws = [r for r in raws if self._to_wall(r[7]) <= horizon]
                    with self._lock:
                        self._pending[0:0] = later  # in place: an append racing this one is kept
            spans = [self._as_dict(r) for r in raws] + merged
            if not spans and self._body_end is not None:
                return 0
            spans.sort(key=lambda s: (s["start"], -s["end"]))  # a parent before the children it encloses
            # with a budget, at most flush_every spans go to one file at a time: a flush that fell
            # behind (spans pile up while one is running) must not overfill the head or a segment
            step = self.flush_every if self.segments is not None else max(len(spans), 1)
            for at in range(0, max(len(spans), 1), step):
                chunk = spans[at : at + step]
                events = []
                for s in chunk:
                    event = self._event(s)
                    events.append(event)
                    events.extend(flow_events(event))
                self._write(events, chunk)
                self.spans_written += len(chunk)
        return len(spans)

    def close(self) -> None:
        flusher = self._flusher
        self._closing = True  # the flush thread stops; the last flush writes every span, held back or not
        if flusher is not None:
            self._flush_due.set()
            flusher.join()
            self._flusher = None
        try:
            self.flush()
            if self.segments is not None and self.enabled:
                self.segments.write_index()  # the open segment's final account
        except TraceBudgetTooSmall as err:
            self.problem = str(err)
        except OSError as err:  # at the end of a run that failed on a full disk: said already
            if not is_disk_full(err):
                raise
            log.warning("the trace's last spans were not written: %s", err)

    def _run_dir(self) -> Path:
        return self.path.parent if self.path is not None else Path(".")

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ formatting
    def _event(self, s: dict[str, Any]) -> dict[str, Any]:
        proc = s.get("worker") or s.get("process") or self.process
        track = s.get("node") or s.get("cat") or "main"
        pid = self._pids.get(proc)
        if pid is None:
            pid = self._pids[proc] = max(self._pids.values(), default=0) + 1
        start, end = float(s["start"]), float(s["end"])
        lane = self._lane(pid, track, start, end, (s.get("args") or {}).get("rid"))
        tname = track if lane == 0 else f"{track} #{lane + 1}"
        tid = self._tids.get((pid, tname))
        if tid is None:
            tid = self._tids[(pid, tname)] = max(self._tids.values(), default=0) + 1
        args = dict(s.get("args") or {})
        for k in ("node", "step", "version", "worker", "process"):
            if s.get(k) is not None:
                args[k] = s[k]
        # whole microseconds, end rounded on its own: a child that ends with its parent ends at the
        # same ts + dur (float64 holds today's epoch in us only to 0.25 us anyway)
        ts = round(start * 1e6)
        return {
            "name": s["name"],
            "cat": s.get("cat") or "",
            "ph": "X",
            "ts": ts,
            "dur": max(round(end * 1e6) - ts, 0),
            "pid": pid,
            "tid": tid,
            "args": _json_safe(args),
        }

    def _lane(self, pid: int, track: str, start: float, end: float, key: Any) -> int:
        """The span's lane on its track; a request's spans look in its own lane first (with
        hundreds of lanes, scanning them all per span would cost more than the rest of it)."""
        lanes = self._lanes.setdefault((pid, track), [])
        if key is None:
            return _place_in_lane(lanes, start, end, None)
        where = (pid, track, key)
        lane = self._key_lanes[where] = _place_in_lane(lanes, start, end, key, self._key_lanes.get(where))
        if len(self._key_lanes) > _KEY_LANES_KEPT:
            del self._key_lanes[next(iter(self._key_lanes))]  # the oldest: its request is long done
        return lane

    def _metadata(self) -> list[dict[str, Any]]:
        meta = []
        for name, pid in self._pids.items():
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for (pid, tname), tid in self._tids.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}})
        return meta

    def _continue_file(self) -> None:
        """Carry on an existing trace (a resumed run): its events stay, its processes keep their pids.

        Without a size budget, or while the budget's head is not full, the file is rewritten
        once without its metadata tail (a file cut off by a crash is read as far as it is
        complete); later flushes append after the old events and write a tail that names the old
        processes and threads as well as the new ones. With segments, the newest one names the
        processes, and the resumed run starts a new segment.
        """
        assert self.path is not None
        newest = self.segments.resume() if self.segments is not None else None
        old = load_trace(newest if newest is not None else self.path)
        for e in old:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                self._pids.setdefault(str(e["args"]["name"]), int(e["pid"]))
        for e in old:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                self._tids.setdefault((int(e["pid"]), str(e["args"]["name"])), int(e["tid"]))
        if self.segments is not None and self.segments.head_full:
            log.info("appending to the trace %s (a new segment in %s)", self.path, self.segments.dir)
            return
        body = [e for e in old if e.get("ph") != "M"]
        with open(self.path, "wb") as f:
            f.write(b"[\n")
            f.write("".join(json.dumps(e, separators=(",", ":")) + ",\n" for e in body).encode())
            self._body_end = f.tell()
        self.spans_written = len(body)
        log.info("appending to the trace %s (%d events so far)", self.path, len(body))

    def _write(self, events: list[dict[str, Any]], spans: list[dict[str, Any]]) -> None:
        assert self.path is not None
        if self.segments is not None:
            target, new = self.segments.target()
            if target != self._file or new:
                self._file, self._body_end = target, None
        assert self._file is not None
        if self._body_end is None:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            with open(self._file, "wb") as f:
                f.write(b"[\n")
                self._body_end = f.tell()
        body = "".join(_compact(e) + ",\n" for e in events).encode()
        tail = ",\n".join(json.dumps(m, separators=(",", ":")) for m in self._metadata())
        with open(self._file, "r+b") as f:
            f.seek(self._body_end)
            f.truncate()
            f.write(body)
            self._body_end = f.tell()
            f.write(tail.encode() + b"\n]\n")
        if self.segments is not None and spans:
            steps = [s["step"] for s in spans if s.get("step") is not None]
            marks = {int(s["step"]) for s in spans if s.get("cat") == "step" and s.get("step") is not None}
            self.segments.wrote(
                self._body_end,
                len(body),
                len(spans),
                (min(steps), max(steps)) if steps else None,
                marks,
                (float(spans[0]["start"]) * 1e6, max(float(s["end"]) for s in spans) * 1e6),
            )


class NullTracer(SpanRecorder):
    """Records nothing; the same interface as Tracer. For tests and for code run outside a run
    (a run with `runtime.trace: false` keeps a Tracer whose `enabled` is False)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("null")
        self.path = None
        self.enabled = False

    def span(self, *args: Any, **kwargs: Any):
        return _NULL_SPAN

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def merge(self, spans: Iterable[dict[str, Any]], horizon: float | None = None) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


_NULL_SPAN = NULL_SPAN  # the shared no-op span (api/spans.py)


def _place_in_lane(
    lanes: list[list[tuple[float, float, Any]]], start: float, end: float, key: Any, hint: int | None = None
) -> int:
    """The first lane where [start, end] follows the spans still open there, or nests in its parent.

    Each lane is a stack of the spans still open at `start` (spans arrive by start time).
    Chrome draws only properly nested spans on one thread, so spans that overlap go to other
    lanes. Spans with a `key` (the `rid` arg) nest in the innermost open span with the same
    key: a request's phases stay on its lane, consecutive phases included, and a zero-length
    mark at its very end too. The key is what tells whose phase a span is (concurrent
    requests start phases at the same instant); spans without one never nest, so two
    unrelated spans are never drawn as parent and child. `hint`: the lane to try first.
    """

    def nests(top: tuple[float, float, Any]) -> bool:
        return key is not None and top[2] == key and top[0] <= start and end <= top[1]

    def close_ended(stack: list[tuple[float, float, Any]]) -> None:
        while stack and (stack[-1][1] < start or (stack[-1][1] == start and not nests(stack[-1]))):
            stack.pop()

    if hint is not None and hint < len(lanes):
        close_ended(lanes[hint])
        if lanes[hint] and nests(lanes[hint][-1]):
            lanes[hint].append((start, end, key))
            return hint
    free = None
    for i, stack in enumerate(lanes):
        close_ended(stack)
        if stack and nests(stack[-1]):
            stack.append((start, end, key))
            return i
        if not stack and free is None:
            free = i
    if free is None:
        free = len(lanes)
        lanes.append([])
    lanes[free].append((start, end, key))
    return free


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
    """ "X" events with their process and thread names resolved (keys 'process', 'thread')."""
    pname = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    tname = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out = []
    for e in events:
        if e.get("ph") != "X":
            continue
        out.append(
            dict(
                e,
                process=pname.get(e.get("pid"), str(e.get("pid"))),
                thread=tname.get((e.get("pid"), e.get("tid")), str(e.get("tid"))),
            )
        )
    return out
