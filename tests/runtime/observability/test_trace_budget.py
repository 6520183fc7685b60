"""A trace bounded by design (runtime.trace_max_mb), however long the run.

The writer keeps the head, the newest segments and an evenly spaced sample of the older ones,
within the budget, and says what it dropped; against real files written by the real Tracer.
The reader's side (any trace read within --read-mb by windows) is tested in
tests/trace_analysis/test_trace_windows.py.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_graph.runtime.observability.trace_segments import (
    INDEX_FILENAME,
    SAMPLE_SEGMENTS,
    SEGMENTS_DIRNAME,
    TAIL_SEGMENTS,
    TraceBudgetTooSmall,
    kept_segments,
)
from areal_graph.runtime.observability.tracing import Tracer
from areal_graph.trace_analysis.trace_model import load_timeline
from support.traces import record_steps


# ---------------------------------------------------------------------- the keep policy
@given(st.integers(min_value=0, max_value=5000))
def test_the_newest_segments_and_at_most_a_sample_of_the_older_ones_are_kept(closed):
    keep = kept_segments(closed)
    assert set(range(max(closed - TAIL_SEGMENTS, 0) + 1, closed + 1)) <= keep
    older = sorted(i for i in keep if i <= closed - TAIL_SEGMENTS)
    assert len(older) <= SAMPLE_SEGMENTS
    if closed - TAIL_SEGMENTS >= 2 * SAMPLE_SEGMENTS:  # the sample spans the middle, evenly
        gaps = {b - a for a, b in zip(older, older[1:])}
        assert len(gaps) == 1 and len(older) >= SAMPLE_SEGMENTS // 2
        assert older[-1] > (closed - TAIL_SEGMENTS) // 2


@given(st.integers(min_value=1, max_value=3000))
def test_a_dropped_segment_is_never_wanted_back(closed):
    """Monotone: what is deleted for n segments stays deleted for n + 1 (the files are gone)."""
    assert kept_segments(closed + 1) <= kept_segments(closed) | {closed + 1}


# ---------------------------------------------------------------------- the writer
def _size(run: Path) -> int:
    return sum(
        p.stat().st_size for p in [run / "trace.json", *(run / SEGMENTS_DIRNAME).glob("seg-*.json")] if p.exists()
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_long_trace_stays_within_its_budget_and_says_what_it_dropped(tmp_path, seed):
    rng = random.Random(seed)
    budget = rng.choice([1, 2, 3]) * 2**20
    tr = Tracer(tmp_path / "trace.json", max_bytes=budget, flush_interval_s=1e9)
    t0 = time.perf_counter()
    step = 0
    while step < 1600:  # ~8 KB per step: many times the budget
        n = min(rng.randint(20, 120), 1600 - step)
        record_steps(tr, step, step + n, t0)
        step += n
        assert _size(tmp_path) <= budget * 1.05, f"over budget at step {step}"
    tr.close()
    assert tr.problem is None
    index = json.loads((tmp_path / SEGMENTS_DIRNAME / INDEX_FILENAME).read_text())
    kept = [s for s in index["segments"] if s["kept"]]
    dropped = [s for s in index["segments"] if not s["kept"]]
    assert dropped and len(kept) <= TAIL_SEGMENTS + SAMPLE_SEGMENTS
    assert sorted(p.name for p in (tmp_path / SEGMENTS_DIRNAME).glob("seg-*.json")) == [s["file"] for s in kept]
    assert kept[-1]["last_step"] == 1599  # the last steps are there, in full
    # each kept file is a complete Chrome trace of its own, naming its processes
    for s in kept:
        events = json.loads((tmp_path / SEGMENTS_DIRNAME / s["file"]).read_text())
        assert {e["args"]["name"] for e in events if e.get("name") == "process_name"} >= {"rollout", "controller"}
    tl = load_timeline(tmp_path, max_read_bytes=10 * budget)
    steps = sorted({s["args"]["step"] for s in tl.spans if s["name"] == "step"})
    assert steps[0] == 0 and steps[-1] == 1599
    assert any("dropped" in n and "trace_segments/index.json" in n for n in tl.notes)


def test_a_budget_that_cannot_hold_one_step_is_an_error_naming_the_field(tmp_path):
    tr = Tracer(tmp_path / "trace.json", max_bytes=64 * 2**10, flush_interval_s=1e9)
    record_steps(tr, 0, 40, time.perf_counter(), spans_per_step=200)  # ~50 KB per step, a segment is 3 KB
    tr.close()
    assert tr.problem is not None
    assert "runtime.trace_max_mb" in tr.problem and "too small to hold one step" in tr.problem
    with pytest.raises(TraceBudgetTooSmall):
        raise TraceBudgetTooSmall(tr.problem)


def test_a_resumed_run_goes_on_in_a_new_segment_with_its_processes_named(tmp_path):
    budget = 2**20
    tr = Tracer(tmp_path / "trace.json", max_bytes=budget, flush_interval_s=1e9)
    record_steps(tr, 0, 400, time.perf_counter())
    tr.close()
    before = sorted(p.name for p in (tmp_path / SEGMENTS_DIRNAME).glob("seg-*.json"))
    assert before
    again = Tracer(tmp_path / "trace.json", max_bytes=budget, flush_interval_s=1e9, append=True)
    again.record("resume", time.perf_counter(), time.perf_counter(), cat="controller")
    record_steps(again, 400, 420, time.perf_counter())
    again.close()
    after = sorted(p.name for p in (tmp_path / SEGMENTS_DIRNAME).glob("seg-*.json"))
    assert after[-1] > before[-1]
    newest = json.loads((tmp_path / SEGMENTS_DIRNAME / after[-1]).read_text())
    pids = {e["args"]["name"]: e["pid"] for e in newest if e.get("name") == "process_name"}
    old = json.loads((tmp_path / SEGMENTS_DIRNAME / before[-1]).read_text())
    assert {e["args"]["name"]: e["pid"] for e in old if e.get("name") == "process_name"}.items() <= pids.items()


def test_own_spans_wait_for_the_workers_horizon_so_the_file_stays_in_time_order(tmp_path):
    """The controller's spans that end after the last pull's horizon are written with the next
    pull's spans, not before the workers' spans of the same time; the last flush writes all."""
    tr = Tracer(tmp_path / "trace.json", flush_interval_s=1e9)
    t = time.perf_counter()
    tr.record("early", t + 0.01, t + 0.1, cat="controller", step=1)
    tr.record("late", t + 1.0, t + 1.1, cat="controller", step=2)
    worker = {"name": "w", "cat": "compute", "process": "reward", "start": tr._to_wall(t), "end": tr._to_wall(t + 0.5)}
    tr.merge([worker], horizon=tr._to_wall(t + 0.6))
    tr.flush()
    names = [e["name"] for e in json.loads((tmp_path / "trace.json").read_text()) if e.get("ph") == "X"]
    assert names == ["w", "early"]  # "late" ends past the horizon: held back
    tr.merge(
        [dict(worker, name="w2", start=tr._to_wall(t + 1.0), end=tr._to_wall(t + 1.05))], horizon=tr._to_wall(t + 1.2)
    )
    tr.flush()
    names = [e["name"] for e in json.loads((tmp_path / "trace.json").read_text()) if e.get("ph") == "X"]
    assert names == ["w", "early", "late", "w2"]
    tr.record("last", t + 5.0, t + 5.1, cat="controller")
    tr.close()
    assert [e["name"] for e in json.loads((tmp_path / "trace.json").read_text()) if e.get("ph") == "X"][-1] == "last"


def test_a_stale_horizon_holds_nothing_back(tmp_path):
    """Pulls that stopped (the workers are gone) must not keep the owner's spans in memory."""
    tr = Tracer(tmp_path / "trace.json", flush_interval_s=1e9)
    t = time.perf_counter()
    tr.merge([], horizon=tr._to_wall(t - 120.0))
    tr.record("now", t, t + 0.1, cat="controller")
    tr.flush()
    assert [e["name"] for e in json.loads((tmp_path / "trace.json").read_text()) if e.get("ph") == "X"] == ["now"]
    assert len(tr) == 0
