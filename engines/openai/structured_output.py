"""What a chat request's `response_format` and `tool_choice` require of the answer, as the
schema or grammar the engine's constrained decoding holds it to (`constrained.py`).

OpenAI's meaning, and what each becomes:
- `response_format: {"type": "json_object"}`: the content is one JSON object
  (JSON Schema `{"type": "object"}`).
- `response_format: {"type": "json_schema", "json_schema": {"schema": S}}`: the content is
  JSON valid against S.
- `tool_choice: "required"`: the turn is tool calls only, at least one (exactly one when
  `parallel_tool_calls` is false), each naming a function of `tools`, its arguments valid
  against that function's `parameters`.
- `tool_choice: {"type": "function", "function": {"name": N}}`: exactly one call of N.
- `response_format` with tools and `tool_choice: "auto"`: the turn is either tool calls or the
  JSON answer (as with OpenAI, the model may still call tools before it answers).
- `tools[i].function.strict` with `tool_choice: "auto"`: the turn is free text that never
  writes a call itself, calls held to their schemas, or, where the tokenizer holds the open
  tag as one token (Qwen2.5's), text then calls. With the forcing choices above the arguments
  are held to the schemas anyway.

Tool calls are written as `api/tool_calls.py` renders them (`<tool_call>\\n{json}\\n</tool_call>`,
blocks joined by a newline), so the server's own parser reads them back. JSON is compact with
`json.dumps`'s separators: the form chat templates render and the parser reads, and flexible
whitespace would let a small model spend its token budget on blanks. Schemas of non-strict
tools are compiled leniently (keywords llguidance does not implement are ignored rather than
refused); a strict tool's or a response_format's are not: what cannot be enforced is a 400.

Pure and torch-free: the OpenAI routes and the recording client both call `output_constraint`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from areal_graph.api.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = ["OutputConstraint", "output_constraint", "added_token_texts", "JSON_LAYOUT"]

# llguidance's JSON layout options (`x-guidance`): json.dumps's default separators, no free whitespace
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class OutputConstraint:
    """Exactly one of the two, in SamplingParams' fields."""

    json_schema: str | None = None
    grammar: str | None = None


def _with_layout(schema: Any, lenient: bool) -> dict[str, Any]:
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON Schema must be an object, got {type(schema).__name__}")
    return {**schema, "x-guidance": {**JSON_LAYOUT, **({"lenient": True} if lenient else {})}}


def _call_schema(functions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One call of any of `functions`: {"name": <const>, "arguments": <its parameters>}."""
    options = []
    for fn in functions:
        params = fn.get("parameters")
        options.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "arguments"],
                "properties": {
                    "name": {"const": fn["name"]},
                    "arguments": params if isinstance(params, dict) else {"type": "object"},
                },
            }
        )
    lenient = not all(fn.get("strict") for fn in functions)
    return _with_layout(options[0] if len(options) == 1 else {"anyOf": options}, lenient)


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's


def _tag(text: str, token_texts: Mapping[str, int]) -> str:
    """A tool-call tag in the grammar: the tokenizer's own token where it has one (Qwen2.5 adds
    `<tool_call>` as one token, which llguidance matches by id, never as the text's bytes)."""
    return f"<[{int(token_texts[text])}]>" if text in token_texts else _lark_string(text)


def added_token_texts(tokenizer: Any) -> dict[str, int]:
    """The texts this tokenizer holds as single added tokens, with their ids (`<tool_call>` in Qwen2.5's)."""
    try:
        return {str(k): int(v) for k, v in tokenizer.get_added_vocab().items()}
    except (AttributeError, TypeError, ValueError):
        return {}


def _regex_escape(text: str) -> str:
    return "".join("\\" + ch if ch in ".^$*+?()[]{}|\\/" else ch for ch in text)


def _text_or_calls(token_texts: Mapping[str, int]) -> str:
    """Strict tools, free answers: text that never writes a call itself, calls held to their
    schemas, or (where the open tag is one token of its own, as in Qwen2.5) text then calls.
    Spelled in bytes, the tag could also end a text lexeme, and llguidance's lexemes are greedy:
    text and calls cannot share a turn there."""
    return "start: TEXT | TEXT? calls" if TOOL_CALL_OPEN in token_texts else "start: TEXT | calls"


def _calls_rule(functions: Sequence[dict[str, Any]], parallel: bool, token_texts: Mapping[str, int]) -> list[str]:
    call = (
        f'call: {_tag(TOOL_CALL_OPEN, token_texts)} "\\n" %json {json.dumps(_call_schema(functions))} '
        f'"\\n" {_tag(TOOL_CALL_CLOSE, token_texts)}'
    )
    calls = 'calls: call ("\\n" call)*' if parallel else "calls: call"
    return [calls, call]


def _response_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not response_format or response_format.get("type") == "text":
        return None
    if response_format["type"] == "json_object":
        return _with_layout({"type": "object"}, lenient=False)
    return _with_layout(response_format["json_schema"].get("schema", {}), lenient=False)


def output_constraint(
    tools: Sequence[dict[str, Any]],
    tool_choice: str | dict[str, Any],
    parallel_tool_calls: bool,
    response_format: dict[str, Any] | None,
    token_texts: Mapping[str, int] | None = None,
) -> OutputConstraint | None:
    """The constraint a checked chat request implies, or None when its answer is free text.

    `tools` are OpenAI tool objects ({"type": "function", "function": {...}}), `tool_choice`
    "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}} (already
    checked to name one of `tools`), `response_format` None or a checked response_format.
    `token_texts`: the tokenizer's single added tokens (`added_token_texts`), so that tags it
    holds as one token are generated as that token, as the model learned them.
    """
    functions = [t["function"] for t in tools]
    token_texts = token_texts or {}
    answer = _response_schema(response_format)
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        chosen = [fn for fn in functions if fn["name"] == name]
        return OutputConstraint(grammar="\n".join(["start: calls", *_calls_rule(chosen, False, token_texts)]))
    if tool_choice == "required":
        return OutputConstraint(
            grammar="\n".join(["start: calls", *_calls_rule(functions, parallel_tool_calls, token_texts)])
        )
    if functions and tool_choice == "auto" and answer is None and any(fn.get("strict") for fn in functions):
        return OutputConstraint(
            grammar="\n".join(
                [
                    _text_or_calls(token_texts),
                    *_calls_rule(functions, parallel_tool_calls, token_texts),
                    f"TEXT: /(.|\\n)+/ & ~/(.|\\n)*{_regex_escape(TOOL_CALL_OPEN)}(.|\\n)*/",
                ]
            )
        )
    if functions and tool_choice == "auto" and answer is not None:
        return OutputConstraint(
            grammar="\n".join(
                [
                    "start: answer | calls",
                    f"answer: %json {json.dumps(answer)}",
                    *_calls_rule(functions, parallel_tool_calls, token_texts),
                ]
            )
        )
    if answer is not None:
        return OutputConstraint(json_schema=json.dumps(answer))
    return None
