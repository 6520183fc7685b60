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
    tr._flusher.join(10)  # a flush that falls due runs in a thread of its own
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
        for _i in range(1000):
            with tr.span("s", cat=f"t{k}"):
                pass

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tr.close()  # waits for a flush still running in the background, then writes the rest
    events = load_trace(tr.path)
    assert len([e for e in events if e["ph"] == "X" and e["name"] == "s"]) == 4000
    flushes = [e for e in events if e["ph"] == "X" and e["name"] == "trace_flush"]  # tracing's own cost, traced
    assert flushes and all(e["cat"] == "trace" and e["args"]["spans"] > 0 for e in flushes)


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


def test_a_resumed_tracer_appends_to_the_trace_and_keeps_its_process_names(tmp_path):
    """One timeline across a resume: old events stay, processes keep their pids, new ones get new pids."""
    path = tmp_path / "trace.json"
    first = Tracer(path)
    first.record("a", 1.0, 2.0, worker="model-actor", node="train")
    first.record("b", 1.5, 2.5, worker="rollout", node="rollout")
    first.flush()
    with open(path, "ab") as f:  # a crash mid-write leaves a cut-off event behind the tail
        f.write(b'{"name":"cut')
    second = Tracer(path, append=True)
    second.record("c", 3.0, 4.0, worker="model-actor", node="train")
    second.record("d", 3.0, 4.0, worker="inference-0", node="generate")
    second.flush()
    spans = {s["name"]: s for s in complete_spans(load_trace(path))}
    assert sorted(spans) == ["a", "b", "c", "d"]
    assert spans["c"]["pid"] == spans["a"]["pid"] and spans["c"]["tid"] == spans["a"]["tid"]
    assert spans["c"]["process"] == "model-actor" and spans["b"]["process"] == "rollout"
    assert spans["d"]["pid"] not in {spans["a"]["pid"], spans["b"]["pid"]}
    assert spans["d"]["process"] == "inference-0"
    json.loads(path.read_text())  # still one valid JSON array


# ---------------------------------------------------------------------------- nesting, clocks, the switch
def test_nested_spans_share_a_lane_and_overlapping_ones_do_not(tmp_path):
    tr = Tracer(tmp_path / "t.json")
    t = 100.0
    tr.record("request", t, t + 4, node="requests", rid="a")
    tr.record("queued", t, t + 1, node="requests", rid="a")
    tr.record("request", t + 0.5, t + 3, node="requests", rid="b")  # overlaps a: its own lane
    tr.record("queued", t + 0.5, t + 1, node="requests", rid="b")
    tr.record("prefill", t + 1, t + 2, node="requests", rid="a")  # starts with b's next phase...
    tr.record("prefill", t + 1, t + 2, node="requests", rid="b")  # ...each goes to its own request's lane
    tr.record("decode", t + 2, t + 4, node="requests", rid="a")
    tr.record("finished", t + 4, t + 4, node="requests", rid="a")  # a mark at the very end: still nested
    tr.flush()
    lanes = {(s["name"], s["args"]["rid"]): s["thread"] for s in complete_spans(load_trace(tr.path))}
    assert {k: v for k, v in lanes.items() if k[1] == "a"} == dict.fromkeys(
        [("request", "a"), ("queued", "a"), ("prefill", "a"), ("decode", "a"), ("finished", "a")], "requests"
    )
    assert {v for k, v in lanes.items() if k[1] == "b"} == {"requests #2"}
    events = [e for e in load_trace(tr.path) if e["ph"] == "X"]
    decode = next(e for e in events if e["name"] == "decode")
    req = next(e for e in events if e["name"] == "request" and e["args"]["rid"] == "a")
    assert decode["ts"] + decode["dur"] == req["ts"] + req["dur"]  # ends together, exactly (whole us)


def test_spans_without_a_request_id_never_nest(tmp_path):
    """Two concurrent rollouts, one inside the other in time, are not parent and child."""
    tr = Tracer(tmp_path / "t.json")
    tr.record("rollout", 10.0, 20.0, node="rollout", worker="gen")
    tr.record("rollout", 12.0, 15.0, node="rollout", worker="gen")
    tr.record("plan", 30.0, 30.0, cat="controller")
    tr.record("resume", 30.0, 30.0, cat="controller")  # marks at one instant share the lane
    tr.flush()
    assert [s["thread"] for s in complete_spans(load_trace(tr.path))] == [
        "rollout",
        "rollout #2",
        "controller",
        "controller",
    ]


def test_clock_offset_is_estimated_from_the_shortest_round_trip():
    from areal_graph.runtime.observability.clocks import estimate_offset

    local = iter([0.0, 0.030, 1.0, 1.002, 2.0, 2.050]).__next__  # round trips of 30, 2 and 50 ms
    # the remote clock is 2.5 s ahead; its replies are stamped at 25, 1 and 5 ms into each trip
    remote = iter([2.525, 3.501, 4.505]).__next__
    est = estimate_offset(remote, probes=3, clock=local)
    assert est.rtt_s == pytest.approx(0.002) and est.offset_s == pytest.approx(2.5, abs=est.uncertainty_s)
    assert est.correction_s == est.offset_s  # 2.5 s is far beyond the +-1 ms uncertainty


def test_an_offset_within_its_uncertainty_is_not_applied():
    from areal_graph.runtime.observability.clocks import ClockEstimate

    assert ClockEstimate(offset_s=0.0003, rtt_s=0.001).correction_s == 0.0
    assert ClockEstimate(offset_s=-0.004, rtt_s=0.001).correction_s == -0.004


def test_spans_of_a_process_with_a_skewed_clock_are_aligned_before_merge(tmp_path):
    from areal_graph.runtime.observability.clocks import ClockEstimate, ProcessClocks

    tr = Tracer(tmp_path / "t.json")
    t0 = time.perf_counter()
    server = SpanRecorder("inference-0", enabled=True)
    server._wall0 += 2.0  # its clock runs 2 s ahead of ours
    server.record("request", t0 + 0.1, t0 + 0.2, node="requests", rid="x")
    worker_span = {"name": "actor.train", "cat": "compute", "worker": "model-actor", "start": 0.0, "end": 1.0}
    clocks = ProcessClocks()
    clocks.set("inference-0", ClockEstimate(offset_s=2.0, rtt_s=0.001))
    clocks.set("model-actor", ClockEstimate(offset_s=0.0001, rtt_s=0.001))  # same host: left alone
    tr.record("rollout", t0, t0 + 0.3, node="rollout", worker="rollout")
    tr.merge(clocks.align(server.take() + [worker_span]))
    tr.flush()
    spans = {s["name"]: s for s in complete_spans(load_trace(tr.path))}
    rollout, req = spans["rollout"], spans["request"]
    assert rollout["ts"] + 100_000 - 2 <= req["ts"] <= rollout["ts"] + 100_000 + 2  # 0.1 s in, to the us
    assert spans["actor.train"]["ts"] == 0 and spans["actor.train"]["dur"] == 1_000_000


def test_a_real_worker_clock_probe_finds_no_offset_on_one_host():
    from areal_graph.runtime.observability.clocks import ProcessClocks, estimate_offset
    from areal_graph.runtime.rpc.worker_client import WorkerClient
    from areal_graph.runtime.rpc.worker_server import serve

    server, _, port = serve("w-clock", port=0)
    client = WorkerClient(f"127.0.0.1:{port}", name="w-clock", timeout=10)
    try:
        est = estimate_offset(lambda: client.stats(drain_spans=False)["now"])
        assert 0 < est.rtt_s < 0.5 and abs(est.offset_s) <= est.uncertainty_s + 1e-3
        clocks = ProcessClocks()
        clocks.probe("gone", lambda: 1 / 0)  # a failing probe is logged, never raised
        assert clocks.corrections() == {} and "gone" not in clocks.estimates
    finally:
        client.close()
        server.stop(0)


def test_the_trace_switch_turns_recording_off_in_a_process(monkeypatch):
    from areal_graph.api.spans import TRACE_ENV
    from areal_graph.runtime.rpc.worker_client import WorkerClient
    from areal_graph.runtime.rpc.worker_server import serve

    monkeypatch.setenv(TRACE_ENV, "0")
    rec = SpanRecorder("inference-0")
    with rec.span("x"):
        pass
    rec.record("y", 0.0, 1.0)
    assert not rec.enabled and rec.take() == []
    assert SpanRecorder("explicit", enabled=True).enabled  # an explicit choice wins over the environment
    server, service, port = serve("w-off", port=0)
    client = WorkerClient(f"127.0.0.1:{port}", name="w-off", timeout=10)
    try:
        client.health()
        client.configure("echo", "support.grpc_test_nodes:EchoNode", {"scale": 1.0, "label": "E"})
        stats = client.stats()
        assert stats["calls"] == 1 and stats["spans"] == []  # counted, not traced
    finally:
        client.close()
        server.stop(0)
    monkeypatch.setenv(TRACE_ENV, "1")
    assert SpanRecorder("on").enabled


def test_spans_are_pulled_in_the_background_and_a_failed_pull_is_only_logged(tmp_path, caplog):
    import asyncio

    from areal_graph.runtime.observability.span_pull import BackgroundSpanPull

    tr = Tracer(tmp_path / "t.json")
    calls, gates = [], []

    async def collect():
        calls.append(1)
        await gates[0].wait()
        return [{"name": "remote", "start": 1.0, "end": 2.0, "process": "w"}]

    async def go():
        gates.append(asyncio.Event())  # made inside the loop that waits on it
        pull = BackgroundSpanPull(tr, collect, every_s=0.0)
        pull.maybe_start()
        await asyncio.sleep(0.01)  # the caller went on while the pull waits on its processes
        pull.maybe_start()  # one pull in flight at a time
        assert len(calls) == 1 and not pull._task.done()
        gates[0].set()
        await pull.wait()
        failing = BackgroundSpanPull(tr, _fails, every_s=0.0)
        failing.maybe_start()
        await failing.wait()

    asyncio.run(go())
    tr.close()  # the pulls' own spans end past their horizon: held back until the last flush
    assert sorted(s["name"] for s in complete_spans(load_trace(tr.path))) == [
        "collect_spans",
        "collect_spans",
        "remote",
    ]
    assert "the trace has a gap" in caplog.text
    off = BackgroundSpanPull(NullTracer(), collect, every_s=0.0)
    off.maybe_start()  # tracing off: nothing is pulled (no event loop needed either)
    assert off._task is None and len(calls) == 1


async def _fails():
    raise RuntimeError("process gone")
