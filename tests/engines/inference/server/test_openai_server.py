"""The OpenAI-compatible routes, driven by the official `openai` package against a real server.

One server per module (a subprocess with the real embedded engine) serving a tiny model that
knows three conversations by heart (`openai_tool_model.py`): a tool call, the answer after
the tool's result, a greeting. It runs with an API key, which the client sends as its
`api_key`. The first section checks the pure conversions without a server.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from support.openai_tool_model import (
    ADD_ANSWER,
    ADD_CALL,
    ADD_QUESTION,
    ADD_TOOL,
    ADD_TURN1,
    ADD_TURN2,
    EOS,
    HELLO_ANSWER,
    HELLO_QUESTION,
    HELLO_TURN,
    build_tool_model,
    served_tool_model,
)

KEY = "sk-test-0123456789"
UNSEEN = "Tell me something new."  # a question the model never saw: its answers are spread out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tool_model(str(tmp_path_factory.getbasetemp() / "openai_tool_model"))[0]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def server(model_dir):
    with served_tool_model(model_dir, KEY) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def user(content) -> list[dict]:
    return [{"role": "user", "content": content}]


# --------------------------------------------------------------------------- pure conversions
def test_template_without_tools_gets_the_hermes_convention_written_in(tokenizer):
    """A chat template that knows no tools: calls become <tool_call> text in the assistant's content,
    the schemas a system message, tool results a `tool` turn."""
    from areal_graph.engines.openai.chat_format import render_chat_prompt
    from areal_graph.modelkit.tokenizer import CHAT_TEMPLATE

    plain = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    plain.chat_template = CHAT_TEMPLATE
    messages = [
        {"role": "user", "content": ADD_QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    text = render_chat_prompt(plain, messages, [ADD_TOOL])
    assert text.startswith("<|bos|><|im_start|>system\n# Tools\n")
    assert json.dumps(ADD_TOOL) in text
    assert text.endswith(
        f"<|im_start|>user\n{ADD_QUESTION}{EOS}\n<|im_start|>assistant\n{ADD_CALL}{EOS}\n"
        f"<|im_start|>tool\n5{EOS}\n<|im_start|>assistant\n"
    )
    # the tool kit's template renders the same conversation itself, identically (no schemas)
    assert render_chat_prompt(tokenizer, messages, [ADD_TOOL]) == ADD_TURN2[0]


def test_tool_call_parsing_keeps_malformed_calls_as_text():
    from areal_graph.engines.openai.chat_format import split_tool_calls

    content, calls = split_tool_calls("Let me add.\n" + ADD_CALL + "\n" + ADD_CALL.replace("2", "7"))
    assert content == "Let me add."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("add", {"a": 2, "b": 3}),
        ("add", {"a": 7, "b": 3}),
    ]
    assert len({c["id"] for c in calls}) == 2
    assert split_tool_calls("<tool_call>\n{not json}\n</tool_call>") == ("<tool_call>\n{not json}\n</tool_call>", [])
    assert split_tool_calls("no call here") == ("no call here", [])
    assert len(split_tool_calls(ADD_CALL + ADD_CALL, parallel=False)[1]) == 1


def test_stream_pieces_join_to_the_text_even_inside_multibyte_characters(tokenizer):
    from areal_graph.engines.openai.chat_format import text_deltas, token_text_and_bytes

    text = "héllo → ✓ 日本"
    token_ids = ids(tokenizer, text)
    pieces = text_deltas(tokenizer, token_ids, text)
    assert "".join(p for p, _, _ in pieces) == text
    assert [(a, b) for _, a, b in pieces] == list(zip([0] + [b for _, _, b in pieces[:-1]], [b for _, _, b in pieces]))
    assert pieces[-1][2] == len(token_ids)
    # byte-level tokens can split a character: their bytes still concatenate to the UTF-8 text
    assert b"".join(bytes(token_text_and_bytes(tokenizer, t)[1]) for t in token_ids) == text.encode()


# --------------------------------------------------------------------------- chat
def test_tool_call_is_parsed_into_tool_calls(client, tokenizer):
    r = client.chat.completions.create(model="tool-model", messages=user(ADD_QUESTION), tools=[ADD_TOOL], temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.role == "assistant"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "tool-model"
    assert r.usage.prompt_tokens == len(ids(tokenizer, ADD_TURN1[0]))
    assert r.usage.completion_tokens == len(ids(tokenizer, ADD_TURN1[1]))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_tool_result_turn_renders_as_the_model_learned_it(client, tokenizer):
    first = client.chat.completions.create(model="m", messages=user(ADD_QUESTION), tools=[ADD_TOOL], temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = user(ADD_QUESTION) + [
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r = client.chat.completions.create(
        model="m", messages=messages, tools=[ADD_TOOL], temperature=0, extra_body={"return_token_ids": True}
    )
    assert r.choices[0].message.content == ADD_ANSWER
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.prompt_token_ids == ids(tokenizer, ADD_TURN2[0])
    assert r.choices[0].token_ids == ids(tokenizer, ADD_TURN2[1])
    assert r.choices[0].token_versions == [0] * len(r.choices[0].token_ids)


def test_tool_choice_none_leaves_the_call_as_text(client):
    r = client.chat.completions.create(
        model="m", messages=user(ADD_QUESTION), tools=[ADD_TOOL], tool_choice="none", temperature=0
    )
    assert r.choices[0].message.content == ADD_CALL
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


# --------------------------------------------------------------------------- structured output
CLOSED_ADD = {
    "type": "function",
    "function": {
        **ADD_TOOL["function"],
        "strict": True,
        "parameters": {**ADD_TOOL["function"]["parameters"], "additionalProperties": False},
    },
}
GREETING = {
    "type": "object",
    "additionalProperties": False,
    "required": ["greeting", "polite"],
    "properties": {"greeting": {"type": "string", "maxLength": 12}, "polite": {"type": "boolean"}},
}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_response_format_json_schema_gives_valid_json_on_a_question_the_model_answers_in_prose(client, seed):
    jsonschema = pytest.importorskip("jsonschema")
    r = client.chat.completions.create(
        model="m",
        messages=user(HELLO_QUESTION),
        seed=seed,
        temperature=1.0,
        max_tokens=80,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "greeting", "schema": GREETING, "strict": True},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), GREETING)
    free = client.chat.completions.create(model="m", messages=user(HELLO_QUESTION), temperature=0)
    assert free.choices[0].message.content == HELLO_ANSWER  # the same server, unconstrained


def test_structured_output_streams_and_a_forced_call_is_a_tool_call_with_valid_arguments(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "greeting", "schema": GREETING}}
    stream = client.chat.completions.create(
        model="m", messages=user(HELLO_QUESTION), seed=4, max_tokens=80, response_format=fmt, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    whole = client.chat.completions.create(
        model="m", messages=user(HELLO_QUESTION), seed=4, max_tokens=80, response_format=fmt
    )
    assert text == whole.choices[0].message.content and set(json.loads(text)) == {"greeting", "polite"}
    anything = client.chat.completions.create(
        model="m", messages=user(HELLO_QUESTION), seed=4, max_tokens=60, response_format={"type": "json_object"}
    )
    content = anything.choices[0].message.content  # an object whose keys the model may never close: a prefix
    assert content.startswith("{") and (
        anything.choices[0].finish_reason == "length" or isinstance(json.loads(content), dict)
    )
    for seed in range(3):  # the model would greet: `required` makes it call, with arguments the schema allows
        r = client.chat.completions.create(
            model="m",
            messages=user(HELLO_QUESTION),
            tools=[CLOSED_ADD],
            tool_choice="required",
            seed=seed,
            temperature=1.0,
            max_tokens=80,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        args = json.loads(call.function.arguments)
        assert call.function.name == "add" and set(args) == {"a", "b"}
        assert all(isinstance(v, int) for v in args.values())


def test_strict_tools_with_tool_choice_auto_allow_text_or_calls_held_to_the_schema(client):
    """What the OpenAI Agents SDK sends by default (its function tools are strict)."""
    text = client.chat.completions.create(model="m", messages=user(HELLO_QUESTION), tools=[CLOSED_ADD], temperature=0)
    assert text.choices[0].message.content == HELLO_ANSWER and text.choices[0].finish_reason == "stop"
    call = client.chat.completions.create(model="m", messages=user(ADD_QUESTION), tools=[CLOSED_ADD], temperature=0)
    assert call.choices[0].finish_reason == "tool_calls"
    assert json.loads(call.choices[0].message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}


def test_a_named_tool_choice_reports_the_forced_tokens_as_certain(client, tokenizer):
    r = client.chat.completions.create(
        model="m",
        messages=user(ADD_QUESTION),
        tools=[ADD_TOOL],
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "add"}},
        logprobs=True,
    )
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
    lps = [t.logprob for t in r.choices[0].logprobs.content]
    forced = len(ids(tokenizer, '<tool_call>\n{"name": "add", "arguments": {"'))
    assert lps[:forced] == [0.0] * forced  # the grammar left one token: probability 1 under the mask
    assert any(lp < 0 for lp in lps[forced:])


def test_logprobs_are_the_engines_behaviour_logprobs(client, server, tokenizer):
    """Same prompt, seed and weights: /v1/chat/completions and /generate sample the same tokens with
    the same log-probs; top_logprobs are sorted, a distribution's top, and contain the greedy token."""
    r = client.chat.completions.create(
        model="m",
        messages=user(UNSEEN),
        temperature=1.0,
        seed=7,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    entries = r.choices[0].logprobs.content
    body = json.dumps(
        {
            "input_ids": r.prompt_token_ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True},
        }
    ).encode()
    req = urllib.request.Request(
        server + "/generate",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        native = json.loads(resp.read())
    pairs = native["meta_info"]["output_token_logprobs"]
    assert r.choices[0].token_ids == native["output_ids"] and len(entries) == 8
    assert [e.logprob for e in entries] == pytest.approx([p[0] for p in pairs], abs=1e-5)
    assert [e.token for e in entries] == [tokenizer.decode([t]) for t in native["output_ids"]]
    for e, tok in zip(entries, native["output_ids"]):
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert math.log(sum(math.exp(x) for x in tops)) <= 1e-6  # part of one distribution
        assert e.logprob <= tops[0] + 1e-6
        if tokenizer.decode([tok]) in [t.token for t in e.top_logprobs]:
            assert e.logprob == pytest.approx(tops[[t.token for t in e.top_logprobs].index(e.token)], abs=1e-6)


def test_n_choices_are_seeded_per_choice(client):
    kw = dict(
        model="m",
        messages=user(UNSEEN),
        temperature=1.0,
        max_tokens=6,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    r = client.chat.completions.create(n=3, seed=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18 and all(c.finish_reason == "length" for c in r.choices)
    alone = [client.chat.completions.create(seed=s, **kw).choices[0].token_ids for s in (3, 4, 5)]
    assert [c.token_ids for c in r.choices] == alone
    assert len({tuple(t) for t in alone}) > 1


def test_stop_string_and_max_tokens(client):
    r = client.chat.completions.create(model="m", messages=user(HELLO_QUESTION), temperature=0, stop=[","])
    assert r.choices[0].message.content == "Hello there" and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="m", messages=user(HELLO_QUESTION), temperature=0, max_completion_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    assert HELLO_ANSWER.startswith(r.choices[0].message.content)


def test_streamed_chunks_assemble_to_the_unstreamed_answer(client):
    kw = dict(model="m", messages=user(HELLO_QUESTION), temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, logprobs=True, **kw)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == HELLO_ANSWER
    assert (
        sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices and c.choices[0].logprobs)
        == whole.usage.completion_tokens
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert len({c.id for c in chunks}) == 1
    # with tools: the call arrives as one tool_calls delta
    streamed = list(
        client.chat.completions.create(
            model="m", messages=user(ADD_QUESTION), tools=[ADD_TOOL], temperature=0, stream=True
        )
    )
    calls = [tc for c in streamed for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        (0, "add", {"a": 2, "b": 3})
    ]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_a_long_stream_arrives_as_it_is_decoded_and_a_closed_stream_aborts(client, server):
    """300 tokens of a question the model never saw: the first text long before the last, the
    pieces join to the answer; a client that reads two chunks and closes frees the engine."""
    import time

    kw = dict(
        model="m", messages=user(UNSEEN), temperature=1.0, seed=3, max_tokens=300, extra_body={"ignore_eos": True}
    )
    t0 = time.perf_counter()
    arrivals, text = [], ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - t0)
            text += chunk.choices[0].delta.content
    whole = client.chat.completions.create(**kw)
    assert text == whole.choices[0].message.content and whole.usage.completion_tokens == 300
    assert len(arrivals) >= 5 and arrivals[0] < 0.5 * arrivals[-1], arrivals[:3] + arrivals[-1:]

    for completion in (False, True):  # 4 x 450 tokens: seconds of decoding left when the client leaves
        stream = (
            client.completions.create(
                model="m", prompt=UNSEEN, stream=True, max_tokens=450, n=4, extra_body={"ignore_eos": True}
            )
            if completion
            else client.chat.completions.create(stream=True, **{**kw, "max_tokens": 450, "n": 4})
        )
        for k, _ in enumerate(stream):
            if k == 2:
                break
        stream.close()
        deadline = time.monotonic() + 0.5  # an abort frees the rows at the next step boundary
        while time.monotonic() < deadline:
            ask = urllib.request.Request(server + "/get_server_info", headers={"Authorization": f"Bearer {KEY}"})
            info = json.loads(urllib.request.urlopen(ask, timeout=5).read())
            if info["internal_states"][0]["running"] == 0:
                break
            time.sleep(0.05)
        assert info["internal_states"][0]["running"] == 0, info  # aborted, not decoding to 400 tokens


# --------------------------------------------------------------------------- completions and models
def test_completions_text_and_token_prompts(client, tokenizer):
    prompt = HELLO_TURN[0]
    r = client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0, logprobs=2)
    choice = r.choices[0]
    assert choice.text == HELLO_ANSWER and choice.finish_reason == "stop" and r.object == "text_completion"
    n = r.usage.completion_tokens
    assert n == len(ids(tokenizer, HELLO_TURN[1])) and r.usage.prompt_tokens == len(ids(tokenizer, prompt))
    assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == len(choice.logprobs.top_logprobs) == n
    assert all(
        len(alts) <= 3 and tok in alts for tok, alts in zip(choice.logprobs.tokens, choice.logprobs.top_logprobs)
    )
    assert choice.logprobs.text_offset[:2] == [0, len(choice.logprobs.tokens[0])]
    by_ids = client.completions.create(model="m", prompt=ids(tokenizer, prompt), max_tokens=20, temperature=0)
    assert by_ids.choices[0].text == HELLO_ANSWER
    # a batch of prompts x n choices: indexes run prompt-major
    batch = client.completions.create(model="m", prompt=[prompt, ADD_TURN2[0]], n=2, max_tokens=20, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == [HELLO_ANSWER] * 2 + [ADD_ANSWER] * 2
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == HELLO_ANSWER
    assert client.completions.create(model="m", prompt=prompt, temperature=0).usage.completion_tokens == len(
        ids(tokenizer, HELLO_TURN[1])
    )  # within OpenAI's default max_tokens of 16


def test_models_list_and_retrieve(client, model_dir):
    [model] = client.models.list().data
    assert model.id == Path(model_dir).name and model.object == "model" and model.owned_by == "areal-graph"
    assert str(model_dir) not in json.dumps(model.model_dump())  # the path stays on the server
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")


# --------------------------------------------------------------------------- auth and errors
def test_api_key_is_the_bearer_token(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server + "/v1/models", timeout=10)
    assert err.value.code == 401
    with urllib.request.urlopen(server + "/health", timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.parametrize(
    "kwargs, param, fragment",
    [
        (dict(n=17), "n", "[1, 16]"),
        (
            dict(messages=user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])),
            "messages[0].content[0]",
            "text-only",
        ),
        (dict(logit_bias={"5": 10}), "logit_bias", "not supported"),
        (dict(frequency_penalty=2.5), "frequency_penalty", "[-2, 2]"),
        (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty", "> 0"),
        (dict(tool_choice="required"), "tool_choice", "needs 'tools'"),
        (
            dict(tools=[ADD_TOOL], tool_choice={"type": "function", "function": {"name": "mul"}}),
            "tool_choice",
            "not in 'tools'",
        ),
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}),
            "response_format",
            "Invalid type",
        ),
        (dict(tools=[{"type": "web_search"}]), "tools[0]", "function"),
        (dict(response_format={"type": "yaml"}), "response_format", "must be 'text'"),
        (dict(top_logprobs=2), "top_logprobs", "logprobs"),
        (dict(temperature=3), "temperature", "[0, 2]"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
        (dict(max_tokens=100_000), "max_tokens", "context"),
        (dict(messages=[]), "messages", "non-empty"),
        (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role", "one of"),
        (dict(extra_body={"best_of": 2}), "best_of", "unsupported parameter"),
        (dict(functions=[{"name": "f"}]), "functions", "unsupported parameter"),
    ],
)
def test_unsupported_requests_get_a_clear_400(client, kwargs, param, fragment):
    args = {"model": "m", "messages": user(HELLO_QUESTION), **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"
    assert fragment in err.value.body["message"]


def reference_logprobs(model_dir, token_ids: list[int]):
    """log p(token_t | tokens < t) in float64 with transformers alone: the independent reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([token_ids])).logits[0], -1)
    return logp


def test_echo_returns_the_prompts_log_probs_in_the_shape_lm_eval_reads(client, model_dir, tokenizer):
    """(The token texts are the server's own spelling, `token_text_and_bytes`; the numbers are
    what is checked.) lm-eval's log-likelihood request: token ids, echo, logprobs 1, max_tokens 1 (it reads
    token_logprobs[ctxlen:-1]); and max_tokens 0, the prompt alone."""
    from areal_graph.engines.openai.chat_format import token_text_and_bytes

    prompt = ids(tokenizer, HELLO_TURN[0] + HELLO_TURN[1])  # a conversation the model knows by heart
    ref = reference_logprobs(model_dir, prompt)
    for max_tokens in (1, 0):
        out = client.completions.create(
            model="m", prompt=prompt, echo=True, logprobs=2, max_tokens=max_tokens, temperature=0
        )
        lp = out.choices[0].logprobs
        assert len(lp.token_logprobs) == len(prompt) + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        gaps = [abs(lp.token_logprobs[t] - float(ref[t - 1, prompt[t]])) for t in range(1, len(prompt))]
        assert max(gaps) <= 1e-4, max(gaps)
        for t in range(1, len(prompt)):  # the 2 most likely, and the prompt's own token
            best = [token_text_and_bytes(tokenizer, int(i))[0] for i in ref[t - 1].topk(2).indices]
            assert set(best) <= set(lp.top_logprobs[t]) and len(lp.top_logprobs[t]) <= 3
        assert out.choices[0].text.startswith(tokenizer.decode(prompt))
        assert lp.text_offset == sorted(lp.text_offset)
    # the known conversation scores high, a shuffled one low: the numbers mean something
    shuffled = prompt[:2] + prompt[2:][::-1]
    low = client.completions.create(model="m", prompt=shuffled, echo=True, logprobs=0, max_tokens=0).choices[0]
    assert sum(lp.token_logprobs[1:]) > sum(low.logprobs.token_logprobs[1:]) + 5


def test_echo_without_logprobs_gives_the_prompt_text_back(client):
    out = client.completions.create(model="m", prompt=HELLO_QUESTION, echo=True, max_tokens=2, temperature=0)
    assert out.choices[0].text.startswith(HELLO_QUESTION) and out.choices[0].logprobs is None


def test_completions_errors_and_unknown_routes(client):
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="m", prompt="hi", echo=True, stream=True)
    with pytest.raises(openai.BadRequestError, match="prompt"):
        client.completions.create(model="m", prompt=[])
    with pytest.raises(openai.NotFoundError, match="not implemented"):
        client.embeddings.create(model="m", input="hi")
    # the server still answers
    assert (
        client.chat.completions.create(model="m", messages=user(HELLO_QUESTION), temperature=0)
        .choices[0]
        .message.content
        == HELLO_ANSWER
    )


def test_a_2mb_prompt_is_refused_untokenized_while_health_answers_within_100ms(server, client):
    """The character limit (32 per token of the 512-token context) refuses it before the
    tokenizer sees it; the JSON body is the only work on the event loop."""
    import threading
    import time

    big = "two words " * 200_000  # 2 MB
    refused: list = []

    def send() -> None:
        for prompt in (big, [{"role": "user", "content": big}]):
            try:
                if isinstance(prompt, str):
                    client.completions.create(model="m", prompt=prompt, max_tokens=1)
                else:
                    client.chat.completions.create(model="m", messages=prompt, max_tokens=1)
            except openai.BadRequestError as err:
                refused.append(err.body)

    sender = threading.Thread(target=send)
    latencies = []
    sender.start()
    while sender.is_alive():
        t0 = time.perf_counter()
        urllib.request.urlopen(server + "/health", timeout=5).read()
        latencies.append(time.perf_counter() - t0)
    sender.join()
    assert [b["param"] for b in refused] == ["prompt", "messages"]
    assert all("2000000 characters" in b["message"] and b["code"] == "context_length_exceeded" for b in refused)
    assert latencies and max(latencies) < 0.1, max(latencies)
