"""The calculator task's agent, written as anyone would write it for the `openai` package.

Nothing here knows about RL: the function gets an `openai.AsyncOpenAI` (during training a
`RecordingOpenAI`, which generates with the policy and records every token) and a prompt, and
runs the usual tool loop. `workflows/agent_calculator_openai.yaml` trains it; pointed at any
OpenAI-compatible server (`areal-graph serve builtin:tiny-calc`) it runs unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from areal_graph.tools.calculator import calculate

CALCULATOR: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


async def calculator_agent(client: Any, prompt: Any, max_turns: int = 3) -> None:
    """Ask, run every tool call, ask again; the workflow's reward node scores the final answer."""
    messages = list(prompt.messages)
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        if not message.tool_calls:
            return None  # the final answer: the reward node (math_verify) scores it
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    return None


CALCULATOR_FUNCTION: dict[str, Any] = {
    "type": "function",
    **CALCULATOR["function"],
}  # the Responses API's flat tool shape


async def calculator_responses_agent(client: Any, prompt: Any, max_turns: int = 3) -> None:
    """`calculator_agent` on the Responses API (`client.responses.create`), as an Agents SDK model
    would call it: the output items and the tool's results go back as input items."""
    items: list[Any] = list(prompt.messages)
    for _ in range(max_turns):
        reply = await client.responses.create(model="policy", input=items, tools=[CALCULATOR_FUNCTION])
        calls = [item for item in reply.output if item.type == "function_call"]
        if not calls:
            return None  # the final answer: the reward node (math_verify) scores it
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        for call in calls:
            try:
                expression = json.loads(call.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": calculate(str(expression))}
            )
    return None
