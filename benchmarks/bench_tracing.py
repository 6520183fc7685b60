"""Cost of one tracing span, against an empty loop measured in the same run.

Tracing is always on: it wraps every node call and every generation request, so a span
must cost microseconds. (GAE's cost against a plain loop is in bench_math.py.)

    python benchmarks/bench_tracing.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.tracing import Tracer

RESULTS = Path(__file__).resolve().parent / "results"


def span_cost(n: int = 20_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tr = Tracer(Path(tmp) / "t.json", flush_every=10**9)
        t0 = time.perf_counter()
        for i in range(n):
            with tr.span("step", cat="c", step=i):
                pass
        traced = (time.perf_counter() - t0) / n
        tr.close()
    t0 = time.perf_counter()
    for i in range(n):
        pass
    empty = (time.perf_counter() - t0) / n
    return {"spans": n, "per_span_us": traced * 1e6, "empty_loop_us": empty * 1e6}


def main() -> int:
    r = span_cost()
    table = Table(title="Tracing span cost (one run, shared machine)")
    for col in ("what", "us per iteration"):
        table.add_column(col, justify="right")
    table.add_row("with tr.span(...): pass", f"{r['per_span_us']:.1f}")
    table.add_row("empty loop", f"{r['empty_loop_us']:.2f}")
    console = Console()
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "tracing.json"
    out.write_text(json.dumps(r, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
