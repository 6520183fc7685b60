"""What `areal-graph trace` says of speculative decoding (trace_analysis/speculation_summary.py),
from the servers' step logs and their running counts."""

from __future__ import annotations

import json

import pytest

from areal_graph.cli import cmd_trace
from areal_graph.engines.inference.engine_spans import STEP_COLUMNS, STEP_DECODE, STEP_VERIFY, step_span_args
from areal_graph.trace_analysis.speculation_summary import VERIFY, speculation_counters, speculation_summary
from areal_graph.trace_analysis.trace_model import load_timeline


def _events(rows, counts):
    _, _, args = step_span_args(rows)
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "inference-0"}},
        {"name": "engine_steps", "cat": "profile", "ph": "X", "ts": 0, "dur": 1e5, "pid": 1, "tid": 1, "args": args},
    ]
    if counts is not None:
        events.append(
            {
                "name": "speculation",
                "cat": "profile",
                "ph": "X",
                "ts": 1e5,
                "dur": 0,
                "pid": 1,
                "tid": 1,
                "args": counts,
            }
        )
    return events


def test_tokens_per_forward_by_batch_and_acceptance_by_source(tmp_path):
    assert VERIFY == STEP_VERIFY and STEP_COLUMNS[7] == "out"  # the analyser's copy of the engine's kind
    rows = [
        (0.00, 0.01, STEP_DECODE, 8, 8, 400, 50, 8),
        (0.01, 0.02, STEP_VERIFY, 8, 24, 400, 50, 20),  # 8 rows emitted 20: 2.5 per row
        (0.03, 0.04, STEP_VERIFY, 2, 10, 100, 50, 7),  # 2 rows emitted 7: 3.5 per row
        (0.04, 0.05, STEP_VERIFY, 2, 6, 100, 50, 3),
    ]
    counts = {"proposed": {"group": 30, "self": 4}, "accepted": {"group": 15, "self": 0}}
    (tmp_path / "trace.json").write_text(json.dumps(_events(rows, counts)))
    sp = speculation_summary(load_timeline(tmp_path))
    assert sp["available"] and sp["forwards"] == 4 and sp["verifying"] == 3
    assert sp["verifying_share"] == pytest.approx(3 / 4)  # of the decode steps (no prefill here)
    assert sp["tokens_per_forward"] == pytest.approx(30 / 12)
    assert sp["by_rows"] == {"2": pytest.approx(10 / 4), "8": pytest.approx(20 / 8)}
    assert sp["acceptance"] == {"self": 0.0, "prompt": None, "group": 0.5, "history": None}
    line = cmd_trace._speculation_lines(sp)[0]
    assert "3 of 4 forwards" in line and "2.50 tokens per row" in line and "group 15/30" in line


def test_a_run_without_speculation_says_nothing(tmp_path):
    rows = [(0.0, 0.01, STEP_DECODE, 8, 8, 400, 50, 8)]
    (tmp_path / "trace.json").write_text(json.dumps(_events(rows, None)))
    sp = speculation_summary(load_timeline(tmp_path))
    assert sp == {"available": False, "forwards": 1}
    assert cmd_trace._speculation_lines(sp) == []


def test_the_page_gets_a_speculation_counter_per_second(tmp_path):
    """trace_view/payload.py draws derived counters: one sample a second where the server verified."""
    rows = [
        (0.0, 0.01, STEP_VERIFY, 4, 12, 100, 50, 10),  # second 0: 10 of 4 rows, 1 of 2 forwards verified
        (0.2, 0.21, STEP_DECODE, 4, 4, 100, 50, 4),
        (1.5, 1.51, STEP_DECODE, 4, 4, 100, 50, 4),  # second 1: nothing verified, no sample
        (2.5, 2.51, STEP_VERIFY, 2, 6, 60, 50, 6),  # second 2: 3 per row
    ]
    (tmp_path / "trace.json").write_text(json.dumps(_events(rows, None)))
    counters = speculation_counters(load_timeline(tmp_path))
    assert [c["ts"] for c in counters] == [0.0, 2e6]
    assert counters[0]["values"] == {"tokens per row and forward": 2.5, "verifying share": 0.5}
    assert counters[1]["values"]["tokens per row and forward"] == 3.0
    assert {c["process"] for c in counters} == {"inference-0"} and counters[0]["name"] == "speculation"
