"""The SGLang-compatible HTTP server, in a real subprocess with the real embedded engine.

One server per module (startup is the expensive part). Raw HTTP (no client-side retries)
where the status code is the point; the InferenceClient where the result is.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request

import pytest
import torch

from areal_graph.engines.inference.sampling import SamplingParams

MAX_QUEUE = 4
DEVICE = os.environ.get("AREAL_TEST_DEVICE", "cpu")  # the server's device; references stay on the CPU
MAX_RUNNING = 4


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    from areal_graph.engines.inference.server.process import ServerProcess

    proc = ServerProcess(
        str(tiny_model_dir),
        extra_args=[
            "--threads",
            "1",
            "--max-running",
            str(MAX_RUNNING),
            "--max-queue",
            str(MAX_QUEUE),
            "--device",
            DEVICE,
        ],
    )
    proc.start()
    yield proc.url
    proc.stop()


def post(url: str, path: str, body, timeout: float = 60.0) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def get(url: str, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@torch.no_grad()
def greedy_reference(model_dir, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by plain full forwards in float64 (no KV cache): independent of the engine."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    seq, lps = list(prompt), []
    for _ in range(n):
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1], -1)
        tok = int(logp.argmax())
        seq.append(tok)
        lps.append(float(logp[tok]))
    return seq[len(prompt) :], lps


# --------------------------------------------------------------------------- SGLang shape
def test_generate_returns_sglang_shape_and_greedy_tokens(server, tiny_model_dir):
    prompt = [1, 17, 23, 5, 9]
    status, body = post(
        server,
        "/generate",
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
            "rid": "shape-1",
        },
    )
    assert status == 200, body
    meta = body["meta_info"]
    assert meta["id"] == "shape-1"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 12
    assert isinstance(meta["weight_version"], str)
    pairs = meta["output_token_logprobs"]
    assert [p[1] for p in pairs] == body["output_ids"]
    assert meta["output_token_versions"] == [int(meta["weight_version"])] * 12
    ref_ids, ref_lps = greedy_reference(tiny_model_dir, prompt, 12)
    assert body["output_ids"] == ref_ids
    assert [p[0] for p in pairs] == pytest.approx(ref_lps, abs=1e-3)


def test_logprob_start_len_returns_the_prompts_log_probs(server, tiny_model_dir):
    """SGLang's input_token_logprobs: [logprob, id, null] from logprob_start_len on, null for the
    prompt's first token; against a float64 forward with transformers alone."""
    from transformers import AutoModelForCausalLM

    prompt = [1, 17, 23, 5, 9, 44, 3]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0], -1)
    ref = [None] + [float(logp[t - 1, prompt[t]]) for t in range(1, len(prompt))]
    for start in (0, 3):
        status, body = post(
            server,
            "/generate",
            {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 2},
                "return_logprob": True,
                "logprob_start_len": start,
            },
        )
        assert status == 200, body
        pairs = body["meta_info"]["input_token_logprobs"]
        assert [p[1] for p in pairs] == prompt[start:] and all(p[2] is None for p in pairs)
        for got, want in zip([p[0] for p in pairs], ref[start:]):
            assert (got is None) == (want is None) and (want is None or abs(got - want) <= 1e-4)
    status, body = post(server, "/generate", {"input_ids": prompt, "return_logprob": True})
    assert "input_token_logprobs" not in body["meta_info"]  # the default, -1: output log-probs only
    status, err = post(server, "/generate", {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 7})
    assert status == 400 and "logprob_start_len" in err["message"]


def test_streamed_generate_sends_the_answer_so_far_then_done(server):
    """SGLang's stream: cumulative output_ids / log-probs / versions, finish_reason null until the
    last event, which equals the unstreamed answer."""
    body = {
        "input_ids": [1, 17, 23, 5],
        "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
    }
    status, whole = post(server, "/generate", body)
    req = urllib.request.Request(
        server + "/generate",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert len(chunks) >= 2
    lengths = [len(c["output_ids"]) for c in chunks]
    assert lengths == sorted(lengths) and all(
        c["output_ids"] == chunks[-1]["output_ids"][: len(c["output_ids"])] for c in chunks
    )
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["output_ids"] == whole["output_ids"] and last["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 40,
    }
    assert [p[0] for p in last["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [p[0] for p in whole["meta_info"]["output_token_logprobs"]], abs=1e-5
    )


def test_client_matches_engine_in_process(server, tiny_model_dir):
    from areal_graph.engines.inference.client import InferenceClient
    from areal_graph.engines.inference.engine import EmbeddedEngine

    prompts = [[1, 4, 8, 15, 16, 23, 42], [1, 99], [1, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
    params = SamplingParams(max_new_tokens=20, greedy=True, ignore_eos=True)

    async def via_http():
        client = InferenceClient(server)
        try:
            return await asyncio.gather(*(client.generate(p, params) for p in prompts))
        finally:
            await client.close()

    remote = asyncio.run(via_http())
    engine = EmbeddedEngine(str(tiny_model_dir), max_running=4, device=DEVICE)
    engine.start()
    try:
        local = [engine.submit(p, params).result(timeout=60) for p in prompts]
    finally:
        engine.stop()
    for r, mine in zip(remote, local):
        assert r.output_ids == mine.output_ids
        assert r.output_logprobs == pytest.approx(mine.output_logprobs, abs=1e-4)
        assert r.finish_reason == mine.finish_reason == "length"
        assert r.output_versions == mine.output_versions


def test_eos_stops_with_stop_reason(server):
    # Find what greedy emits first, then declare it a stop token: the request must end there.
    _, body = post(
        server, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    )
    first = body["output_ids"][0]
    status, body = post(
        server,
        "/generate",
        {
            "input_ids": [1, 2, 3],
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [first]},
        },
    )
    assert status == 200
    assert body["output_ids"] == [first]
    assert body["meta_info"]["finish_reason"]["type"] == "stop"


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"input_ids": [], "sampling_params": {}}, "empty"),
        ({"sampling_params": {"max_new_tokens": 3}}, "input_ids"),
        ({"input_ids": "1 2 3"}, "input_ids"),
        ({"input_ids": [1, "a"]}, "input_ids"),
        ({"input_ids": [[1, 2], [3]]}, "input_ids"),
        ({"input_ids": [1, 2], "temprature": 0.5}, "temprature"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "topp": 0.5}}, "topp"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}, "temperature"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2.5}}, "max_new_tokens"),
        ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10_000}}, "context"),
        ({"input_ids": [1, 2], "return_logprob": "yes"}, "return_logprob"),
        ({"input_ids": [1, 2], "stream": 1}, "stream"),
        ({"text": "hello"}, "input_ids"),
        ([1, 2, 3], "object"),
    ],
)
def test_bad_generate_requests_get_clear_400(server, body, fragment):
    status, err = post(server, "/generate", body)
    assert status == 400, err
    assert err["object"] == "error" and err["code"] == 400
    assert fragment in err["message"]


def test_invalid_json_and_bad_control_requests(server):
    status, err = post(server, "/generate", b"{not json")
    assert status == 400 and "JSON" in err["message"]
    status, err = post(server, "/abort_request", {})
    assert status == 400 and "rid" in err["message"]
    status, err = post(server, "/update_weights_from_disk", {"model_path": "/nonexistent/dir", "weight_version": "3"})
    assert status == 400 and err["success"] is False
    status, err = post(server, "/update_weights_from_disk", {"model_path": "/x", "weight_version": "v-three"})
    assert status == 400 and "weight_version" in err["message"]
    status, err = post(server, "/update_weights_from_disk", {"path": "/x"})
    assert status == 400 and "path" in err["message"]
    # none of it hurt the server
    assert get(server, "/health")[0] == 200
    assert get(server, "/health_generate")[0] == 200


def test_hostile_bodies_get_400_or_413_and_the_server_survives(server):
    """JSON nested 100k deep is a clear 400 (not a 500 from a recursion error); a body past
    the 64 MiB cap is refused with 413 without being read whole; the server answers after."""
    status, reply = post(server, "/generate", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested too deeply" in reply["message"]
    status, reply = post(server, "/generate", b'{"input_ids": [' + b"1," * (33 << 20) + b"1]}")
    assert status == 413
    assert get(server, "/health")[0] == 200


def test_full_queue_answers_503_and_server_survives(server):
    """Flood far past max_running + max_queue without client retries: some 503s, the rest served."""
    import aiohttp

    async def flood():
        async with aiohttp.ClientSession() as s:

            async def one(i):
                async with s.post(
                    server + "/generate",
                    json={"input_ids": [1, i % 50 + 3], "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}},
                ) as r:
                    return r.status, await r.json()

            return await asyncio.gather(*(one(i) for i in range(40)))

    results = asyncio.run(flood())
    statuses = [s for s, _ in results]
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) >= 1, "the queue never filled"
    assert statuses.count(200) >= MAX_RUNNING
    for s, body in results:
        if s == 503:
            assert body["code"] == 503
        else:
            assert len(body["output_ids"]) == 64
    assert get(server, "/health_generate")[0] == 200


def test_client_retries_through_503(server):
    """The client's backoff turns a flood that overflows the queue into all-served."""
    from areal_graph.engines.inference.client import InferenceClient

    async def flood():
        client = InferenceClient(server, retries=30, backoff_s=0.05)
        try:
            params = SamplingParams(max_new_tokens=16, ignore_eos=True)
            res = await asyncio.gather(*(client.generate([1, 5 + i], params) for i in range(24)))
            return res, client.stats.retries
        finally:
            await client.close()

    res, retries = asyncio.run(flood())
    assert all(len(r.output_ids) == 16 for r in res)
    assert retries >= 1


# --------------------------------------------------------------------------- control endpoints
def test_info_endpoints(server, tiny_model_dir):
    status, info = get(server, "/get_model_info")
    assert status == 200 and info["is_generation"] is True and info["model_path"] == str(tiny_model_dir)
    assert get(server, "/get_weight_version")[1]["weight_version"] == info["weight_version"]
    assert get(server, "/flush_cache")[0] == 200
    assert post(server, "/flush_cache", {})[0] == 200
    assert get(server, "/get_server_info")[0] == 200


def tokens_generated(server: str) -> int:
    return get(server, "/get_server_info")[1]["internal_states"][0]["tokens_generated"]


def test_abort_by_rid_and_pause_continue(server):
    from areal_graph.engines.inference.client import InferenceClient

    async def go():
        client = InferenceClient(server)
        try:
            params = SamplingParams(max_new_tokens=400, ignore_eos=True)
            before = await asyncio.to_thread(tokens_generated, server)
            task = asyncio.create_task(client.generate([1, 2, 3], params, rid="to-abort"))
            while await asyncio.to_thread(tokens_generated, server) < before + 5:  # it is decoding
                await asyncio.sleep(0.005)
            await client.abort("to-abort")
            aborted = await asyncio.wait_for(task, 30)
            # pause: a request sent now waits; continue lets it finish
            await client.pause()
            held = asyncio.create_task(client.generate([1, 2], SamplingParams(max_new_tokens=4, ignore_eos=True)))
            await asyncio.sleep(0.3)
            was_done = held.done()
            await client.resume()
            done = await asyncio.wait_for(held, 30)
            return aborted, was_done, done
        finally:
            await client.close()

    aborted, was_done, done = asyncio.run(go())
    assert aborted.finish_reason == "abort" and len(aborted.output_ids) < 400
    assert len(aborted.output_ids) == len(aborted.output_logprobs) == len(aborted.output_versions)
    assert not was_done, "a paused server finished a request"
    assert done.finish_reason == "length" and len(done.output_ids) == 4


def test_pause_modes_follow_sglang(server):
    """abort (SGLang's default mode) returns in-flight requests with their tokens so far; in_place keeps them."""
    import threading

    def generate(out: dict, key: str, n: int) -> None:
        out[key] = post(
            server,
            "/generate",
            {
                "input_ids": [1, 2, 3],
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
            },
        )

    def start(out: dict, key: str, n: int) -> threading.Thread:
        before = tokens_generated(server)
        t = threading.Thread(target=generate, args=(out, key, n))
        t.start()
        while tokens_generated(server) < before + 5:  # it is decoding
            time.sleep(0.01)
        return t

    out: dict = {}
    for mode, expect_abort in (("abort", True), ("in_place", False)):
        t = start(out, mode, 400)
        status, body = post(server, "/pause_generation", {"mode": mode})
        assert status == 200 and body["mode"] == mode
        held = threading.Thread(target=generate, args=(out, mode + "-new", 3))
        held.start()
        time.sleep(0.3)
        assert mode + "-new" not in out, "a paused server served a new request"
        if expect_abort:
            t.join(30)
            assert not t.is_alive(), "abort mode did not return the in-flight request"
        else:
            assert t.is_alive(), "in_place mode returned the in-flight request"
        assert post(server, "/continue_generation", {})[0] == 200
        t.join(60)
        held.join(60)
        status, body = out[mode]
        assert status == 200
        n = len(body["output_ids"])
        assert body["meta_info"]["finish_reason"]["type"] == ("abort" if expect_abort else "length")
        assert (0 < n < 400) if expect_abort else n == 400
        assert len(body["meta_info"]["output_token_logprobs"]) == n
        assert out[mode + "-new"][1]["meta_info"]["finish_reason"]["type"] == "length"
    status, err = post(server, "/pause_generation", {"mode": "sideways"})
    assert status == 400 and "mode" in err["message"]
    status, err = post(server, "/pause_generation", {"mood": "abort"})
    assert status == 400 and "mood" in err["message"]
    assert get(server, "/health_generate")[0] == 200


def test_client_disconnect_aborts_the_request(server):
    """A client that gives up must not leave its request in the engine (SGLang aborts it too).

    The server is paused so the request can only sit in the queue: if it is gone afterwards,
    the disconnect removed it (it cannot have finished).
    """
    import aiohttp

    async def go():
        async with aiohttp.ClientSession() as s:
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(
                    server + "/generate",
                    timeout=aiohttp.ClientTimeout(total=0.5),
                    json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}},
                ) as r:
                    await r.read()

    assert post(server, "/pause_generation", {})[0] == 200
    try:
        asyncio.run(go())
        deadline = time.monotonic() + 10
        while True:
            state = get(server, "/get_server_info")[1]["internal_states"][0]
            assert state["paused"] is True
            if state["running"] == 0 and state["queued"] == 0:
                break
            assert time.monotonic() < deadline, f"request still in the engine after disconnect: {state}"
            time.sleep(0.05)
    finally:
        assert post(server, "/continue_generation", {})[0] == 200


def test_after_each_load_the_server_reports_the_version_and_digest_of_what_it_holds(server, tiny_model_dir, tmp_path):
    """GET /get_weights_digest (the executor's check after every load): the model directory's
    weights at first, then each published version's, under its number; the server ends on its
    own weights as version 0 again (the other tests of this module expect them)."""
    from transformers import AutoModelForCausalLM

    from areal_graph.engines import shared_weights
    from areal_graph.engines.inference.client import InferenceClient
    from areal_graph.engines.weights_digest import digest, sample_tensors

    own = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict())
    other = {k: v + 0.01 for k, v in own.items()}

    async def load_and_report(weights: dict, version: int):
        client = InferenceClient(server)
        try:
            manifest = shared_weights.publish(str(tmp_path / f"w{version}"), weights)
            await client.update_weights_from_shared_memory(str(tmp_path / f"w{version}"), manifest, version)
            return await client.weights_digest()
        finally:
            await client.close()

    status, first = get(server, "/get_weights_digest")
    assert status == 200 and first["dtype"] == "float32"
    assert first["digest"] == digest(sample_tensors(own), torch.float32)
    try:
        report = asyncio.run(load_and_report(other, 8))
        assert (report.version, report.dtype) == (8, "float32")
        assert report.digest == digest(sample_tensors(other), torch.float32) != first["digest"]
    finally:
        report = asyncio.run(load_and_report(own, int(first["weight_version"])))
    assert (report.version, report.digest) == (int(first["weight_version"]), first["digest"])


def test_serve_cli_parses_and_rejects_a_missing_model_dir(tmp_path):
    from areal_graph.cli.main import build_parser

    args = build_parser().parse_args(["serve", str(tmp_path / "nope"), "--port", "0", "--max-running", "8"])
    assert args.port == 0 and args.max_running == 8 and args.host == "127.0.0.1"
    assert args.func(args) == 1  # no such directory: a clear message, no traceback
    args = build_parser().parse_args(["serve", str(tmp_path), "--max-running", "0"])
    assert args.func(args) == 2


def test_api_key_is_required_everywhere_but_the_liveness_probe(tiny_model_dir, monkeypatch):
    """With --api-key-env, every endpoint but GET /health answers 401 without
    `Authorization: Bearer KEY` (or with a wrong one); the InferenceClient sends its key."""
    import asyncio

    from areal_graph.api.sampling import SamplingParams
    from areal_graph.engines.inference.client import InferenceClient, RequestRejected
    from areal_graph.engines.inference.server.process import ServerProcess

    monkeypatch.setenv("AREAL_TEST_API_KEY", "k3y-for-test")
    with ServerProcess(
        str(tiny_model_dir), extra_args=["--threads", "1", "--api-key-env", "AREAL_TEST_API_KEY"]
    ) as proc:
        url = proc.url
        assert get(url, "/health")[0] == 200
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        for path in ("/generate", "/update_weights_from_disk", "/pause_generation", "/abort_request"):
            status, reply = post(url, path, body)
            assert status == 401 and "API key" in reply["message"], (path, reply)
        for path in ("/get_model_info", "/get_spans", "/health_generate"):
            assert get(url, path)[0] == 401, path
        req = urllib.request.Request(
            url + "/generate", data=json.dumps(body).encode(), method="POST", headers={"Authorization": "Bearer wrong"}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=30)
        assert info.value.code == 401

        async def generate(key):
            client = InferenceClient(url, api_key=key)
            try:
                return await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=0.0))
            finally:
                await client.close()

        assert len(asyncio.run(generate("k3y-for-test")).output_ids) == 2
        with pytest.raises(RequestRejected, match="401"):
            asyncio.run(generate(None))


def test_serve_refuses_an_open_server_beyond_loopback_and_an_unset_key(tmp_path, monkeypatch):
    from areal_graph.cli.main import build_parser

    monkeypatch.delenv("AREAL_NO_SUCH_KEY", raising=False)
    args = build_parser().parse_args(["serve", str(tmp_path), "--host", "0.0.0.0"])
    assert args.func(args) == 2
    args = build_parser().parse_args(["serve", str(tmp_path), "--api-key-env", "AREAL_NO_SUCH_KEY"])
    assert args.func(args) == 2


def test_main_hands_the_speculative_flags_to_the_engine(monkeypatch, capsys):
    """`--speculative*` reach EmbeddedEngine as SpeculativeSettings (the engine is replaced by a
    recorder that stops `main` before it serves); max-match below min-match exits 2 naming both."""
    from areal_graph.api.process import CORES_ENV, PDEATHSIG_ENV
    from areal_graph.engines.inference import engine as engine_module
    from areal_graph.engines.inference.server import http_server
    from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings

    seen: list[dict] = []

    class Stop(Exception):
        pass

    def recorder(model_path, **kwargs):
        seen.append(kwargs)
        raise Stop

    monkeypatch.setattr(engine_module, "EmbeddedEngine", recorder)
    monkeypatch.delenv(CORES_ENV, raising=False)  # pin_to_cores: nothing to pin
    monkeypatch.delenv(PDEATHSIG_ENV, raising=False)  # die_with_parent: nothing to arm
    with pytest.raises(Stop):
        http_server.main(["--model", "m"])
    assert seen[-1]["speculative"] == SpeculativeSettings(enabled=False)
    flags = ["--speculative", "on", "--speculative-max-draft", "6", "--speculative-history-answers", "0"]
    with pytest.raises(Stop):
        http_server.main(["--model", "m", *flags])
    assert seen[-1]["speculative"] == SpeculativeSettings(enabled=True, max_draft=6, history_answers=0)
    with pytest.raises(SystemExit) as info:
        http_server.main(["--model", "m", "--speculative-min-match", "4", "--speculative-max-match", "3"])
    assert info.value.code == 2 and len(seen) == 2
    assert "--speculative-max-match (3) must be >= --speculative-min-match (4)" in capsys.readouterr().err
