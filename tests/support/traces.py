"""Traces written by the real Tracer, step after step like a run: what the recorder's budget
tests (tests/runtime/observability/test_trace_budget.py) and the reader's window tests
(tests/trace_analysis/test_trace_windows.py) both write."""

from __future__ import annotations

from areal_graph.runtime.observability.tracing import Tracer


def record_steps(tr: Tracer, first: int, last: int, t0: float, spans_per_step: int = 30) -> None:
    """Record steps like a run: node spans with rids and args, then the step span."""
    for step in range(first, last):
        t = t0 + step * 0.01
        for k in range(spans_per_step):
            tr.record(
                "generate",
                t,
                t + 0.002,
                cat="node",
                node="rollout",
                worker="rollout",
                step=step,
                rid=f"r{step}-{k}",
                tokens=64,
            )
        tr.record("forward", t, t + 0.006, cat="compute", worker="inference-0", step=step)  # busy 60%
        tr.record("step", t, t + 0.01, cat="step", step=step)
