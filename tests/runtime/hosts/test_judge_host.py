"""The judge host: concurrent bounded requests, verdicts parsed, failures and unparsable replies
counted (never a silent 0), against a fake slow OpenAI endpoint (a real aiohttp server on
loopback, for the failure modes) and against `areal-graph serve` with a tiny model.

The fake endpoint answers from the question it is shown: "yes" when the student's answer equals
the reference, "no" otherwise, "maybe" for an answer "?" (unparsable), HTTP 500 for "fail", a
stall past the timeout for "hang", and it records how many requests were in flight at once.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
import torch
from aiohttp import web

from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.hosts.judge_host import JudgeHost

TEMPLATE = "Reference: {answer}\nStudent: {response}\nCorrect? yes or no."


class FakeJudge:
    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s, self.in_flight, self.peak, self.requests = delay_s, 0, 0, 0
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = body["messages"][-1]["content"]
        reference, student = re.search(r"Reference: (.*)\nStudent: (.*)\n", text).groups()
        self.requests += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(5.0 if student == "hang" else self.delay_s)
            if student == "fail":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            reply = "maybe" if student == "?" else ("yes" if student == reference else "no")
            return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": reply}}]})
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def fake():
    judge = FakeJudge()
    yield judge
    judge.close()


def batch_of(tokenizer, answers: list[str], references: list[str]) -> PackedBatch:
    prompt = tokenizer("What is 2 + 3?", add_special_tokens=False).input_ids
    seqs, masks = [], []
    for a in answers:
        out = tokenizer(a, add_special_tokens=False).input_ids
        seqs.append(prompt + out)
        masks.append([0] * len(prompt) + [1] * len(out))
    return PackedBatch.from_sequences({"input_ids": seqs, "loss_mask": masks}, meta={"answer": references})


@pytest.fixture(scope="module")
def tokenizer(kit):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(kit / "model")


def test_verdicts_become_rewards_and_every_failure_is_counted(kit, tokenizer, fake, caplog):
    host = JudgeHost(str(kit / "model"), fake.url, template=TEMPLATE, max_concurrency=4, timeout_s=1.0,
                     on_failure=-1.0)
    try:
        answers = ["5", "6", "?", "fail", "hang", "5"]
        out, stats = host.score(batch_of(tokenizer, answers, ["5"] * 6), "judge_reward")
    finally:
        host.close()
    assert out["judge_reward"].tolist() == [1.0, 0.0, -1.0, -1.0, -1.0, 1.0]
    assert (stats["failures"], stats["unparsable"]) == (2.0, 1.0)  # the 500 and the timeout; the "maybe"
    assert "2 of 6 requests failed" in caplog.text and "1 replies unparsable" in caplog.text


def test_requests_run_concurrently_and_never_more_than_the_bound(kit, tokenizer, fake):
    host = JudgeHost(str(kit / "model"), fake.url, template=TEMPLATE, max_concurrency=3)
    try:
        t0 = time.perf_counter()
        out, stats = host.score(batch_of(tokenizer, ["5"] * 9, ["5"] * 9), "r")
        wall = time.perf_counter() - t0
    finally:
        host.close()
    assert out["r"].tolist() == [1.0] * 9 and stats["failures"] == 0
    assert fake.peak == 3 and fake.requests == 9
    assert wall >= 3 * fake.delay_s  # three waves of three, not nine one after another or all at once


def test_a_missing_key_is_an_error_naming_the_variable(kit, fake, monkeypatch):
    monkeypatch.delenv("JUDGE_KEY_FOR_TEST", raising=False)
    with pytest.raises(ValueError, match="JUDGE_KEY_FOR_TEST"):
        JudgeHost(str(kit / "model"), fake.url, api_key_env="JUDGE_KEY_FOR_TEST", template=TEMPLATE)


def test_against_areal_graph_serve_the_rewards_are_the_parsed_replies(kit, tokenizer):
    """A real server with a tiny model as the judge: each reward is what parsing that server's
    own greedy reply to the same question gives (a random model rarely says yes or no: those
    replies are counted as unparsable)."""
    import openai

    from areal_graph.api.judge import parse_verdict, render
    from areal_graph.engines.inference.server_process import ServerProcess

    server = ServerProcess(str(kit / "model"), extra_args=["--threads", "1", "--max-running", "8"])
    server.start()
    try:
        template = "{response} is it? yes or no"
        host = JudgeHost(str(kit / "model"), server.url + "/v1", template=template, verdict="score",
                         pattern=r"(\d)", score_max=9.0, max_tokens=8)
        try:
            batch = batch_of(tokenizer, ["5", "12", "7"], ["5", "5", "5"])
            out, stats = host.score(batch, "r")
            texts = host.texts(batch)
        finally:
            host.close()

        async def direct() -> list[str]:
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none")
            try:
                replies = []
                for _, response in texts:
                    r = await client.chat.completions.create(
                        model="judge", messages=[{"role": "user", "content": render(template, "", response, "")}],
                        max_tokens=8, temperature=0.0)
                    replies.append(r.choices[0].message.content or "")
                return replies
            finally:
                await client.close()

        replies = asyncio.run(direct())
    finally:
        server.stop()
    want = [parse_verdict(r, "score", r"(\d)", 9.0) for r in replies]
    assert out["r"].tolist() == pytest.approx([0.0 if w is None else w for w in want])
    assert stats["unparsable"] == sum(w is None for w in want) and stats["failures"] == 0
    assert torch.is_tensor(out["r"]) and texts[1][1] == "12"
