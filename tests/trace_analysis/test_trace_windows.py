"""trace_analysis/trace_windows.py: a trace read in bounded memory, however large.

The reader reads any trace within --read-mb by windows (the head, the end and evenly spaced
windows between) and says so; against real files written by the real Tracer. The writer's own
budget (runtime.trace_max_mb) is tested in tests/runtime/observability/test_trace_budget.py.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.runtime.observability.tracing import Tracer
from areal_graph.trace_analysis.trace_model import load_timeline
from areal_graph.trace_analysis.trace_stats import process_shares
from areal_graph.trace_analysis.trace_windows import plan_windows, read_trace_parts
from support.traces import record_steps


@given(
    st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=12),
    st.integers(min_value=10**4, max_value=10**7),
)
@settings(max_examples=200)
def test_windows_hold_at_most_the_budget_start_at_the_start_and_end_at_the_end(sizes, budget):
    files = [(Path(f"f{i}"), n) for i, n in enumerate(sizes)]
    windows = plan_windows(files, budget)
    total = sum(sizes)
    assert sum(w.length for w in windows) <= max(budget, 0) + 16 or total <= budget
    for w in windows:
        assert 0 <= w.offset and w.offset + w.length <= w.size
    if total > budget:
        nonempty = [(p, n) for p, n in files if n]
        assert windows[0].path == nonempty[0][0] and windows[0].offset == 0
        assert windows[-1].path == nonempty[-1][0] and windows[-1].offset + windows[-1].length == nonempty[-1][1]
    else:
        assert all(w.whole for w in windows)


def test_a_trace_larger_than_the_read_budget_is_read_in_windows_in_bounded_memory(tmp_path):
    """An unbounded trace (trace_max_mb: null, or an old run) of ~40 MB, read with 4 MB."""
    tr = Tracer(tmp_path / "trace.json", flush_interval_s=1e9, flush_every=5000)
    t0 = time.perf_counter()
    record_steps(tr, 0, 12000, t0, spans_per_step=16)
    tr.close()
    size = (tmp_path / "trace.json").stat().st_size
    assert size > 20 * 2**20
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    parts, notes = read_trace_parts(tmp_path, 4 * 2**20)
    took = time.perf_counter() - started
    assert sum(p.bytes_total for p in parts) <= 4 * 2**20
    assert took < 10 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 200 * 2**10  # KB
    assert any("read in" not in n and "streamed in bounded memory" in n for n in notes)
    tl = load_timeline(tmp_path, 4 * 2**20)
    steps = sorted({s["args"]["step"] for s in tl.spans if s["name"] == "step"})
    assert steps[0] == 0 and steps[-1] == 11999 and 800 < len(steps) < 12000  # first, last and between
    assert {s["process"] for s in tl.spans} == {"rollout", "controller", "inference-0"}  # from each file's tail
    # durations are over what was read: the gaps between windows are not counted as wall time,
    # nor the part of a span outside the windows as busy time
    assert tl.wall_s < 0.5 * (12000 * 0.01)
    shares = {r["process"]: r for r in process_shares(tl)}
    assert shares["inference-0"]["busy_share"] == pytest.approx(0.6, abs=0.03)
    assert shares["inference-0"]["busy_share_steps"] == pytest.approx(0.6, abs=0.03)
