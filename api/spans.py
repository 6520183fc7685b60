"""Recording trace spans in memory, cheaply, in any process (workers, inference servers).

Why here and not with the trace writer (runtime/observability/tracing.py): every process
records, only the controller writes the file; engines record too and must not depend on the
runtime. `SpanRecorder.take()` hands spans over as plain JSON-safe dicts with wall-clock
times, so spans from different processes line up.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

# A recorded span before formatting: (name, cat, worker, node, step, version, start_s, end_s, args, process)
_Raw = tuple


class _Span:
    """The context manager returned by `span()`; __slots__ and no generator to stay cheap."""

    __slots__ = ("_rec", "_name", "_cat", "_worker", "_node", "_step", "_version", "_args", "_t0")

    def __init__(self, rec: "SpanRecorder", name: str, cat: str, worker, node, step, version, args) -> None:
        self._rec = rec
        self._name = name
        self._cat = cat
        self._worker = worker
        self._node = node
        self._step = step
        self._version = version
        self._args = args
        self._t0 = 0.0

    def __enter__(self) -> "_Span":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        t1 = time.perf_counter()
        args = self._args
        if exc_type is not None:
            args = dict(args or {}, error=exc_type.__name__)
        self._rec._append((self._name, self._cat, self._worker, self._node, self._step, self._version,
                           self._t0, t1, args))

    def set(self, **args: Any) -> None:
        """Attach results known only inside the span (e.g. token counts)."""
        self._args = dict(self._args or {}, **args)


class SpanRecorder:
    """Records spans in memory. Workers use it directly and ship `take()` to the controller."""

    def __init__(self, process: str | None = None) -> None:
        self.process = process or f"pid-{os.getpid()}"
        self._pending: list[_Raw] = []
        self._lock = threading.Lock()
        # perf_counter -> wall clock, fixed once so spans keep perf_counter's resolution
        self._wall0 = time.time()
        self._perf0 = time.perf_counter()

    def span(self, name: str, cat: str = "", worker: str | None = None, node: str | None = None,
             step: int | None = None, version: int | None = None, **args: Any) -> _Span:
        return _Span(self, name, cat, worker, node, step, version, args or None)

    def record(self, name: str, start: float, end: float, cat: str = "", worker: str | None = None,
               node: str | None = None, step: int | None = None, version: int | None = None, **args: Any) -> None:
        """A span measured elsewhere; start/end are time.perf_counter() values of this process."""
        self._append((name, cat, worker, node, step, version, start, end, args or None))

    def _append(self, raw: _Raw) -> None:
        self._pending.append(raw)  # list.append is atomic under the GIL: no lock on the hot path

    def _swap(self) -> list[_Raw]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def _to_wall(self, t: float) -> float:
        return self._wall0 + (t - self._perf0)

    def take(self) -> list[dict[str, Any]]:
        """Remove and return the recorded spans as plain dicts (JSON-safe, for the wire)."""
        return [self._as_dict(r) for r in self._swap()]

    def _as_dict(self, r: _Raw) -> dict[str, Any]:
        name, cat, worker, node, step, version, t0, t1, args = r
        return {
            "name": name, "cat": cat, "process": self.process, "worker": worker, "node": node,
            "step": step, "version": version, "start": self._to_wall(t0), "end": self._to_wall(t1),
            "args": _json_safe(args) if args else {},
        }

    def __len__(self) -> int:
        return len(self._pending)


def _json_safe(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    try:
        return obj.item()  # numpy / torch scalars
    except Exception:
        return str(obj)
