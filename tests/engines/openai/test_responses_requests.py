"""The Responses API's request parsing, item conversion, output items and store, without a server.

The conversions are checked against conversations written out by hand in chat's shape (what
the chat template renders), and the store's bound by property: whatever is put, memory stays
under its limits and the newest response is always there.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.engines.openai import responses_format as rfmt
from areal_graph.engines.openai.chat_requests import OpenAIRequestError
from areal_graph.engines.openai.responses_requests import items_to_messages, parse_responses_request
from areal_graph.engines.openai.responses_store import ResponseStore, StoredResponse

ADD = {
    "type": "function",
    "name": "add",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "strict": True,
}


def test_an_agents_sdk_history_becomes_the_chat_conversation():
    """What the Agents SDK sends on its second turn: the user's message, the model's output items
    as it got them (a message and a call, with ids and statuses), the tool's output."""
    items = [
        {"role": "user", "content": "2+3?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me add.", "annotations": [], "logprobs": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_9",
            "name": "add",
            "arguments": '{"a": 2}',
            "status": "completed",
        },
        {"type": "function_call", "id": "fc_2", "call_id": "call_10", "name": "add", "arguments": '{"a": 3}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "5"},
        {"type": "function_call_output", "call_id": "call_10", "output": [{"type": "input_text", "text": "6"}]},
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer now."}]},
    ]
    assert items_to_messages(items) == [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
                {"id": "call_10", "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "5"},
        {"role": "tool", "tool_call_id": "call_10", "content": "6"},
        {"role": "developer", "content": "Answer now."},
    ]
    request = parse_responses_request({"model": "m", "input": items, "instructions": "Be exact.", "tools": [ADD]})
    assert request.chat.messages[-1] == {"role": "system", "content": "Answer now."}  # developer: chat's name
    assert request.conversation([])[0] == {"role": "system", "content": "Be exact."}
    assert request.chat.tools == [
        {"type": "function", "function": {k: ADD[k] for k in ("name", "parameters", "strict")}}
    ]


def test_the_output_items_go_back_to_the_message_they_came_from():
    message = {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}],
    }
    items = rfmt.output_items(message, "stop", None)
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert items[1]["call_id"] == "call_1" and items[1]["status"] == "completed"
    assert rfmt.assistant_message(items) == message
    assert items_to_messages(items) == [message]
    calls_only = rfmt.output_items(
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}, "length", None
    )
    assert [i["type"] for i in calls_only] == ["function_call"] and calls_only[0]["status"] == "incomplete"
    assert rfmt.output_items({"role": "assistant", "content": ""}, "stop", None)[0]["content"][0]["text"] == ""


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": "x", "frequency": 1}, "frequency"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
        ({"model": "m", "input": [{"type": "computer_call"}]}, "input[0]"),
        ({"model": "m", "input": "x", "max_output_tokens": 99999999, "temperature": -1}, "temperature"),
        ({"model": "m", "input": "x", "top_logprobs": 21}, "top_logprobs"),
        ({"model": "m", "input": "x", "include": ["file_search_call.everything"]}, "include"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"model": "m", "input": "x", "instructions": ["a"]}, "instructions"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"model": "m", "input": "x", "store": "yes"}, "store"),
        ({"model": "m", "input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"model": "m", "input": "x", "reasoning": {"effort": "none", "summary": "auto"}}, "reasoning.summary"),
    ],
)
def test_refusals_name_the_responses_field(body, param):
    with pytest.raises(OpenAIRequestError) as err:
        parse_responses_request(body)
    assert err.value.param == param, err.value.message


def test_previous_response_id_alone_needs_no_input_and_ignored_hints_are_dropped():
    request = parse_responses_request(
        {
            "model": "m",
            "previous_response_id": "resp_1",
            "service_tier": "flex",
            "prompt_cache_key": "k",
            "max_tool_calls": 3,
            "truncation": "disabled",
        }
    )
    assert request.input_messages == [] and request.store is True and request.previous_response_id == "resp_1"
    asked = parse_responses_request({"model": "m", "input": "x", "top_logprobs": 3, "max_output_tokens": 7})
    assert asked.include_logprobs and asked.chat.logprobs and asked.chat.top_logprobs == 3
    assert asked.chat.max_tokens == asked.max_output_tokens == 7


def stored(rid: str, text: str) -> StoredResponse:
    response = {"id": rid, "output": [rfmt.message_item("msg_" + rid, text, None, "completed")]}
    return StoredResponse(
        response,
        [{"role": "user", "content": text}],
        {"role": "assistant", "content": text},
        [{"type": "message", "role": "user", "content": text}],
    )


def test_the_store_continues_forgets_by_name_and_deletes():
    store = ResponseStore(max_responses=2)
    for k in range(3):
        store.put(stored(f"r{k}", f"t{k}"))
    assert store.history("r2") == [{"role": "user", "content": "t2"}, {"role": "assistant", "content": "t2"}]
    assert store.history(None) == [] and store.evicted == 1
    with pytest.raises(OpenAIRequestError) as err:
        store.history("r0")
    assert err.value.code == "previous_response_not_found" and "keeps the last 2" in err.value.message
    assert store.delete("r1") and not store.delete("r1") and len(store) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 400)), min_size=1, max_size=60))
def test_the_store_stays_within_its_bounds_and_keeps_the_newest(puts):
    store = ResponseStore(max_responses=8, max_chars=3000)
    for _n, (key, size) in enumerate(puts):
        store.put(stored(f"r{key}", "x" * size))
        assert store.get(f"r{key}") is not None  # the newest is always kept, even if alone over the bound
        assert len(store) <= 8
        assert len(store) == 1 or store._chars <= 3000
        assert store._chars == sum(e.size() for e, _ in store._entries.values())
