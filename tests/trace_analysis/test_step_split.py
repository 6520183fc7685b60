"""trace_analysis/step_split.py: each training step's wall time split into compute (the
union of compute intervals inside it, per process and once overall) and overhead, and the
medians over steps.

trace_summary reaches it through `summarize_run`; here it gets spans built by hand with the
answer worked out by hand, and the two run fixtures are checked against a brute-force split
(every span against every step, no bisection window) computed in the test."""

from __future__ import annotations

import pytest

from areal_graph.trace_analysis.step_split import LONG_S, is_compute, step_split, summarize_steps, union_seconds
from areal_graph.trace_analysis.trace_run import load_run
from support.paths import FIXTURES

S = 1_000_000  # microseconds per second


def _span(cat, start_s, dur_s, process="p", **args):
    return {"name": cat, "cat": cat, "ts": start_s * S, "dur": dur_s * S, "process": process, "args": args}


def _step(step, start_s, dur_s):
    return _span("step", start_s, dur_s, "controller", step=step)


@pytest.mark.parametrize(
    "intervals,total",
    [
        ([], 0.0),
        ([(0, 1)], 1.0),
        ([(0, 1), (0.5, 2)], 2.0),
        ([(3, 4), (0, 1), (0.2, 0.4)], 2.0),  # unsorted, one inside another
        ([(0, 5), (1, 2), (2, 3), (6, 7)], 6.0),
        ([(0, 1), (1, 2)], 2.0),  # touching
        ([(1, 1)], 0.0),
    ],
)
def test_union_seconds_counts_overlaps_once(intervals, total):
    assert union_seconds(intervals) == pytest.approx(total)


def test_what_counts_as_compute():
    assert is_compute({"cat": "compute"})
    assert is_compute({"cat": "node", "args": {"worker": "controller"}})  # a node the controller runs itself
    assert not is_compute({"cat": "node", "args": {"worker": "model-actor"}})  # the call; its compute span counts
    assert not is_compute({"cat": "node"}) and not is_compute({"cat": "request"}) and not is_compute({})


def test_a_step_is_split_into_compute_per_process_and_overhead():
    spans = [
        _step(0, 0.0, 2.0),
        _span("compute", 0.5, 1.0, "inference-0"),  # 0.5 .. 1.5
        _span("compute", 1.0, 0.8, "model-actor"),  # 1.0 .. 1.8, overlaps the engine
        _span("node", 1.9, 0.6, "controller", worker="controller"),  # 1.9 .. 2.5, cut at the step's end
        _span("node", 0.0, 2.0, "controller", worker="model-actor"),  # a call to a worker: not compute
        _span("compute", 3.0, 1.0, "model-actor"),  # after the step
        _span("weights", 0.1, 0.2, "controller"),
    ]
    [row] = step_split(spans)
    assert row["step"] == 0 and row["wall_s"] == pytest.approx(2.0)
    assert row["compute_s"] == pytest.approx(1.4)  # 0.5..1.8 and 1.9..2.0
    assert row["overhead_s"] == pytest.approx(0.6) and row["overhead_share"] == pytest.approx(0.3)
    assert row["by_process"] == pytest.approx({"controller": 0.1, "inference-0": 1.0, "model-actor": 0.8})
    assert list(row["by_process"]) == ["controller", "inference-0", "model-actor"]  # sorted


def test_compute_that_started_long_before_the_step_still_counts():
    """Spans are looked up by start time within LONG_S before a step; longer ones are checked
    against every step, so a server busy for a minute counts in each step it covers."""
    spans = [
        _step(0, 100.0, 2.0),
        _step(1, 200.0, 2.0),
        _span("compute", 0.0, 250.0, "inference-0"),  # long: covers both steps
        _span("compute", 100.0 - LONG_S + 1, LONG_S - 0.5, "reward"),  # short, starts 9 s before step 0
        _span("compute", 150.0, 1.0, "reward"),
    ]  # between the steps
    rows = step_split(spans)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["by_process"] == pytest.approx({"inference-0": 2.0, "reward": 0.5})
    assert rows[1]["by_process"] == pytest.approx({"inference-0": 2.0})
    assert rows[0]["compute_s"] == pytest.approx(2.0) and rows[0]["overhead_s"] == pytest.approx(0.0)


def test_steps_come_out_in_time_order_and_a_zero_length_step_has_no_share():
    rows = step_split(
        [
            _step(1, 5.0, 1.0),
            _step(0, 1.0, 1.0),
            _step(2, 7.0, 0.0),
            {"name": "step", "cat": "step", "ts": 9 * S, "process": "controller"},
        ]
    )
    assert [r["step"] for r in rows] == [0, 1, 2, None]  # a step span without args or dur still is a row
    assert rows[2]["wall_s"] == 0.0 and rows[2]["overhead_share"] == 0.0
    assert all(r["compute_s"] == 0.0 and r["by_process"] == {} for r in rows)
    assert step_split([]) == []


def _row(wall, compute, step=None, **by):
    return {"step": step, "wall_s": wall, "compute_s": compute, "overhead_s": wall - compute, "by_process": by}


def test_summarize_steps_is_the_median_step_whole_and_skips_warm_up_when_there_are_enough_steps():
    assert summarize_steps([]) == {}
    few = [_row(10.0, 1.0, a=1.0), _row(2.0, 1.0, a=1.0, b=0.5), _row(4.0, 3.0, b=3.0)]
    got = summarize_steps(few)  # 3 rows: none skipped; the median wall is the 4 s step, taken whole
    assert got["steps"] == 3 and got["wall_s"] == 4.0 and got["compute_s"] == 3.0 and got["overhead_s"] == 1.0
    assert got["compute_s"] + got["overhead_s"] == got["wall_s"] and got["overhead_share"] == 0.25
    assert got["by_process_s"] == {"b": 3.0}
    assert got["overhead_share_all_steps"] == pytest.approx((9 + 1 + 1) / 16)
    many = [_row(100.0, 0.0)] * 3 + [_row(float(w), 1.0, a=1.0) for w in (2, 3, 4, 5)]
    got = summarize_steps(many)  # 7 rows > 2 * 3: the first 3 skipped; of 4, the lower median
    assert got["steps"] == 4 and got["wall_s"] == 3.0 and got["by_process_s"] == {"a": 1.0}
    assert summarize_steps(many, skip_first=0)["steps"] == 7


def test_a_step_redone_after_a_resume_counts_once_as_its_last_run():
    rows = [_row(1.0, 0.5, step=1), _row(9.0, 0.5, step=2), _row(2.0, 0.5, step=2), _row(3.0, 0.5, step=3)]
    got = summarize_steps(rows)
    assert got["steps"] == 3 and got["wall_s"] == 2.0 and got["step"] == 2


def _brute_force(spans):
    rows = []
    for s in sorted((s for s in spans if s["cat"] == "step"), key=lambda s: s["ts"]):
        lo, hi = s["ts"] / S, (s["ts"] + s["dur"]) / S
        per = {}
        for c in spans:
            if is_compute(c):
                a, b = max(c["ts"] / S, lo), min((c["ts"] + c["dur"]) / S, hi)
                if b > a:
                    per.setdefault("controller" if c["cat"] == "node" else c["process"], []).append((a, b))
        rows.append(
            (
                hi - lo,
                union_seconds(iv for v in per.values() for iv in v),
                {k: union_seconds(v) for k, v in per.items()},
            )
        )
    return rows


@pytest.mark.parametrize("run", ["sync", "async"])
def test_the_fixture_runs_match_a_brute_force_split(run):
    spans = load_run(FIXTURES / "trace_runs" / run).timeline.spans
    rows = step_split(spans)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row, (wall, busy, per) in zip(rows, _brute_force(spans)):
        assert row["wall_s"] == pytest.approx(wall) and row["compute_s"] == pytest.approx(busy)
        assert row["by_process"] == pytest.approx(per)
        assert 0 < row["compute_s"] <= row["wall_s"]
        assert row["overhead_s"] == pytest.approx(row["wall_s"] - row["compute_s"])
        assert max(row["by_process"].values()) <= row["compute_s"] + 1e-9 <= sum(row["by_process"].values()) + 2e-9
