"""Tracer: valid Chrome trace after every flush, names mapped, merge, overhead, trace CLI."""

from __future__ import annotations

import argparse
import json
import threading
import time

import pytest

from areal_graph.cli import cmd_trace
from areal_graph.runtime.observability.tracing import NullTracer, SpanRecorder, Tracer, complete_spans, load_trace


def _names(events):
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return procs, threads


def test_spans_are_written_as_valid_chrome_trace(tmp_path):
    path = tmp_path / "trace.json"
    tr = Tracer(path)
    with tr.span("train", cat="node", node="train", worker="actor", step=3, tokens=128):
        time.sleep(0.01)
    with tr.span("startup", cat="controller"):
        pass
    tr.flush()
    events = json.loads(path.read_text())  # strict JSON: complete after a flush
    xs = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in xs] == ["train", "startup"]
    train = xs[0]
    assert train["dur"] >= 10_000 - 1  # microseconds
    assert train["args"] == {"tokens": 128, "node": "train", "step": 3, "worker": "actor", "process": "controller"}
    procs, threads = _names(events)
    assert procs[train["pid"]] == "actor" and threads[(train["pid"], train["tid"])] == "train"
    assert procs[xs[1]["pid"]] == "controller" and threads[(xs[1]["pid"], xs[1]["tid"])] == "controller"
    assert abs(train["ts"] / 1e6 - time.time()) < 60  # wall-clock microseconds


def test_repeated_flushes_append_and_stay_valid(tmp_path):
    path = tmp_path / "t.json"
    tr = Tracer(path)
    for i in range(3):
        with tr.span(f"s{i}", cat="c", worker=f"w{i}"):
            pass
        tr.flush()
        events = json.loads(path.read_text())
        assert [e["name"] for e in events if e["ph"] == "X"] == [f"s{j}" for j in range(i + 1)]
        assert len(_names(events)[0]) == i + 1
    assert tr.spans_written == 3


def test_automatic_flush_and_exception_recorded(tmp_path):
    path = tmp_path / "t.json"
    tr = Tracer(path, flush_every=5)
    for _ in range(5):
        with tr.span("x"):
            pass
    assert len(json.loads(path.read_text())) > 0  # flushed without an explicit call
    with pytest.raises(KeyError):
        with tr.span("boom"):
            raise KeyError("k")
    tr.close()
    boom = [e for e in load_trace(path) if e.get("name") == "boom"][0]
    assert boom["args"]["error"] == "KeyError"


def test_overlapping_spans_get_separate_lanes(tmp_path):
    tr = Tracer(tmp_path / "t.json")
    t = time.perf_counter()
    tr.record("rollout", t, t + 2, cat="rollout", node="rollout", worker="gen")
    tr.record("rollout", t + 1, t + 3, cat="rollout", node="rollout", worker="gen")
    tr.record("rollout", t + 2.5, t + 4, cat="rollout", node="rollout", worker="gen")
    tr.flush()
    spans = complete_spans(load_trace(tr.path))
    assert [s["thread"] for s in spans] == ["rollout", "rollout #2", "rollout"]


def test_merge_spans_from_another_process(tmp_path):
    worker = SpanRecorder(process="worker-1")
    with worker.span("forward", cat="compute", node="prox_logp", tokens=42):
        time.sleep(0.002)
    shipped = json.loads(json.dumps(worker.take()))  # what travels over the wire: plain JSON
    assert worker.take() == []
    tr = Tracer(tmp_path / "t.json")
    tr.merge(shipped)
    tr.flush()
    spans = complete_spans(load_trace(tr.path))
    assert spans[0]["process"] == "worker-1" and spans[0]["thread"] == "prox_logp"
    assert spans[0]["args"]["tokens"] == 42 and spans[0]["dur"] >= 1900
    with pytest.raises(ValueError, match="lacks"):
        tr.merge([{"name": "x"}])


def test_null_tracer_and_disabled_tracer(tmp_path):
    for tr in (NullTracer(), Tracer(tmp_path / "off.json", enabled=False), Tracer(None)):
        with tr.span("x", cat="y", foo=1) as s:
            s.set(bar=2)
        tr.merge([{"name": "a", "start": 0, "end": 1}])
        tr.flush()
    assert not (tmp_path / "off.json").exists()


def test_threads_record_concurrently(tmp_path):
    tr = Tracer(tmp_path / "t.json", flush_every=500)

    def work(k):
        for i in range(1000):
            with tr.span("s", cat=f"t{k}"):
                pass

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tr.flush()
    assert len([e for e in load_trace(tr.path) if e["ph"] == "X"]) == 4000


def test_load_trace_tolerates_a_cut_off_file(tmp_path):
    tr = Tracer(tmp_path / "t.json")
    for i in range(3):
        with tr.span(f"s{i}"):
            pass
    tr.flush()
    text = (tmp_path / "t.json").read_text()
    body = text[: text.index('{"name":"process_name"')]  # events, trailing comma, no "]"
    (tmp_path / "cut.json").write_text(body)
    assert [e["name"] for e in load_trace(tmp_path / "cut.json")] == ["s0", "s1", "s2"]
    (tmp_path / "cut2.json").write_text(body + '{"name":"half')
    assert len(load_trace(tmp_path / "cut2.json")) == 3


def test_trace_cli_summary(tmp_path, capsys):
    tr = Tracer(tmp_path / "trace.json")
    t = time.perf_counter()
    for d in (1.0, 2.0, 3.0, 4.0):
        tr.record("rollout", t, t + d, cat="rollout", worker="gen")
    tr.record("train", t + 4, t + 6, cat="node", worker="trainer")
    tr.flush()
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cmd_trace.register(sub)
    args = parser.parse_args(["trace", str(tmp_path), "--json", "--by", "name", "worker"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["wall_s"] == pytest.approx(6.0, abs=1e-3)
    rollout = out["by"]["name"][0]
    assert rollout["key"] == "rollout" and rollout["count"] == 4
    assert rollout["total_s"] == pytest.approx(10.0, abs=1e-3)
    assert rollout["p50_s"] == pytest.approx(2.5, abs=1e-3)  # numpy-style interpolation
    assert rollout["p95_s"] == pytest.approx(3.85, abs=1e-3)
    assert rollout["share"] == pytest.approx(10 / 6, abs=1e-3)
    assert {r["key"] for r in out["by"]["worker"]} == {"gen", "trainer"}
    args = parser.parse_args(["trace", str(tmp_path)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "time per span" in text and "rollout" in text
    args = parser.parse_args(["trace", str(tmp_path / "nope")])
    assert args.func(args) == 1


def test_percentile_matches_numpy():
    import numpy as np

    vals = sorted(np.random.default_rng(0).random(37).tolist())
    for q in (0, 50, 95, 100):
        assert cmd_trace._percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))
