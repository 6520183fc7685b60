"""The client's SGLang side and the ServerPool, against an in-test server speaking SGLang's API.

SGLang cannot run on this CPU machine, so these tests pin down what the client must do with
SGLang's documented behaviour: no per-token versions (only `meta_info.weight_version`, a
string), pause aborts in-flight requests, a weight update is pause -> update -> continue.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp import web

from areal_graph.engines.inference.client import (
    InferenceClient,
    RequestRejected,
    ServerPool,
    ServerUnavailable,
    sampling_to_json,
)
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.engines.inference.sampling import SamplingParams


class FakeSGLang:
    """Decodes token (last + 1) % 50 every 5 ms; SGLang's JSON and pause/abort semantics."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.weight_version = "default"
        self.paused = asyncio.Event()
        self.paused.set()  # set == running
        self.inflight: dict[str, asyncio.Event] = {}
        self.in_flight_now = 0
        self.max_in_flight = 0
        self.fail_next = 0  # answer 503 this many times
        self.bodies: list[dict] = []
        self.pause_modes: list[str | None] = []
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        for name in ("pause_generation", "continue_generation", "update_weights_from_disk", "abort_request"):
            app.router.add_post(f"/{name}", getattr(self, name))
        app.router.add_get("/health", self.health)
        app.router.add_get("/get_model_info", self.model_info)
        self.app = app

    async def generate(self, request):
        body = await request.json()
        self.calls.append("generate")
        self.bodies.append(body)
        if self.fail_next:
            self.fail_next -= 1
            return web.json_response({"object": "error", "message": "busy", "code": 503}, status=503)
        await self.paused.wait()  # SGLang holds new requests while paused
        rid = body["rid"]
        ids = list(body["input_ids"])
        start = body.get("logprob_start_len", -1)
        if start != -1 and start >= len(ids):  # SGLang's scheduler aborts such a request at once
            meta = {
                "id": rid,
                "prompt_tokens": len(ids),
                "completion_tokens": 0,
                "weight_version": self.weight_version,
                "finish_reason": {
                    "type": "abort",
                    "message": f"req.logprob_start_len={start} is higher than "
                    f"the number of input tokens len(req.origin_input_ids)={len(ids)}.",
                },
                "output_token_logprobs": [],
            }
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        abort = self.inflight[rid] = asyncio.Event()
        self.in_flight_now += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight_now)
        out = []
        reason = {"type": "length", "length": body["sampling_params"]["max_new_tokens"]}
        try:
            for _ in range(body["sampling_params"]["max_new_tokens"]):
                if abort.is_set():
                    reason = {"type": "abort", "message": "Abort in waiting queue"}
                    break
                await asyncio.sleep(0.005)
                out.append((ids + out)[-1] % 50 + 1)
        finally:
            self.in_flight_now -= 1
            self.inflight.pop(rid, None)
        meta = {
            "id": rid,
            "finish_reason": reason,
            "prompt_tokens": len(ids),
            "completion_tokens": len(out),
            "weight_version": self.weight_version,
            "output_token_logprobs": [[-0.5, t, None] for t in out],
        }
        return web.json_response({"text": "", "output_ids": out, "meta_info": meta})

    async def pause_generation(self, request):
        body = await request.json() if request.can_read_body else {}
        self.calls.append("pause_generation")
        self.pause_modes.append(body.get("mode"))
        self.paused.clear()
        if body.get("mode", "abort") == "abort":  # PauseGenerationReqInput.mode defaults to abort
            for ev in self.inflight.values():
                ev.set()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request):
        self.calls.append("continue_generation")
        self.paused.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(self, request):
        body = await request.json()
        self.calls.append("update_weights_from_disk")
        if body["model_path"] == "/missing":
            return web.json_response({"success": False, "message": "no such dir", "num_paused_requests": 0}, status=400)
        await asyncio.sleep(0.05)
        self.weight_version = body.get("weight_version", self.weight_version)
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def abort_request(self, request):
        body = await request.json()
        self.calls.append("abort_request")
        for rid, ev in self.inflight.items():
            if body.get("abort_all") or rid == body.get("rid"):
                ev.set()
        return web.Response(status=200)

    async def health(self, request):
        return web.Response(status=200)

    async def model_info(self, request):
        return web.json_response({"model_path": "m", "is_generation": True, "weight_version": self.weight_version})


async def _start(fake: FakeSGLang) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def run(coro):
    return asyncio.run(coro)


def test_sampling_json_uses_sglang_names():
    sp = sampling_to_json(
        SamplingParams(max_new_tokens=7, greedy=True, top_k=5, stop=["\n"], stop_token_ids=[2], seed=3)
    )
    assert sp == {
        "max_new_tokens": 7,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 5,
        "ignore_eos": False,
        "stop_token_ids": [2],
        "stop": ["\n"],
        "sampling_seed": 3,
    }


def test_generate_without_per_token_versions_uses_weight_version():
    async def go():
        fake = FakeSGLang()
        runner, url = await _start(fake)
        client = InferenceClient(url, backend="sglang", version=4)
        try:
            r1 = await client.generate([1, 2], SamplingParams(max_new_tokens=3))  # weight_version "default"
            fake.weight_version = "9"
            r2 = await client.generate([1, 2], SamplingParams(max_new_tokens=2))
            return r1, r2, fake.bodies
        finally:
            await client.close()
            await runner.cleanup()

    r1, r2, bodies = run(go())
    assert r1.output_ids == [3, 4, 5] and r1.output_versions == [4, 4, 4] and r1.finish_reason == "length"
    assert r1.output_logprobs == [-0.5] * 3
    assert r2.output_versions == [9, 9]
    assert bodies[0]["return_logprob"] is True and bodies[0]["stream"] is False
    # GenerateReqInput fields only; logprob_start_len >= len(input_ids) makes SGLang abort the request
    assert set(bodies[0]) <= {"input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len"}
    assert bodies[0].get("logprob_start_len", -1) < len(bodies[0]["input_ids"])


def test_weight_update_is_pause_update_continue_and_interrupted_requests_resume():
    async def go():
        fake = FakeSGLang()
        runner, url = await _start(fake)
        roll = InferenceClient(url, backend="sglang", version=0)
        ctrl = InferenceClient(url, backend="sglang", version=0)
        try:
            fake.weight_version = "0"
            params = SamplingParams(max_new_tokens=60)
            tasks = [
                asyncio.create_task(generate_interruptible(roll, [1, i + 1], params, rid=f"q{i}")) for i in range(3)
            ]
            await asyncio.sleep(0.1)
            await ctrl.update_weights_from_disk("/new", 1)
            gens = await asyncio.gather(*tasks)
            return gens, fake.calls, ctrl.version, fake.pause_modes
        finally:
            await roll.close()
            await ctrl.close()
            await runner.cleanup()

    gens, calls, version, modes = run(go())
    control = [c for c in calls if c != "generate"]  # resubmissions interleave freely
    assert control == ["pause_generation", "update_weights_from_disk", "continue_generation"]
    assert modes == ["abort"]  # explicit, so a server whose default mode differs still aborts
    assert version == 1
    for k, g in enumerate(gens):
        assert g.finish_reason == "length" and len(g.output_ids) == 60
        # the fake's 'model' ignores versions, so the concatenation equals one uninterrupted run
        seq = [1, k + 1]
        for _ in range(60):
            seq.append(seq[-1] % 50 + 1)
        assert g.output_ids == seq[2:]
        assert g.num_interruptions == 1
        vs = g.output_versions
        assert vs == sorted(vs) and vs[0] == 0 and vs[-1] == 1


def test_user_abort_returns_abort_without_resubmitting():
    async def go():
        fake = FakeSGLang()
        runner, url = await _start(fake)
        client = InferenceClient(url, backend="sglang")
        try:
            task = asyncio.create_task(
                generate_interruptible(client, [1, 2], SamplingParams(max_new_tokens=500), rid="u")
            )
            await asyncio.sleep(0.1)
            await client.abort("u")
            g = await task
            return g, fake.calls.count("generate")
        finally:
            await client.close()
            await runner.cleanup()

    g, n_generate = run(go())
    assert g.finish_reason == "abort" and 0 < len(g.output_ids) < 500
    assert n_generate == 1


def test_failed_update_raises_and_still_continues():
    async def go():
        fake = FakeSGLang()
        runner, url = await _start(fake)
        client = InferenceClient(url, backend="sglang")
        try:
            with pytest.raises(RequestRejected, match="no such dir"):
                await client.update_weights_from_disk("/missing", 1)
            return fake.calls, client.version, client.updating
        finally:
            await client.close()
            await runner.cleanup()

    calls, version, updating = run(go())
    assert calls[-1] == "continue_generation" and version == 0 and not updating


def test_retries_on_503_then_unavailable():
    async def go():
        fake = FakeSGLang()
        runner, url = await _start(fake)
        client = InferenceClient(url, backend="sglang", retries=3, backoff_s=0.01)
        try:
            fake.fail_next = 2
            ok = await client.generate([1], SamplingParams(max_new_tokens=2))
            fake.fail_next = 10
            with pytest.raises(ServerUnavailable, match="4 attempt"):
                await client.generate([1], SamplingParams(max_new_tokens=2))
            return ok, client.stats.retries
        finally:
            await client.close()
            await runner.cleanup()

    ok, retries = run(go())
    assert ok.output_ids == [2, 3] and retries == 2 + 3


def test_connection_refused_is_retried_and_wait_ready_times_out():
    async def go():
        client = InferenceClient("http://127.0.0.1:9", retries=2, backoff_s=0.01)
        with pytest.raises(ServerUnavailable, match="3 attempt"):
            await client.generate([1], SamplingParams(max_new_tokens=1))
        with pytest.raises(ServerUnavailable, match="healthy"):
            await client.wait_ready(timeout=0.3, interval=0.05)
        await client.close()

    run(go())


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend 'tgi'"):
        InferenceClient("http://x", backend="tgi")


def test_pool_spreads_by_outstanding_and_broadcasts_updates():
    async def go():
        fakes = [FakeSGLang() for _ in range(3)]
        started = [await _start(f) for f in fakes]
        pool = ServerPool([InferenceClient(url, backend="sglang") for _, url in started])
        try:
            params = SamplingParams(max_new_tokens=20)
            res = await asyncio.gather(*(pool.generate([1, i], params) for i in range(12)))
            await pool.update_weights_from_disk("/w", 5)
            return res, [f.bodies for f in fakes], [f.calls for f in fakes], pool.version
        finally:
            await pool.close()
            for runner, _ in started:
                await runner.cleanup()

    res, bodies, calls, version = run(go())
    assert [len(b) for b in bodies] == [4, 4, 4]  # concurrent requests split evenly
    assert all(len(r.output_ids) == 20 for r in res)
    for c in calls:
        assert [x for x in c if x != "generate"] == [
            "pause_generation",
            "update_weights_from_disk",
            "continue_generation",
        ]
    assert version == 5
    assert not math.isnan(res[0].output_logprobs[0])
