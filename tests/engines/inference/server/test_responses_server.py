"""The Responses API (/v1/responses), driven by the official `openai` package against a real server.

One server per module (a subprocess with the real embedded engine, an API key) serving the tiny
model that knows a tool-call conversation and a greeting by heart (`openai_tool_model.py`).
The chat completions route is the reference: the same conversation asked both ways must give
the same prompt tokens, the same answer and, with the same seed, the same log-probs.
"""

from __future__ import annotations

import json

import openai
import pytest

from support.openai_tool_model import (
    ADD_ANSWER,
    ADD_FUNCTION,
    ADD_QUESTION,
    ADD_TOOL,
    ADD_TURN1,
    ADD_TURN2,
    HELLO_ANSWER,
    HELLO_QUESTION,
    build_tool_model,
    ids,
    served_tool_model,
)

KEY = "sk-test-responses"
UNSEEN = "Tell me something new."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tool_model(str(tmp_path_factory.getbasetemp() / "openai_tool_model"))[0]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def client(model_dir):
    with served_tool_model(model_dir, KEY) as url:
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as c:
            yield c


def test_a_text_answer_is_one_message_item(client, tokenizer):
    r = client.responses.create(model="tool-model", input=HELLO_QUESTION, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == HELLO_ANSWER and r.model == "tool-model"
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [p.type for p in item.content] == ["output_text"] and item.content[0].logprobs == []
    assert r.usage.input_tokens == len(
        ids(tokenizer, f"<|bos|><|im_start|>user\n{HELLO_QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    )
    assert r.usage.output_tokens == len(ids(tokenizer, HELLO_ANSWER + "<|im_end|>"))
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_and_input_items_make_the_chat_prompt(client):
    """instructions = a system message; items = messages; the prompt is chat's, token for token."""
    chat = client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": UNSEEN}],
        temperature=1.0,
        seed=5,
        max_tokens=6,
        logprobs=True,
    )
    r = client.responses.create(
        model="m",
        instructions="Be brief.",
        temperature=1.0,
        max_output_tokens=6,
        input=[{"role": "user", "content": [{"type": "input_text", "text": UNSEEN}]}],
        include=["message.output_text.logprobs"],
        extra_body={"seed": 5},
    )
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content
    assert [lp.logprob for lp in r.output[0].content[0].logprobs] == pytest.approx(
        [e.logprob for e in chat.choices[0].logprobs.content], abs=1e-6
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"


def test_a_function_call_and_its_output_sent_back_as_items(client, tokenizer):
    first = client.responses.create(model="m", input=ADD_QUESTION, tools=[ADD_FUNCTION], temperature=0)
    [call] = first.output
    assert call.type == "function_call" and call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert call.call_id and call.id.startswith("fc_") and first.status == "completed"
    assert first.usage.output_tokens == len(ids(tokenizer, ADD_TURN1[1]))
    items = [
        {"role": "user", "content": ADD_QUESTION},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    second = client.responses.create(model="m", input=items, tools=[ADD_FUNCTION], temperature=0)
    assert second.output_text == ADD_ANSWER
    assert second.usage.input_tokens == len(ids(tokenizer, ADD_TURN2[0]))
    # the same turn through previous_response_id: only the new item is sent
    third = client.responses.create(
        model="m",
        previous_response_id=first.id,
        tools=[ADD_FUNCTION],
        temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
    )
    assert third.output_text == ADD_ANSWER and third.previous_response_id == first.id
    assert third.usage.input_tokens == second.usage.input_tokens


def test_a_forced_function_and_a_json_schema_format(client):
    r = client.responses.create(
        model="m",
        input=HELLO_QUESTION,
        tools=[{**ADD_FUNCTION, "strict": True}],
        tool_choice={"type": "function", "name": "add"},
        temperature=0,
    )
    [call] = r.output
    args = json.loads(call.arguments)
    assert call.name == "add" and set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    schema = {
        "type": "object",
        "properties": {"greeting": {"type": "string"}},
        "required": ["greeting"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model="m",
        input=HELLO_QUESTION,
        temperature=0,
        max_output_tokens=80,
        text={"format": {"type": "json_schema", "name": "g", "schema": schema, "strict": True}},
    )
    assert set(json.loads(r.output_text)) == {"greeting"}


def test_streamed_events_in_order_and_assembling_to_the_answer(client):
    whole = client.responses.create(model="m", input=HELLO_QUESTION, temperature=0)
    events = list(
        client.responses.create(
            model="m",
            input=HELLO_QUESTION,
            temperature=0,
            stream=True,
            include=["message.output_text.logprobs"],
            extra_body={"seed": 5},
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == HELLO_ANSWER == events[-1].response.output_text
    done = events[-1].response
    assert sum(len(e.logprobs) for e in deltas) == done.usage.output_tokens == whole.usage.output_tokens
    assert {e.item_id for e in deltas} == {done.output[0].id} and events[0].response.status == "in_progress"
    # with tools the turn is parsed whole, then sent as the same events
    tool_events = list(
        client.responses.create(model="m", input=ADD_QUESTION, tools=[ADD_FUNCTION], temperature=0, stream=True)
    )
    kinds = [e.type for e in tool_events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert json.loads(tool_events[4].arguments) == {"a": 2, "b": 3} and tool_events[4].name == "add"


def test_stored_responses_are_retrieved_listed_deleted_and_store_false_keeps_nothing(client):
    r = client.responses.create(
        model="m",
        instructions="Hi.",
        input=[{"role": "user", "content": HELLO_QUESTION}],
        temperature=0,
        metadata={"run": "7"},
    )
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == HELLO_ANSWER and got.metadata == {"run": "7"}
    listed = client.responses.input_items.list(r.id)
    assert [(i.type, i.role) for i in listed.data] == [("message", "user")]
    assert client.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="m", input=HELLO_QUESTION, temperature=0, store=False)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="and then?", previous_response_id=unstored.id)
    assert err.value.code == "previous_response_not_found" and err.value.param == "previous_response_id"


@pytest.mark.parametrize(
    "kwargs, param, fragment",
    [
        (dict(tools=[{"type": "web_search"}]), "tools[0]", "only tools of type 'function'"),
        (dict(reasoning={"effort": "high"}), "reasoning.effort", "does not reason"),
        (
            dict(
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_image", "image_url": "http://x/y.png"},
                        ],
                    }
                ]
            ),
            "input[0].content[1]",
            "text-only model",
        ),
        (dict(max_output_tokens=0), "max_output_tokens", ">= 1"),
        (dict(truncation="auto"), "truncation", "not built yet"),
        (dict(background=True), "background", "not built yet"),
        (dict(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema", "JSON Schema"),
        (dict(tool_choice={"type": "function", "name": "nope"}, tools=[ADD_FUNCTION]), "tool_choice", "'nope'"),
        (dict(temperature=3), "temperature", "[0, 2]"),
        (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0]", "not built yet"),
    ],
)
def test_what_is_not_supported_is_a_400_naming_the_responses_field(client, kwargs, param, fragment):
    kwargs = {"model": "m", "input": HELLO_QUESTION, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**kwargs)
    assert err.value.param == param and fragment in err.value.message, err.value.message


def test_reasoning_effort_none_and_verbosity_the_agents_sdk_defaults_are_accepted(client):
    r = client.responses.create(
        model="gpt-5.6-luna",
        input=HELLO_QUESTION,
        temperature=0,
        include=[],
        reasoning={"effort": "none"},
        text={"verbosity": "low"},
        store=True,
    )
    assert r.output_text == HELLO_ANSWER and r.model == "gpt-5.6-luna"
    chat_tools = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": ADD_QUESTION}], tools=[ADD_TOOL], temperature=0
    )
    resp_tools = client.responses.create(model="m", input=ADD_QUESTION, tools=[ADD_FUNCTION], temperature=0)
    assert chat_tools.usage.prompt_tokens == resp_tools.usage.input_tokens
