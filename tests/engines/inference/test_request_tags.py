"""A request's prompt group, episode and turn on its trace spans (engines/inference/request_tags.py):
numbered on the rollout worker's side from its asyncio tasks, sent with the request by the embedded
backend only, recorded by the server on every span of the request."""

from __future__ import annotations

import asyncio

import pytest

from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.request_tags import enter_group, parse_tags, request_tags


def test_each_answer_task_is_an_episode_and_each_new_request_id_its_next_turn():
    seen: list[tuple[str, dict]] = []

    async def episode(j: int) -> None:
        await asyncio.sleep(0.001 * j)  # first requests in order j
        for turn in range(2):
            rid = f"a{j}-t{turn}"
            for _ in range(1 + (turn == 1)):  # turn 1 is resubmitted once (an interruption): same id
                seen.append((rid, request_tags(rid)))
                await asyncio.sleep(0)

    async def group(gid: int) -> None:
        enter_group(gid)
        await asyncio.gather(*(episode(j) for j in range(3)))

    async def main() -> None:
        assert request_tags("outside") is None  # no group: no tags (eval, a served model)
        await asyncio.gather(group(7), group(8))

    asyncio.run(main())
    by_rid: dict[tuple[int, str], list[dict]] = {}
    for rid, tags in seen:
        by_rid.setdefault((tags["group"], rid), []).append(tags)
    assert len(seen) == 2 * 3 * 3
    for gid in (7, 8):
        for j in range(3):
            assert by_rid[(gid, f"a{j}-t0")] == [{"group": gid, "episode": j, "turn": 0}]
            assert by_rid[(gid, f"a{j}-t1")] == [{"group": gid, "episode": j, "turn": 1}] * 2  # resubmitted: same turn


@pytest.mark.parametrize(
    "raw,parsed",
    [
        ({"group": 3, "episode": 1, "turn": 0}, {"group": 3, "episode": 1, "turn": 0}),
        ({"group": 3, "other": 5, "turn": True, "episode": -1}, {"group": 3}),
        ({"group": -4, "episode": 0, "turn": 1}, {"group": -4, "episode": 0, "turn": 1}),  # an evaluation's group
        ({"group": "3"}, None),
        ("junk", None),
        (None, None),
        ({"group": 1 << 70}, None),
    ],
)
def test_the_server_keeps_small_ints_under_known_keys_only(raw, parsed):
    assert parse_tags(raw) == parsed


def test_only_the_embedded_backend_sends_the_tags():
    tags = {"group": 1, "episode": 2, "turn": 0}
    params = SamplingParams(max_new_tokens=3)
    assert get_backend("embedded").generate_call([1, 2], params, "r", tags=tags).payload["trace"] == tags
    assert "trace" not in get_backend("embedded").generate_call([1, 2], params, "r").payload
    assert "trace" not in get_backend("sglang").generate_call([1, 2], params, "r", tags=tags).payload
    assert "trace" not in get_backend("vllm").generate_call([1, 2], params, "r", tags=tags).payload


def test_the_server_records_the_tags_on_every_span_of_the_request():
    from aiohttp.test_utils import TestClient, TestServer

    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.engines.inference.server.http_server import InferenceHTTPServer
    from support.tiny_models import build_random_qwen2

    eng = EmbeddedEngine(model=build_random_qwen2(vocab_size=128, seed=0))
    server = InferenceHTTPServer(eng, name="inference-0")

    async def go():
        async with TestClient(TestServer(server.app)) as client:
            for rid, trace in (("t", {"group": 4, "episode": 2, "turn": 1}), ("u", None)):
                body = {"input_ids": [1, 2, 3], "rid": rid, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
                if trace:
                    body["trace"] = trace
                assert (await client.post("/generate", json=body)).status == 200
            return (await (await client.get("/get_spans")).json())["spans"]

    with eng:
        spans = [s for s in asyncio.run(go()) if s["cat"] == "request"]
    tagged = [s for s in spans if s["args"]["rid"] == "t"]
    assert {s["name"] for s in tagged} >= {"request", "queued", "prefill", "decode", "finished"}
    assert all((s["args"]["group"], s["args"]["episode"], s["args"]["turn"]) == (4, 2, 1) for s in tagged)
    assert not any("group" in s["args"] for s in spans if s["args"]["rid"] == "u")
