"""The embedded engine's per-request trace spans: phases, token counts, interruptions, aborts.

The engine records into a `SpanRecorder` (what the HTTP server hands it); `take()` gives the
spans as the controller receives them. Tiny random Qwen2 on the CPU: seconds per test.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from areal_graph.api.spans import SpanRecorder
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.runtime.observability.tracing import Tracer, complete_spans, load_trace
from support.tiny_models import build_random_qwen2

PHASES = ("queued", "prefill", "decode", "interrupted", "resumed")


@pytest.fixture(scope="module")
def model():
    return build_random_qwen2(vocab_size=128, seed=0)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, greedy=True, ignore_eos=True)


def traced_engine(model, **kw) -> tuple[EmbeddedEngine, SpanRecorder]:
    eng = EmbeddedEngine(model=model, **kw)
    rec = SpanRecorder("inference-0", enabled=True)
    eng.trace_into(rec)
    return eng, rec


def by_request(spans: list[dict]) -> dict[str, list[dict]]:
    """rid -> its spans (the request span first, then its children by start time)."""
    out = {}
    for r in (s for s in spans if s["name"] == "request"):
        rid = r["args"]["rid"]
        inside = [s for s in spans if s is not r and s["node"] == "requests" and s["args"].get("rid") == rid]
        assert all(r["start"] <= s["start"] and s["end"] <= r["end"] for s in inside)
        out[rid] = [r] + sorted(inside, key=lambda s: (s["start"], s["name"] == "finished"))
    return out


def phases(spans: list[dict]) -> list[dict]:
    return [s for s in spans if s["name"] in PHASES]


def wait_tokens(eng: EmbeddedEngine, n: int, timeout: float = 20.0) -> None:
    t0 = time.monotonic()
    while eng.stats()["tokens_generated"] < n:
        assert time.monotonic() - t0 < timeout, "the engine made no progress"
        time.sleep(0.002)


def test_a_normal_request_has_contiguous_phases_and_its_token_counts(model):
    eng, rec = traced_engine(model)
    prompt = [1, 5, 9, 11, 20]
    with eng:
        res = eng.submit(prompt, greedy(7), rid="a").result(timeout=30)
    spans = by_request(rec.take())["a"]
    req = spans[0]
    assert req["cat"] == "request" and req["process"] == "inference-0"
    assert req["args"] == {
        "rid": "a",
        "prompt_tokens": 5,
        "output_tokens": 7,
        "finish_reason": "length",
        "interruptions": 0,
        "version_first": 0,
        "version_last": 0,
    }
    ph = phases(spans)
    assert [s["name"] for s in ph] == ["queued", "prefill", "decode"]
    assert ph[0]["start"] == req["start"] and ph[-1]["end"] == req["end"]
    assert all(a["end"] == b["start"] for a, b in zip(ph, ph[1:]))  # no gaps, no overlaps
    assert ph[1]["args"] == {"rid": "a", "prefill_tokens": 5}
    assert ph[2]["args"] == {"rid": "a", "output_tokens": 6}  # the prefill made the first of the 7
    fin = spans[-1]
    assert fin["name"] == "finished" and fin["start"] == fin["end"] == req["end"]
    assert fin["args"] == {"rid": "a", "finish_reason": "length", "prompt_tokens": 5, "output_tokens": 7}
    assert len(res.output_ids) == 7
    assert not [s for s in spans if s["name"] == "paused"]


def test_an_interrupted_request_records_versions_before_and_after(model):
    eng, rec = traced_engine(model, version=3)
    ps = [[1, 5, 9], [2, 6, 10, 14], [3, 7]]
    n = 30
    with eng:
        futs = [eng.submit(p, greedy(n), rid=f"r{i}") for i, p in enumerate(ps)]
        wait_tokens(eng, 3 * 5)
        eng.pause()
        eng.update_weights_from_state_dict(build_random_qwen2(vocab_size=128, seed=1).state_dict(), version=4)
        eng.resume()
        results = [f.result(timeout=60) for f in futs]
    spans = rec.take()
    reqs = by_request(spans)
    for i, (p, res) in enumerate(zip(ps, results)):
        k = res.output_versions.index(4)  # tokens made before the swap
        mine = reqs[f"r{i}"]
        assert mine[0]["args"]["interruptions"] == 1
        assert (mine[0]["args"]["version_first"], mine[0]["args"]["version_last"]) == (3, 4)
        ph = phases(mine)
        assert [s["name"] for s in ph] == ["queued", "prefill", "decode", "interrupted", "resumed", "decode"]
        assert all(a["end"] == b["start"] for a, b in zip(ph, ph[1:]))
        assert ph[3]["args"] == {"rid": f"r{i}", "version_before": 3, "version_after": 4}
        assert ph[4]["args"] == {"rid": f"r{i}", "prefill_tokens": len(p) + k}  # prompt + tokens so far
        assert ph[4]["version"] == 4  # the span's version: the weights it re-prefilled with
        # every token is counted once: one per prefill, the rest in the decode stretches
        assert ph[2]["args"]["output_tokens"] == k - 1 and ph[5]["args"]["output_tokens"] == n - k - 1
        # the pause (from before the swap until resume) shows inside the phases it covered
        paused = [s for s in mine if s["name"] == "paused"]
        assert paused and paused[0]["end"] == ph[2]["end"] and paused[-1]["start"] >= ph[3]["start"]
    swap = [s for s in spans if s["name"] == "weight_swap"]
    assert len(swap) == 1 and swap[0]["node"] == "weights"
    assert {k: swap[0]["args"][k] for k in ("version_before", "version_after", "interrupted")} == {
        "version_before": 3,
        "version_after": 4,
        "interrupted": 3,
    }
    engine_pause = [s for s in spans if s["name"] == "paused" and s["cat"] == "pause"]
    assert len(engine_pause) == 1
    assert engine_pause[0]["start"] <= swap[0]["start"] <= swap[0]["end"] <= engine_pause[0]["end"]


def test_a_swap_without_pause_interrupts_running_requests_only(model):
    """The engine's own weight sync (no pause): requests still queued are not interrupted."""
    eng, rec = traced_engine(model, max_running=1)
    with eng:
        running = eng.submit([1, 2, 3], greedy(40), rid="run")
        queued = eng.submit([4, 5], greedy(3), rid="wait")
        wait_tokens(eng, 4)
        eng.update_weights_from_state_dict(build_random_qwen2(vocab_size=128, seed=1).state_dict(), version=1)
        running.result(timeout=60), queued.result(timeout=60)
    reqs = by_request(rec.take())
    assert "interrupted" in [s["name"] for s in reqs["run"]]
    assert [s["name"] for s in phases(reqs["wait"])] == ["queued", "prefill", "decode"]
    assert reqs["wait"][0]["args"]["interruptions"] == 0


def test_aborted_requests_end_with_abort_and_the_tokens_they_had(model):
    eng, rec = traced_engine(model, max_running=1)
    with eng:
        running = eng.submit([1, 2, 3], greedy(200), rid="run")
        queued = eng.submit([4, 5], greedy(10), rid="wait")
        wait_tokens(eng, 5)
        eng.pause()
        assert eng.abort("wait") and eng.abort("run")
        r_run, r_wait = running.result(timeout=5), queued.result(timeout=5)
        eng.resume()
    reqs = by_request(rec.take())
    wait = reqs["wait"]
    assert [s["name"] for s in phases(wait)] == ["queued"]
    assert wait[0]["args"]["finish_reason"] == "abort" and wait[0]["args"]["output_tokens"] == 0
    assert wait[-1]["name"] == "finished" and wait[-1]["args"]["output_tokens"] == 0
    run = reqs["run"]
    assert [s["name"] for s in phases(run)] == ["queued", "prefill", "decode"]
    assert run[0]["args"]["output_tokens"] == len(r_run.output_ids) > 0 and r_wait.output_ids == []
    assert run[0]["args"]["finish_reason"] == "abort"
    assert phases(run)[-1]["args"]["output_tokens"] == len(r_run.output_ids) - 1
    assert [s["name"] for s in run if s["name"] == "paused"] == ["paused"]  # aborted while paused


def test_a_disabled_recorder_turns_all_engine_recording_off(model):
    eng = EmbeddedEngine(model=model)
    rec = SpanRecorder("inference-0", enabled=False)
    eng.trace_into(rec)
    with eng:
        eng.submit([1, 2, 3], greedy(4)).result(timeout=30)
        eng.update_weights_from_state_dict(model.state_dict(), version=1)
    assert rec.take() == [] and eng.take_busy_spans() == []
    with rec.span("x"):
        pass
    rec.record("y", 0.0, 1.0)
    assert len(rec) == 0


def test_request_phases_nest_on_one_lane_of_the_trace(model, tmp_path):
    """In the Chrome trace a request's phases sit on its own lane, nested in its span."""
    eng, rec = traced_engine(model)
    with eng:
        futs = [eng.submit([1, 2, 3 + i], greedy(6), rid=f"q{i}") for i in range(4)]
        [f.result(timeout=30) for f in futs]
    tr = Tracer(tmp_path / "trace.json")
    tr.merge(rec.take())
    tr.flush()
    spans = [s for s in complete_spans(load_trace(tr.path)) if s["cat"] == "request"]
    lanes = {}
    for s in spans:
        lanes.setdefault(s["tid"], []).append(s)
    for lane in lanes.values():
        parents = [s for s in lane if s["name"] == "request"]
        for child in lane:
            assert any(p["ts"] <= child["ts"] and child["ts"] + child["dur"] <= p["ts"] + p["dur"] for p in parents)
    assert sum(1 for s in spans if s["name"] == "request") == 4


def test_http_server_serves_engine_spans_and_its_clock(model):
    from aiohttp.test_utils import TestClient, TestServer

    from areal_graph.engines.inference.server.http_server import InferenceHTTPServer

    eng = EmbeddedEngine(model=model)
    server = InferenceHTTPServer(eng, name="inference-7")

    async def go():
        async with TestClient(TestServer(server.app)) as client:
            r = await client.post(
                "/generate",
                json={"input_ids": [1, 2, 3], "rid": "h", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
            )
            assert r.status == 200
            before = time.time()
            clock = await (await client.get("/get_clock")).json()
            after = time.time()
            spans = (await (await client.get("/get_spans")).json())["spans"]
            return clock, before, after, spans

    with eng:
        clock, before, after, spans = asyncio.run(go())
    assert before - 0.05 <= clock["now"] <= after + 0.05  # same host: the same clock
    names = [s["name"] for s in spans if s["cat"] == "request"]
    assert names.count("request") == 1 and {"queued", "prefill", "decode", "finished"} <= set(names)
    assert all(s["process"] == "inference-7" for s in spans)
