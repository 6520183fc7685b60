"""What the OpenAI request parser accepts because it cannot change the output, and what it
still refuses because it would (engines/openai/chat_requests.py)."""

from __future__ import annotations

import logging

import pytest

from areal_graph.engines.openai.chat_requests import (
    OpenAIRequestError,
    parse_chat_request,
    parse_completion_request,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "extra",
    [
        {"store": True},
        {"service_tier": "auto"},
        {"prompt_cache_key": "k"},
        {"safety_identifier": "u1"},
        {"verbosity": "low"},
        {"modalities": ["text"]},
        {"min_p": 0},
        {"min_p": 0.0},
        {"repetition_penalty": 1},
        {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}},
    ],
)
def test_fields_that_cannot_change_the_output_are_accepted(extra):
    plain = parse_chat_request(dict(CHAT))
    got = parse_chat_request({**CHAT, **extra})
    assert (got.temperature, got.top_p, got.max_tokens, got.messages) == (
        plain.temperature,
        plain.top_p,
        plain.max_tokens,
        plain.messages,
    )
    assert got.include_usage == bool(extra.get("stream_options", {}).get("include_usage"))


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"min_p": 0.1}, "min_p"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"frequency_penalty": 2.1}, "frequency_penalty"),
        ({"presence_penalty": "high"}, "presence_penalty"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"made_up_field": 1}, "made_up_field"),
    ],
)
def test_fields_that_would_change_it_are_still_refused(extra, param):
    with pytest.raises(OpenAIRequestError) as err:
        parse_chat_request({**CHAT, **extra})
    assert err.value.param == param


def test_an_ignored_field_is_noted_once_as_a_warning_and_the_callers_body_is_untouched(caplog, monkeypatch):
    from areal_graph.engines.openai import chat_requests

    monkeypatch.setattr(chat_requests, "_noted", set())  # as in a fresh server process
    body = {**CHAT, "store": True}
    with caplog.at_level(logging.WARNING, "areal_graph.engines.openai.chat_requests"):
        parse_chat_request(body)
        parse_chat_request(body)
    assert body["store"] is True  # the parser works on a copy
    assert caplog.text.count("'store' accepted and ignored") == 1  # visible at the CLI's default level


def test_input_text_parts_are_text_and_strict_tools_are_taken_with_every_tool_choice():
    got = parse_chat_request(
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
        }
    )
    assert got.messages[0]["content"] == "ab"
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    assert parse_chat_request({**CHAT, "tools": [strict]}).tool_choice == "auto"  # enforced by a grammar
    with pytest.raises(OpenAIRequestError) as err:
        parse_chat_request({**CHAT, "tools": [{"type": "function", "function": {**TOOL["function"], "strict": 1}}]})
    assert err.value.param == "tools[0].function.strict"
    assert parse_chat_request({**CHAT, "tools": [{**TOOL, "function": {**TOOL["function"], "strict": False}}]}).tools
    # a grammar holds the turn: forced calls, or response_format beside the tools
    assert parse_chat_request({**CHAT, "tools": [strict], "tool_choice": "required"}).tool_choice == "required"
    assert parse_chat_request(
        {**CHAT, "tools": [strict], "response_format": {"type": "json_object"}}
    ).response_format == {"type": "json_object"}


@pytest.mark.parametrize(
    "choice, param_fragment",
    [
        ("required", None),
        ({"type": "function", "function": {"name": TOOL["function"]["name"]}}, None),
        ({"type": "function", "function": {"name": "nope"}}, "not in 'tools'"),
        ({"type": "function"}, "must be 'auto'"),
        ("sometimes", "must be 'auto'"),
    ],
)
def test_tool_choice_forms(choice, param_fragment):
    body = {**CHAT, "tools": [TOOL], "tool_choice": choice}
    if param_fragment is None:
        got = parse_chat_request(body).tool_choice
        assert got == choice
    else:
        with pytest.raises(OpenAIRequestError, match=param_fragment) as err:
            parse_chat_request(body)
        assert err.value.param == "tool_choice"


@pytest.mark.parametrize(
    "fmt, expect",
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}},
            {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a"}},
            {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
        ),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": [1]}}, "response_format.json_schema.schema"),
        ({"type": "xml"}, "response_format"),
        ("json", "response_format"),
    ],
)
def test_response_format_forms(fmt, expect):
    body = {**CHAT, "response_format": fmt}
    if isinstance(expect, str):
        with pytest.raises(OpenAIRequestError) as err:
            parse_chat_request(body)
        assert err.value.param == expect
    else:
        assert parse_chat_request(body).response_format == expect


def test_completions_take_echo_false_and_the_same_harmless_fields():
    got = parse_completion_request({"model": "m", "prompt": "2+2=", "echo": False, "store": False, "min_p": 0})
    assert got.prompts == ["2+2="]
    assert got.echo is False and got.max_tokens == 16


def test_echo_may_score_the_prompt_alone_but_not_stream():
    got = parse_completion_request({"model": "m", "prompt": [5, 6, 7], "echo": True, "max_tokens": 0, "logprobs": 1})
    assert got.echo and got.max_tokens == 0 and got.logprobs == 1
    with pytest.raises(OpenAIRequestError, match="'max_tokens' must be") as err:
        parse_completion_request({"model": "m", "prompt": "2+2=", "max_tokens": 0})  # without echo: nothing asked
    assert err.value.param == "max_tokens"
    with pytest.raises(OpenAIRequestError, match="'echo' with 'stream' is not built yet") as err:
        parse_completion_request({"model": "m", "prompt": "2+2=", "echo": True, "stream": True})
    assert err.value.param == "echo"


def test_the_sampling_penalties_are_taken_with_their_ranges():
    got = parse_chat_request({**CHAT, "frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.3})
    assert (got.frequency_penalty, got.presence_penalty, got.repetition_penalty) == (0.5, -1.0, 1.3)
    plain = parse_chat_request(dict(CHAT))
    assert (plain.frequency_penalty, plain.presence_penalty, plain.repetition_penalty) == (0.0, 0.0, 1.0)
