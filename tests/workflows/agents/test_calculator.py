"""workflows/agents/calculator.py: the calculator agent's tool loop, against a scripted stand-in
for `openai.AsyncOpenAI`. It asks with the calculator tool offered, runs every tool call of a
reply (parsing its JSON arguments, and turning malformed ones into an empty expression the tool
refuses), sends each result back as a `tool` message for that call's id, and stops at the first
reply without tool calls or after `max_turns` requests.

tests/workflows/test_agent_calculator.py and test_openai_agent.py run agents against a served
model; here the client is scripted, so each parsing case is checked without a server."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from areal_graph.tools.calculator import calculate
from areal_graph.workflows.agents.calculator import CALCULATOR, calculator_agent


@dataclass
class Call:
    id: str
    arguments: str

    @property
    def function(self):
        return SimpleNamespace(name="calculator", arguments=self.arguments)


@dataclass
class Message:
    content: str | None = None
    tool_calls: list[Call] | None = None

    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        out = {
            "role": "assistant",
            "content": self.content,
            "tool_calls": None
            if self.tool_calls is None
            else [
                {"id": c.id, "type": "function", "function": {"name": "calculator", "arguments": c.arguments}}
                for c in self.tool_calls
            ],
        }
        return {k: v for k, v in out.items() if v is not None} if exclude_none else out


@dataclass
class ScriptedClient:
    """`client.chat.completions.create(...)` returns the next scripted message; requests are recorded."""

    replies: list[Message]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self):
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kwargs):
        self.requests.append(copy.deepcopy(kwargs))  # the agent keeps appending to its list
        message = self.replies[min(len(self.requests), len(self.replies)) - 1]
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


PROMPT = SimpleNamespace(
    messages=[{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 2+3*4?"}]
)


def _run(client, prompt=PROMPT, **kw):
    return asyncio.run(calculator_agent(client, prompt, **kw))


def test_a_tool_call_is_answered_with_the_tools_result_then_the_final_answer_ends_it():
    client = ScriptedClient(
        [
            Message(tool_calls=[Call("call_1", json.dumps({"expression": "2+3*4"}))]),
            Message(content="The answer is 14."),
        ]
    )
    assert _run(client) is None
    assert len(client.requests) == 2
    first, second = client.requests
    assert first == {"model": "policy", "messages": PROMPT.messages, "tools": [CALCULATOR]}
    assert second["messages"] == PROMPT.messages + [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+3*4"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "14"},
    ]
    assert len(PROMPT.messages) == 2  # the prompt's own list is not changed


def test_every_call_of_a_reply_is_run_in_order():
    client = ScriptedClient(
        [
            Message(
                content="let me see", tool_calls=[Call("a", '{"expression": "1/4"}'), Call("b", '{"expression": 7}')]
            ),
            Message(content="0.25 and 7"),
        ]
    )
    _run(client)
    tool_messages = [m for m in client.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "a", "content": "0.25"},
        {"role": "tool", "tool_call_id": "b", "content": "7"},
    ]  # a number is used as text
    assert client.requests[1]["messages"][2]["content"] == "let me see"


@pytest.mark.parametrize(
    "arguments", ['{"expression": ', "not json", "null", "[1, 2]", '"2+2"', "{}", '{"expr": "2+2"}']
)
def test_malformed_arguments_become_an_empty_expression_the_tool_refuses(arguments):
    client = ScriptedClient([Message(tool_calls=[Call("c", arguments)]), Message(content="done")])
    _run(client)
    tool = client.requests[1]["messages"][-1]
    assert tool == {"role": "tool", "tool_call_id": "c", "content": calculate("")}
    assert tool["content"].startswith("Error: ")


def test_a_refused_expression_is_the_observation_not_an_exception():
    client = ScriptedClient(
        [Message(tool_calls=[Call("c", '{"expression": "__import__(\'os\')"}')]), Message(content="ok")]
    )
    _run(client)
    assert client.requests[1]["messages"][-1]["content"].startswith("Error: ")


@pytest.mark.parametrize("max_turns", [1, 3, 5])
def test_an_agent_that_keeps_calling_the_tool_stops_after_max_turns(max_turns):
    client = ScriptedClient([Message(tool_calls=[Call("c", '{"expression": "1+1"}')])])
    assert _run(client, max_turns=max_turns) is None
    assert len(client.requests) == max_turns
    last = client.requests[-1]["messages"]
    assert len(last) == 2 + 2 * (max_turns - 1)  # each earlier turn added its reply and one tool result


def test_zero_turns_asks_nothing():
    client = ScriptedClient([Message(content="never asked")])
    assert _run(client, max_turns=0) is None and client.requests == []


def test_an_answer_without_tool_calls_ends_at_once():
    for message in (Message(content="14"), Message(content="14", tool_calls=[])):
        client = ScriptedClient([message])
        assert _run(client) is None and len(client.requests) == 1


def test_the_tool_is_described_as_openai_function_calling_expects():
    fn = CALCULATOR["function"]
    assert CALCULATOR["type"] == "function" and fn["name"] == "calculator"
    assert fn["parameters"] == {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    }
