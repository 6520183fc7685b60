"""engine_spans.py's hooks driven by hand, with chosen clock values, against a recording stub.

tests/engines/inference/test_engine_spans.py runs the real engine and checks the spans it
yields (that file name is taken, hence this one); there the clock is real, so the exact
boundaries and clipping rules can only be checked loosely. Here every hook gets explicit
times, so each span's start, end and arguments are asserted exactly: the phase sequence of a
request, token counts per decode stretch, an interruption (and a second swap before the
re-prefill), engine pauses clipped to each phase, requests without a timeline (tracing off),
and the busy-interval merging the server ships as compute spans.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from areal_graph.engines.inference import engine_spans
from areal_graph.engines.inference.engine_spans import (
    ENGINE_TRACK,
    REQUEST_TRACK,
    BusyIntervals,
    EngineSpans,
    RequestTimeline,
)


class Recorder:
    """Keeps what `SpanRecorder.record` is given."""

    def __init__(self) -> None:
        self.spans: list[dict] = []

    def record(self, name, start, end, cat="", node=None, **args):
        self.spans.append({"name": name, "start": start, "end": end, "cat": cat, "node": node, **args})

    def named(self, name: str) -> list[dict]:
        return [s for s in self.spans if s["name"] == name]


def request(rid: str = "r", prompt=(1, 2, 3), submitted: float | None = 1.0):
    req = SimpleNamespace(rid=rid, prompt=list(prompt), output_ids=[], versions=[], finish_reason=None, timeline=None)
    if submitted is not None:
        req.timeline = RequestTimeline(submitted)
    return req


def phases(rec: Recorder) -> list[tuple]:
    """(name, start, end, args without the common ones) of the request's phase spans, in order."""
    common = {"name", "start", "end", "cat", "node", "rid"}
    return [
        (s["name"], s["start"], s["end"], {k: v for k, v in s.items() if k not in common})
        for s in rec.spans
        if s["name"] not in ("request", "finished")
    ]


def test_submitted_starts_a_queued_timeline_on_the_perf_counter():
    spans = EngineSpans(Recorder())
    req = request(submitted=None)
    before = time.perf_counter()
    spans.submitted(req)
    after = time.perf_counter()
    tl = req.timeline
    assert isinstance(tl, RequestTimeline) and tl.phase == "queued" and tl.closed == [] and tl.interruptions == 0
    assert before <= tl.submitted == tl.since <= after


def test_a_request_without_interruptions():
    rec = Recorder()
    spans = EngineSpans(rec)
    req = request()
    spans.prefill_started([req], 2.0)
    req.output_ids.append(7)
    req.versions.append(3)
    spans.prefill_done([req], 3.0)
    req.output_ids += [8, 9, 10]
    req.versions += [3, 3, 3]
    req.finish_reason = "length"
    spans.finished(req, 6.0)
    assert req.timeline is None
    [whole] = rec.named("request")
    assert whole == {
        "name": "request",
        "start": 1.0,
        "end": 6.0,
        "cat": "request",
        "node": REQUEST_TRACK,
        "rid": "r",
        "prompt_tokens": 3,
        "output_tokens": 4,
        "finish_reason": "length",
        "interruptions": 0,
        "version_first": 3,
        "version_last": 3,
    }
    assert phases(rec) == [
        ("queued", 1.0, 2.0, {}),
        ("prefill", 2.0, 3.0, {"prefill_tokens": 3}),
        ("decode", 3.0, 6.0, {"output_tokens": 3}),
    ]
    [end] = rec.named("finished")
    assert (end["start"], end["end"], end["finish_reason"], end["prompt_tokens"], end["output_tokens"]) == (
        6.0,
        6.0,
        "length",
        3,
        4,
    )
    assert all(s["cat"] == "request" and s["node"] == REQUEST_TRACK and s["rid"] == "r" for s in rec.spans)
    assert [s["name"] for s in rec.spans] == ["request", "queued", "prefill", "decode", "finished"]


def test_an_interrupted_request_resumes_with_the_latest_version():
    rec = Recorder()
    spans = EngineSpans(rec)
    req = request(prompt=(1, 2))
    spans.prefill_started([req], 2.0)
    req.output_ids.append(5)
    req.versions.append(0)
    spans.prefill_done([req], 3.0)
    req.output_ids.append(6)
    req.versions.append(0)
    spans.interrupted([req], 4.0, version_before=0, version_after=1)
    spans.interrupted([req], 4.5, version_before=1, version_after=2)  # a second swap before it re-prefilled
    spans.prefill_started([req], 5.0)  # prompt + the 2 tokens so far
    req.output_ids.append(7)
    req.versions.append(2)
    spans.prefill_done([req], 5.5)
    req.output_ids.append(8)
    req.versions.append(2)
    req.finish_reason = "stop"
    spans.finished(req, 7.0)
    assert phases(rec) == [
        ("queued", 1.0, 2.0, {}),
        ("prefill", 2.0, 3.0, {"prefill_tokens": 2}),
        ("decode", 3.0, 4.0, {"output_tokens": 1}),
        ("interrupted", 4.0, 5.0, {"version_before": 0, "version_after": 2}),
        ("resumed", 5.0, 5.5, {"prefill_tokens": 4, "version": 2}),
        ("decode", 5.5, 7.0, {"output_tokens": 1}),
    ]
    [whole] = rec.named("request")
    assert (whole["interruptions"], whole["version_first"], whole["version_last"], whole["output_tokens"]) == (
        1,
        0,
        2,
        4,
    )


def test_a_swap_before_the_first_token_is_not_an_interruption():
    rec = Recorder()
    spans = EngineSpans(rec)
    queued, prefilling = request("q"), request("p")
    spans.prefill_started([prefilling], 2.0)
    spans.interrupted([queued, prefilling], 2.5, 0, 1)
    assert queued.timeline.phase == "queued" and prefilling.timeline.phase == "prefill"
    assert queued.timeline.interruptions == prefilling.timeline.interruptions == 0


def test_a_request_finished_by_its_prefill_never_decodes():
    rec = Recorder()
    spans = EngineSpans(rec)
    req = request()
    spans.prefill_started([req], 2.0)
    req.output_ids.append(2)
    req.finish_reason = "stop"  # its first token was EOS
    spans.prefill_done([req], 3.0)
    spans.finished(req, 3.0)
    assert phases(rec) == [("queued", 1.0, 2.0, {}), ("prefill", 2.0, 3.0, {"prefill_tokens": 3})]


def test_an_aborted_request_has_abort_and_no_versions_and_reason_overrides():
    rec = Recorder()
    spans = EngineSpans(rec)
    spans.finished(request("a"), 2.0)  # still queued, never finished by the engine
    spans.finished(request("b"), 2.0, reason="stop")
    first, second = rec.named("request")
    assert (first["finish_reason"], first["version_first"], first["version_last"], first["output_tokens"]) == (
        "abort",
        None,
        None,
        0,
    )
    assert second["finish_reason"] == "stop" and rec.named("finished")[1]["finish_reason"] == "stop"
    assert [p[0] for p in phases(rec)] == ["queued", "queued"]


def test_requests_without_a_timeline_are_ignored():
    rec = Recorder()
    spans = EngineSpans(rec)
    req = request(submitted=None)
    req.output_ids.append(1)
    spans.prefill_started([req], 1.0)
    spans.prefill_done([req], 1.0)
    spans.interrupted([req], 1.0, 0, 1)
    spans.finished(req, 2.0)
    assert rec.spans == [] and req.timeline is None


def test_engine_pauses_are_recorded_and_clipped_to_each_phase():
    rec = Recorder()
    spans = EngineSpans(rec)
    spans.paused(0.5)
    spans.resumed(1.5)  # began before the request: only its part from submission counts
    spans.paused(2.5)
    spans.paused(2.7)  # already paused: the first start stays
    spans.resumed(3.5)
    spans.resumed(3.6)  # not paused: nothing
    spans.paused(5.5)  # still open when the request finishes
    req = request()
    spans.prefill_started([req], 2.0)
    req.output_ids.append(4)
    spans.prefill_done([req], 3.0)
    spans.finished(req, 6.0)
    engine = [(s["start"], s["end"]) for s in rec.spans if s["cat"] == "pause"]
    assert engine == [(0.5, 1.5), (2.5, 3.5)]
    assert all(s["node"] == ENGINE_TRACK for s in rec.spans if s["cat"] == "pause")
    in_request = [(s["start"], s["end"]) for s in rec.spans if s["name"] == "paused" and s["cat"] == "request"]
    assert in_request == [(1.0, 1.5), (2.5, 3.0), (3.0, 3.5), (5.5, 6.0)]
    names = [s["name"] for s in rec.spans if s["cat"] == "request"]
    assert names == ["request", "queued", "paused", "prefill", "paused", "decode", "paused", "paused", "finished"]


def test_pauses_outside_a_request_are_not_in_it():
    rec = Recorder()
    spans = EngineSpans(rec)
    spans.paused(0.1)
    spans.resumed(0.9)
    spans.paused(9.0)
    spans.resumed(9.5)
    spans.finished(request(), 2.0)
    assert not [s for s in rec.spans if s["name"] == "paused" and s["cat"] == "request"]


def test_only_the_latest_pauses_are_remembered(monkeypatch):
    monkeypatch.setattr(engine_spans, "_PAUSES_KEPT", 2)
    rec = Recorder()
    spans = EngineSpans(rec)
    req = request(submitted=0.0)
    for a in (1.0, 3.0, 5.0, 7.0, 9.0):  # the fifth exceeds 2 * 2: the oldest are dropped, 2 kept
        spans.paused(a)
        spans.resumed(a + 1.0)
    spans.finished(req, 11.0)
    assert [(s["start"], s["end"]) for s in rec.spans if s["cat"] == "pause"] == [
        (1.0, 2.0),
        (3.0, 4.0),
        (5.0, 6.0),
        (7.0, 8.0),
        (9.0, 10.0),
    ]  # the engine spans all went out
    assert [(s["start"], s["end"]) for s in rec.spans if s["name"] == "paused" and s["cat"] == "request"] == [
        (7.0, 8.0),
        (9.0, 10.0),
    ]


def test_weight_swap_span():
    rec = Recorder()
    EngineSpans(rec).weight_swap(requested=1.0, start=1.25, end=2.0, version_before=3, version_after=4, interrupted=5)
    assert rec.spans == [
        {
            "name": "weight_swap",
            "start": 1.25,
            "end": 2.0,
            "cat": "weights",
            "node": ENGINE_TRACK,
            "version_before": 3,
            "version_after": 4,
            "interrupted": 5,
            "waited_s": 0.25,
        }
    ]


def test_timeline_decode_stretches_count_their_own_tokens():
    tl = RequestTimeline(0.0)
    tl.enter("decode", 1.0, tokens_so_far=1)
    tl.enter("interrupted", 2.0, tokens_so_far=6, args={"version_before": 0, "version_after": 1})
    tl.close(3.0, 6)
    assert tl.closed == [
        ("queued", 0.0, 1.0, None),
        ("decode", 1.0, 2.0, {"output_tokens": 5}),
        ("interrupted", 2.0, 3.0, {"version_before": 0, "version_after": 1}),
    ]


def test_busy_intervals_merge_back_to_back_steps():
    busy = BusyIntervals()
    busy.note(1.0, 1.1)
    busy.note(1.101, 1.2)  # 1 ms after: the same busy stretch
    busy.note(1.3, 1.4)  # 100 ms after: a new one
    assert busy.take() == [(1.0, 1.2), (1.3, 1.4)]
    assert busy.take() == []
    busy.enabled = False
    busy.note(2.0, 2.1)
    assert busy.take() == []


def test_busy_intervals_keep_the_latest_when_nobody_collects(monkeypatch):
    monkeypatch.setattr(engine_spans, "_BUSY_KEEP", 3)
    busy = BusyIntervals()
    for i in range(5):
        busy.note(float(i), i + 0.5)
    assert busy.take() == [(2.0, 2.5), (3.0, 3.5), (4.0, 4.5)]
