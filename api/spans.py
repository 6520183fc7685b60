"""Recording trace spans in memory, cheaply, in any process (workers, inference servers).

Why here and not with the trace writer (runtime/observability/tracing.py): every process
records, only the controller writes the file; engines record too and must not depend on the
runtime. `SpanRecorder.take()` hands spans over as plain JSON-safe dicts with wall-clock
times, so spans from different processes line up.

Tracing can be turned off for a whole run (`runtime.trace: false`): the launcher then sets
`AREAL_GRAPH_TRACE=0` in every process it starts, and a recorder built there without an
explicit `enabled=` records nothing (its `span()` is a shared no-op object).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

# "0", "false", "off" or "no" in this variable turns recording off in the process (see module docstring)
TRACE_ENV = "AREAL_GRAPH_TRACE"


def tracing_enabled_by_env() -> bool:
    """Whether this process should record spans: on unless `AREAL_GRAPH_TRACE` says off."""
    return os.environ.get(TRACE_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


# A recorded span before formatting: (name, cat, worker, node, step, version, start_s, end_s, args, process)
_Raw = tuple


class _Span:
    """The context manager returned by `span()`; __slots__ and no generator to stay cheap."""

    __slots__ = ("_rec", "_name", "_cat", "_worker", "_node", "_step", "_version", "_args", "_t0")

    def __init__(self, rec: SpanRecorder, name: str, cat: str, worker, node, step, version, args) -> None:
        self._rec = rec
        self._name = name
        self._cat = cat
        self._worker = worker
        self._node = node
        self._step = step
        self._version = version
        self._args = args
        self._t0 = 0.0

    def __enter__(self) -> _Span:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        t1 = time.perf_counter()
        args = self._args
        if exc_type is not None:
            args = dict(args or {}, error=exc_type.__name__)
        self._rec._append(
            (self._name, self._cat, self._worker, self._node, self._step, self._version, self._t0, t1, args)
        )

    def set(self, **args: Any) -> None:
        """Attach results known only inside the span (e.g. token counts)."""
        self._args = dict(self._args or {}, **args)


class _NullSpan:
    """What `span()` returns when recording is off: enter, exit and `set` do nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def set(self, **args: Any) -> None:
        pass


NULL_SPAN = _NullSpan()


class SpanRecorder:
    """Records spans in memory. Workers use it directly and ship `take()` to the controller.

    enabled: None reads the process's environment (`tracing_enabled_by_env`); a disabled
    recorder keeps nothing.
    """

    def __init__(self, process: str | None = None, enabled: bool | None = None) -> None:
        self.process = process or f"pid-{os.getpid()}"
        self.enabled = tracing_enabled_by_env() if enabled is None else bool(enabled)
        self._pending: list[_Raw] = []
        self._lock = threading.Lock()
        # perf_counter -> wall clock, fixed once so spans keep perf_counter's resolution
        self._wall0 = time.time()
        self._perf0 = time.perf_counter()

    def span(
        self,
        name: str,
        cat: str = "",
        worker: str | None = None,
        node: str | None = None,
        step: int | None = None,
        version: int | None = None,
        **args: Any,
    ) -> _Span | _NullSpan:
        if not self.enabled:
            return NULL_SPAN
        return _Span(self, name, cat, worker, node, step, version, args or None)

    def record(
        self,
        name: str,
        start: float,
        end: float,
        cat: str = "",
        worker: str | None = None,
        node: str | None = None,
        step: int | None = None,
        version: int | None = None,
        **args: Any,
    ) -> None:
        """A span measured elsewhere; start/end are time.perf_counter() values of this process."""
        self._append((name, cat, worker, node, step, version, start, end, args or None))

    def now(self) -> float:
        """This process's wall clock as its spans are stamped (what a clock probe should answer)."""
        return self._to_wall(time.perf_counter())

    def _append(self, raw: _Raw) -> None:
        if self.enabled:
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
        """A raw span as a dict; worker, node, step and version only when set (smaller on the wire)."""
        name, cat, worker, node, step, version, t0, t1, args = r
        out = {
            "name": name,
            "cat": cat,
            "process": self.process,
            "start": self._to_wall(t0),
            "end": self._to_wall(t1),
            "args": _json_safe(args) if args else {},
        }
        if worker is not None:
            out["worker"] = worker
        if node is not None:
            out["node"] = node
        if step is not None:
            out["step"] = step
        if version is not None:
            out["version"] = version
        return out

    def __len__(self) -> int:
        return len(self._pending)


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _json_safe(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if type(obj) is dict and all(type(k) is str and type(v) in _PLAIN for k, v in obj.items()):
        return obj  # the usual span args (counts, names): nothing to convert
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    try:
        return obj.item()  # numpy / torch scalars
    except Exception:
        return str(obj)
