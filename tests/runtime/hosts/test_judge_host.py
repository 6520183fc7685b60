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
        self.served, self.asked = ["judge-7b"], []  # what /v1/models lists; the model of each request
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": m, "object": "model", "created": 0, "owned_by": "x"} for m in self.served],
            }
        )

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.asked.append(body["model"])
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
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
                    ],
                }
            )
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        if not self.loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


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
    host = JudgeHost(str(kit / "model"), fake.url, template=TEMPLATE, max_concurrency=4, timeout_s=1.0, on_failure=-1.0)
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


def test_with_no_model_name_it_asks_the_one_served_or_the_newest_adapter(kit, tokenizer, fake):
    """vLLM answers only to its served names; under LoRA sync the policy is the newest adapter, and a
    newer one is listed after each sync, so the choice is made per batch."""
    host = JudgeHost(str(kit / "model"), fake.url, template=TEMPLATE)
    named = JudgeHost(str(kit / "model"), fake.url, template=TEMPLATE, model="judge-7b")
    try:
        host.score(batch_of(tokenizer, ["5"], ["5"]), "r")
        fake.served = ["inference-0", "policy-lora-v2", "policy-lora-v10", "policy-lora-v9"]
        out, stats = host.score(batch_of(tokenizer, ["5", "6"], ["5", "5"]), "r")
        fake.served = ["a", "b"]
        named.score(batch_of(tokenizer, ["5"], ["5"]), "r")
        with pytest.raises(ValueError, match="serves 2 models .a, b.: set the judge's model_name"):
            host.score(batch_of(tokenizer, ["5"], ["5"]), "r")
    finally:
        host.close()
        named.close()
    assert fake.asked == ["judge-7b", "policy-lora-v10", "policy-lora-v10", "judge-7b"]
    assert out["r"].tolist() == [1.0, 0.0] and stats["failures"] == 0


def test_an_endpoint_that_cannot_list_its_models_fails_the_batch_counted(kit, tokenizer, fake):
    fake.close()  # nothing listens any more
    host = JudgeHost(str(kit / "model"), fake.url, template=TEMPLATE, timeout_s=2.0, on_failure=-1.0)
    try:
        out, stats = host.score(batch_of(tokenizer, ["5", "6"], ["5", "5"]), "r")
    finally:
        host.close()
    assert out["r"].tolist() == [-1.0, -1.0] and stats["failures"] == 2.0


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
    from areal_graph.engines.inference.server.process import ServerProcess

    server = ServerProcess(str(kit / "model"), extra_args=["--threads", "1", "--max-running", "8"])
    server.start()
    try:
        template = "{response} is it? yes or no"
        host = JudgeHost(
            str(kit / "model"),
            server.url + "/v1",
            template=template,
            verdict="score",
            pattern=r"(\d)",
            score_max=9.0,
            max_tokens=8,
        )
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
                        model="judge",
                        messages=[{"role": "user", "content": render(template, "", response, "")}],
                        max_tokens=8,
                        temperature=0.0,
                    )
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
