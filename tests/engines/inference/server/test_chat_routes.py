"""The /v1 routes' own logic, in process, over a stub engine that records what it is asked.

tests/engines/inference/server/test_openai_server.py drives a real server subprocess with the
`openai` package; that cannot see what the routes hand the engine. Here the routes are
mounted on a bare aiohttp app (aiohttp's in-process test server, no subprocess) with a stub
engine, so the contract is checked exactly: the route table, what each request becomes
(prompt ids through the chat template, per-choice seeds and request ids, OpenAI's max_tokens
default), how a failure of one choice aborts its siblings, and how each kind of error maps
to OpenAI's error shape and status.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from areal_graph.engines.inference.engine_errors import InvalidRequestError, QueueFullError
from areal_graph.engines.inference.sampling import GenerationResult, SamplingParams
from areal_graph.engines.inference.server.chat_routes import (
    ROUTES,
    OpenAIRoutes,
    default_served_name,
    register_openai_routes,
)
from areal_graph.engines.inference.server.native_requests import BadRequest
from areal_graph.engines.inference.server.openai_http import error_response
from areal_graph.engines.inference.server.responses_routes import ResponsesRoutes
from areal_graph.engines.inference.server.served_model import ServedModel
from areal_graph.engines.openai.chat_requests import OpenAIRequestError, SamplingRequest

CONTEXT = 64


@pytest.fixture(scope="module")
def tokenizer():
    from areal_graph.modelkit.tokenizer import train_tokenizer

    return train_tokenizer(["one two three four five six", "hello world, how are you"] * 3, vocab_size=300)


class StubEngine:
    """Answers every request with the first `max_new_tokens` of `answer`; records the calls."""

    def __init__(self, answer: list[int]) -> None:
        self.max_context = CONTEXT
        self.answer = answer
        self.calls: list[tuple[list[int], SamplingParams, str, int]] = []
        self.aborted: list[str] = []
        self.fail: dict[str, BaseException] = {}  # rid suffix -> exception ("*": every request)
        self.hang: set[str] = set()  # rid suffixes that never finish

    async def generate(self, prompt_ids, params, rid=None, top_logprobs=0):
        self.calls.append((list(prompt_ids), params, rid, top_logprobs))
        suffix = rid.rsplit("-", 1)[1]
        err = self.fail.get(suffix) or self.fail.get("*")
        if err is not None:
            raise err
        if suffix in self.hang:
            await asyncio.Event().wait()
        out = self.answer[: params.max_new_tokens]
        finish = "length" if params.max_new_tokens <= len(self.answer) else "stop"
        return GenerationResult(
            rid=rid,
            output_ids=out,
            output_logprobs=[-0.5] * len(out),
            output_versions=[7] * len(out),
            finish_reason=finish,
            prompt_len=len(prompt_ids),
        )

    async def stream(self, prompt_ids, params, rid=None, top_logprobs=0):
        """`generate`, one token at a time (as EmbeddedEngine.stream yields them)."""
        whole = await self.generate(prompt_ids, params, rid=rid, top_logprobs=top_logprobs)
        for j, tok in enumerate(whole.output_ids):
            last = j == len(whole.output_ids) - 1
            yield GenerationResult(
                rid=rid,
                output_ids=[tok],
                output_logprobs=[whole.output_logprobs[j]],
                output_versions=[whole.output_versions[j]],
                finish_reason=whole.finish_reason if last else "",
                prompt_len=len(prompt_ids),
            )
        if not whole.output_ids:
            yield whole

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)


class StubServer:
    """What the routes use of `InferenceHTTPServer`: app, engine, tokenizer, model_path and `_json`."""

    def __init__(
        self, engine, tokenizer, model_path: str | None = "/models/tiny-model", served_model_name: str | None = None
    ) -> None:
        self.app = web.Application()
        self.engine, self.tokenizer, self.model_path = engine, tokenizer, model_path
        self.served_model_name = served_model_name or default_served_name(model_path)

    async def _json(self, request):
        try:
            return await request.json()
        except ValueError as err:
            raise BadRequest(f"the request body is not valid JSON: {err}") from None


def answer_ids(tokenizer) -> list[int]:
    return tokenizer(" hello world", add_special_tokens=False).input_ids


def serve(
    tokenizer,
    *requests,
    model_path="/models/tiny-model",
    served_model_name="org/tiny-model",
    with_tokenizer=True,
    setup=None,
):
    """Mount the routes, send `requests` ((method, path, json body or raw bytes)); (engine, routes, [(status, body)])."""
    engine = StubEngine(answer_ids(tokenizer))
    server = StubServer(engine, tokenizer if with_tokenizer else None, model_path, served_model_name)
    routes = register_openai_routes(server)
    if setup is not None:
        setup(engine)

    async def go():
        client = TestClient(TestServer(server.app))
        await client.start_server()
        out = []
        try:
            for method, path, body in requests:
                kw = {"data": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
                resp = await client.request(method, path, **kw)
                text = await resp.text()
                is_json = resp.content_type == "application/json"
                out.append((resp.status, json.loads(text) if is_json else (resp.content_type, text)))
        finally:
            await client.close()
        return out

    return engine, routes, asyncio.run(go())


def test_the_route_table(tokenizer):
    server = StubServer(StubEngine([]), tokenizer)
    routes = register_openai_routes(server)
    assert isinstance(routes, OpenAIRoutes) and routes.server is server
    assert isinstance(routes.served, ServedModel) and routes.served.server is server
    assert isinstance(routes.responses, ResponsesRoutes) and routes.responses.served is routes.served
    table = {(r.method, r.resource.canonical) for r in server.app.router.routes()}
    assert table == {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
        ("HEAD", "/v1/models"),
        ("GET", "/v1/models/{model}"),
        ("HEAD", "/v1/models/{model}"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/{id}"),
        ("HEAD", "/v1/responses/{id}"),
        ("DELETE", "/v1/responses/{id}"),
        ("GET", "/v1/responses/{id}/input_items"),
        ("HEAD", "/v1/responses/{id}/input_items"),
        ("*", "/v1/{tail}"),
    }
    assert ROUTES == ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses")


def test_models_list_and_a_model_id_with_slashes(tokenizer):
    _, routes, [(s1, listing), (s2, one), (s3, missing)] = serve(
        tokenizer,
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/org/tiny-model", None),
        ("GET", "/v1/models/gpt-4o", None),
    )
    model = {
        "id": "org/tiny-model",
        "object": "model",
        "created": routes.created,
        "owned_by": "areal-graph",
        "max_model_len": CONTEXT,
    }
    assert (s1, listing) == (200, {"object": "list", "data": [model]})
    assert (s2, one) == (200, model)
    assert s3 == 404 and missing["error"]["param"] == "model" and missing["error"]["code"] == "model_not_found"
    assert "'gpt-4o' does not exist" in missing["error"]["message"]


def test_a_server_without_a_model_path_has_a_default_id(tokenizer):
    _, _, [(status, listing)] = serve(tokenizer, ("GET", "/v1/models", None), model_path=None, served_model_name=None)
    assert status == 200 and listing["data"][0]["id"] == "areal-graph-embedded"


def test_the_default_id_is_the_directory_name_never_the_path(tokenizer):
    _, _, [(_, listing)] = serve(
        tokenizer, ("GET", "/v1/models", None), model_path="/home/me/ckpt/qwen-rl/", served_model_name=None
    )
    assert listing["data"][0]["id"] == "qwen-rl"
    assert default_served_name("") == default_served_name(None) == "areal-graph-embedded"


def test_wrong_methods_get_405_and_unknown_routes_404(tokenizer):
    engine, _, answers = serve(
        tokenizer,
        ("GET", "/v1/chat/completions", None),
        ("DELETE", "/v1/completions", None),
        ("POST", "/v1/models", {}),
        ("POST", "/v1/embeddings", {"input": "x"}),
    )
    (s1, a), (s2, b), (s3, c), (s4, d) = answers
    assert (s1, s2, s3, s4) == (405, 405, 405, 404)
    assert a["error"]["message"] == "GET /v1/chat/completions is not allowed; use POST"
    assert b["error"]["message"] == "DELETE /v1/completions is not allowed; use POST"
    assert c["error"]["message"] == "POST /v1/models is not allowed; use GET"
    assert d["error"]["code"] == "not_found" and str(list(ROUTES)) in d["error"]["message"]
    assert all(x["error"]["type"] == "invalid_request_error" for x in (a, b, c, d))
    assert engine.calls == []


def test_completions_of_token_prompts_seed_each_choice(tokenizer):
    body = {
        "model": "m",
        "prompt": [[5, 6], [7]],
        "n": 2,
        "seed": 10,
        "max_tokens": 2,
        "temperature": 0.5,
        "return_token_ids": True,
    }
    engine, _, [(status, out)] = serve(tokenizer, ("POST", "/v1/completions", body))
    assert status == 200, out
    prompts, params, rids, tops = zip(*engine.calls)
    assert list(prompts) == [[5, 6], [5, 6], [7], [7]]
    assert [p.seed for p in params] == [10, 11, 10, 11]  # choice i of a prompt is seeded seed + i
    assert {(p.max_new_tokens, p.temperature, p.greedy, p.top_p, p.top_k) for p in params} == {(2, 0.5, False, 1.0, -1)}
    assert [r.rsplit("-", 1)[1] for r in rids] == ["0", "1", "2", "3"] and len({r.rsplit("-", 1)[0] for r in rids}) == 1
    assert rids[0].startswith(out["id"]) and out["id"].startswith("cmpl-") and set(tops) == {0}
    ids = answer_ids(tokenizer)[:2]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert {c["text"] for c in out["choices"]} == {tokenizer.decode(ids, skip_special_tokens=True)}
    assert all(c["token_ids"] == ids and c["token_versions"] == [7, 7] for c in out["choices"])
    assert out["prompt_token_ids"] == [[5, 6], [7]] and out["object"] == "text_completion" and out["model"] == "m"
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}


def test_chat_goes_through_the_chat_template_and_temperature_zero_is_greedy(tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two"}]
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    engine, _, [(status, out)] = serve(tokenizer, ("POST", "/v1/chat/completions", body))
    assert status == 200, out
    [(prompt, params, rid, top)] = engine.calls
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == tokenizer(text, add_special_tokens=False).input_ids
    assert params.greedy and params.max_new_tokens == 3 and params.seed is None and top == 2
    assert rid == out["id"] + "-0" and out["id"].startswith("chatcmpl-") and out["object"] == "chat.completion"
    [choice] = out["choices"]
    ids = answer_ids(tokenizer)[:3]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert choice["message"]["content"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5] * 3
    assert out["usage"]["prompt_tokens"] == len(prompt) and out["usage"]["completion_tokens"] == 3


def test_max_tokens_defaults_per_endpoint(tokenizer):
    """Chat: what the context leaves after the prompt; legacy completions: OpenAI's 16."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
    engine, _, answers = serve(
        tokenizer,
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/completions", {"model": "m", "prompt": [1, 2, 3, 4]}),
    )
    assert [a[0] for a in answers] == [200, 200]
    (chat_prompt, chat_params, _, _), (_, completion_params, _, _) = engine.calls
    assert chat_params.max_new_tokens == CONTEXT - len(chat_prompt)
    assert completion_params.max_new_tokens == 16
    assert chat_params.temperature == 1.0 and not chat_params.greedy


def test_sampling_params_from_a_request():
    routes = OpenAIRoutes(StubServer(StubEngine([]), None))
    sp = routes.served.sampling(SamplingRequest(), prompt_len=10, prompt_field="messages")
    assert sp == SamplingParams(
        max_new_tokens=CONTEXT - 10,
        temperature=1.0,
        greedy=False,
        top_p=1.0,
        top_k=-1,
        stop=[],
        seed=None,
        ignore_eos=False,
    )
    sp = routes.served.sampling(
        SamplingRequest(temperature=0.0, top_p=0.9, top_k=5, max_tokens=4, stop=["\n"], seed=3, ignore_eos=True),
        prompt_len=10,
        prompt_field="messages",
    )
    assert sp == SamplingParams(
        max_new_tokens=4, temperature=0.0, greedy=True, top_p=0.9, top_k=5, stop=["\n"], seed=3, ignore_eos=True
    )
    assert (
        routes.served.sampling(SamplingRequest(max_tokens=54), prompt_len=10, prompt_field="messages").max_new_tokens
        == 54
    )  # exactly fills it
    with pytest.raises(OpenAIRequestError) as err:
        routes.served.sampling(SamplingRequest(max_tokens=55), prompt_len=10, prompt_field="messages")
    assert (err.value.param, err.value.code) == ("max_tokens", "context_length_exceeded")
    with pytest.raises(OpenAIRequestError) as err:
        routes.served.sampling(SamplingRequest(), prompt_len=CONTEXT, prompt_field="messages")
    assert (err.value.param, err.value.code) == ("messages", "context_length_exceeded")


@pytest.mark.parametrize(
    "exc, status, kind, code, fragment",
    [
        (QueueFullError("8 requests wait"), 503, "server_error", "overloaded", "server overloaded: 8 requests wait"),
        (InvalidRequestError("input_ids holds token id(s) outside"), 400, "invalid_request_error", None, "outside"),
        (BadRequest("bad field"), 400, "invalid_request_error", None, "bad field"),
        (RuntimeError("boom"), 500, "server_error", None, "RuntimeError: boom"),
    ],
)
def test_engine_failures_become_openai_errors(tokenizer, exc, status, kind, code, fragment):
    engine, _, [(got, body)] = serve(
        tokenizer,
        ("POST", "/v1/completions", {"model": "m", "prompt": [1, 2]}),
        setup=lambda e: e.fail.update({"*": exc}),
    )
    assert got == status
    assert body["error"]["type"] == kind and body["error"]["code"] == code and fragment in body["error"]["message"]


def test_request_errors_are_400s_naming_the_problem(tokenizer):
    _, _, answers = serve(
        tokenizer,
        ("POST", "/v1/completions", b"{not json"),
        ("POST", "/v1/completions", {"prompt": [1]}),
        ("POST", "/v1/completions", {"model": "m", "prompt": [1], "max_tokens": CONTEXT}),
        (
            "POST",
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "n": 0},
        ),
    )
    (s1, a), (s2, b), (s3, c), (s4, d) = answers
    assert (s1, s2, s3, s4) == (400, 400, 400, 400)
    assert "not valid JSON" in a["error"]["message"]
    assert b["error"]["param"] == "model"
    assert c["error"]["param"] == "max_tokens" and c["error"]["code"] == "context_length_exceeded"
    assert d["error"]["param"] == "n"


def test_a_server_without_a_tokenizer_refuses_text_requests(tokenizer):
    engine, _, answers = serve(
        tokenizer,
        ("POST", "/v1/completions", {"model": "m", "prompt": [1, 2]}),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        with_tokenizer=False,
    )
    for status, body in answers:
        assert status == 400 and "no tokenizer" in body["error"]["message"]
    assert engine.calls == []


def test_streamed_completion_is_server_sent_events_ending_in_done(tokenizer):
    body = {"model": "m", "prompt": [3, 4], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    _, _, [(status, (ctype, text))] = serve(tokenizer, ("POST", "/v1/completions", body))
    assert status == 200 and ctype == "text/event-stream"
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed == tokenizer.decode(answer_ids(tokenizer)[:3], skip_special_tokens=True)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_streamed_logprobs_count_every_token_even_one_that_decodes_to_nothing(tokenizer, monkeypatch, path):
    """The answer ends with <|im_end|> (no text) in a part of its own: its log-prob still goes out,
    in the last chunk (asked for without top log-probs, which the stub engine has none of). Found on a loaded machine,
    where every part came later than the stream interval (here: an interval of 0)."""
    from areal_graph.engines.inference.server import openai_http

    monkeypatch.setattr(openai_http, "STREAM_INTERVAL_S", 0.0)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def ends_with_im_end(engine):
        engine.answer = [*engine.answer, end]

    chat = path.endswith("chat/completions")
    for top in (0,):
        body = {"model": "m", "max_tokens": 20, "stream": True}
        body |= (
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": top}
            if chat
            else {"prompt": [3, 4], "logprobs": top}
        )
        _, _, [(status, (_, text))] = serve(tokenizer, ("POST", path, body), setup=ends_with_im_end)
        chunks = [json.loads(e[len("data: ") :]) for e in text.split("\n\n") if e and e != "data: [DONE]"]
        lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0].get("logprobs")]
        n = sum(len(lp["content"]) for lp in lps) if chat else sum(len(lp["tokens"]) for lp in lps)
        assert status == 200 and n == len(answer_ids(tokenizer)) + 1, (top, n)


def test_an_engine_failure_mid_stream_ends_the_stream_with_an_error_event(tokenizer):
    """Before the first chunk a failure is an HTTP error; after it, the headers are out, so the
    stream carries an error event and ends."""

    def setup(engine):
        plain = engine.stream

        async def breaks_after_one(*args, **kw):
            async for part in plain(*args, **kw):
                yield part
                raise RuntimeError("the engine broke")

        engine.stream = breaks_after_one

    body = {"model": "m", "prompt": [3, 4], "max_tokens": 3, "stream": True}
    _, _, [(status, (ctype, text))] = serve(tokenizer, ("POST", "/v1/completions", body), setup=setup)
    events = [e for e in text.split("\n\n") if e]
    assert status == 200 and events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["type"] == "server_error" and "the engine broke" in error["message"]

    def refuse(engine):
        engine.fail["*"] = InvalidRequestError("no such token")

    _, _, [(status, err)] = serve(tokenizer, ("POST", "/v1/completions", body), setup=refuse)
    assert status == 400 and "no such token" in err["error"]["message"]


def test_a_failing_choice_aborts_the_ones_still_running(tokenizer):
    engine = StubEngine(answer_ids(tokenizer))
    engine.fail["1"] = InvalidRequestError("no")
    engine.hang.update({"0", "2"})
    routes = OpenAIRoutes(StubServer(engine, tokenizer))
    with pytest.raises(InvalidRequestError):
        asyncio.run(routes.served.generate([1, 2], SamplingParams(max_new_tokens=2, seed=None), 3, 0, "x"))
    assert engine.aborted == ["x-0", "x-2"]
    assert [c[2] for c in engine.calls] == ["x-0", "x-1", "x-2"]
    assert all(c[1].seed is None for c in engine.calls)  # unseeded choices are left unseeded


def test_generated_choices_carry_the_engines_results(tokenizer):
    engine = StubEngine([11, 12, 13])
    routes = OpenAIRoutes(StubServer(engine, tokenizer))
    choices = asyncio.run(
        routes.served.generate([1], SamplingParams(max_new_tokens=2, seed=5), 2, 0, "y", first_index=4)
    )
    assert [c.index for c in choices] == [4, 5] and [c[2] for c in engine.calls] == ["y-4", "y-5"]
    assert [c[1].seed for c in engine.calls] == [5, 6]
    assert choices[0].output_ids == [11, 12] and choices[0].output_versions == [7, 7]
    assert choices[0].finish_reason == "length" and choices[0].top_logprobs is None


def test_an_over_long_chat_prompt_names_messages(tokenizer):
    long_text = " ".join(["one two three"] * 40)
    _, _, [(status, body)] = serve(
        tokenizer,
        ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": long_text}]}),
    )
    assert status == 400
    assert (body["error"]["param"], body["error"]["code"]) == ("messages", "context_length_exceeded")


def test_an_over_long_completion_prompt_names_prompt(tokenizer):
    _, _, [(status, body)] = serve(tokenizer, ("POST", "/v1/completions", {"model": "m", "prompt": list(range(1, 65))}))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "prompt"


# --------------------------------------------------------------------------- /v1/responses
def test_a_responses_request_the_engine_refuses_is_an_http_error_streamed_or_not(tokenizer):
    body = {"model": "m", "input": "hello", "max_output_tokens": 2}
    engine, _, answers = serve(
        tokenizer,
        ("POST", "/v1/responses", body),
        ("POST", "/v1/responses", {**body, "stream": True}),
        setup=lambda e: e.fail.update({"*": QueueFullError("8 requests wait")}),
    )
    for status, answer in answers:  # nothing was sent before the engine refused: a plain 503
        assert status == 503 and answer["error"]["code"] == "overloaded"
    error = json.loads(error_response(503, "x", "server_error", code="overloaded").text)
    assert set(answers[0][1]["error"]) == set(error["error"])


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_nothing_is_stored(tokenizer):
    def failing(engine):
        async def stream(prompt_ids, params, rid=None, top_logprobs=0):
            yield GenerationResult(
                rid=rid,
                output_ids=engine.answer[:1],
                output_logprobs=[-0.5],
                output_versions=[7],
                finish_reason="",
                prompt_len=len(prompt_ids),
            )
            raise RuntimeError("the engine died")

        engine.stream = stream

    _, routes, [(status, (content_type, text))] = serve(
        tokenizer, ("POST", "/v1/responses", {"model": "m", "input": "hello", "stream": True}), setup=failing
    )
    assert status == 200 and content_type == "text/event-stream"
    blocks = [b.split("\n") for b in text.strip().split("\n\n")]
    kinds = [b[0].removeprefix("event: ") for b in blocks]
    assert (
        kinds[:4]
        == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        and kinds[-1] == "error"
    )
    events = [json.loads(b[1].removeprefix("data: ")) for b in blocks]
    assert [e["type"] for e in events] == kinds and [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "RuntimeError: the engine died" in events[-1]["message"] and len(routes.responses.store) == 0
