"""Tool calls in the Hermes / Qwen2.5 convention, as text: what the policy writes and reads.

The assistant calls a tool by writing, and then ending its turn (EOS `<|im_end|>`):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "347 * 58"}}
    </tool_call>

and the result comes back as a message of role `tool` in the ChatML layout, after which the
assistant speaks again:

    <|im_start|>tool
    20126<|im_end|>
    <|im_start|>assistant

One module says how those look so that everything producing or reading them agrees to the
character: the kit's chat template (modelkit/tokenizer.py, which renders assistant messages
carrying `tool_calls` and `tool` messages exactly so), the SFT data that teaches the format
(data/calc.py), the multi-turn rollout that executes calls during RL
(workflows/rollout/calculator_agent.py), and an OpenAI-compatible server parsing calls out
of generated text. Torch-free and dependency-free.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "render_tool_call",
    "parse_tool_calls",
    "tool_turn_text",
    "TOOL_CALL_OPEN",
    "TOOL_CALL_CLOSE",
    "MAX_CALLS_PER_TURN",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# More calls than this in one turn are ignored (each costs a tool run and context).
MAX_CALLS_PER_TURN = 4
_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_CLOSE), re.S)


@dataclass
class ToolCall:
    """One parsed call: `error` says why it cannot be run (bad JSON, no name), else None."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call, as the chat template renders it (json.dumps default separators)."""
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n{TOOL_CALL_CLOSE}'


def _parse_one(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return ToolCall(error="the tool call is not valid JSON")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(error='the tool call needs {"name": ..., "arguments": {...}}')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return ToolCall(obj["name"], error="the tool call's arguments are not valid JSON")
    if not isinstance(arguments, dict):
        return ToolCall(obj["name"], error="the tool call's arguments must be an object")
    return ToolCall(obj["name"], arguments)


def parse_tool_calls(text: str, max_calls: int = MAX_CALLS_PER_TURN) -> list[ToolCall]:
    """Every closed `<tool_call>...</tool_call>` block of `text` (at most `max_calls`), in order."""
    return [_parse_one(m.group(1)) for m in _CALL_RE.finditer(text)][:max_calls]


def tool_turn_text(results: list[str]) -> str:
    """The text that follows an assistant turn ending in tool calls (its EOS already written):
    one `tool` message per result, then the header of the assistant's next turn."""
    return "".join(f"\n<|im_start|>tool\n{r}<|im_end|>" for r in results) + "\n<|im_start|>assistant\n"
