"""OpenAI Responses API request bodies (`/v1/responses`) checked and turned into a chat conversation.

Why a chat conversation: the served models are chat models with one chat template, and the
chat path already owns everything that decides the tokens (templates, tools as Hermes-style
`<tool_call>` blocks, constrained decoding, sampling, the recording client's continuation rule
that keeps an agent's tokens exact across turns). A Responses request is the same thing said
differently: `instructions` is a system message, `input` items are messages, a `function_call`
item is an assistant tool call, a `function_call_output` item is a tool message, and
`previous_response_id` is the stored conversation so far. vLLM and SGLang serve the Responses
API the same way, over their chat machinery.

Everything here is pure (no aiohttp, no torch, no `openai`); the server's routes
(`responses_routes.py`) and the recording client (`workflows/rollout/openai_responses.py`)
share it, so an agent is refused for the same reasons by both. What is honoured, ignored and
refused is listed in `docs/openai_parameters.md`; errors name the Responses field
(`input[2].content`, `max_output_tokens`, `text.format`), never the chat field it maps to.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from areal_graph.engines.openai.chat_requests import MAX_TOP_LOGPROBS, ChatRequest, parse_chat_request
from areal_graph.engines.openai.fields import (
    OpenAIRequestError,
    as_object,
    bool_field,
    function_tools,
    is_int,
    optional_int,
    parts_text,
    refuse_unknown,
    response_format,
)

log = logging.getLogger(__name__)

__all__ = ["ResponsesRequest", "parse_responses_request", "RESPONSES_FIELDS"]

# Sampling extensions as on /v1/chat/completions (vLLM and SGLang take them on /v1/responses too).
_EXTENSIONS = {"top_k", "seed", "stop", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos"}
RESPONSES_FIELDS = {
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "store",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "temperature",
    "top_p",
    "max_output_tokens",
    "top_logprobs",
    "include",
    "metadata",
    "user",
    "truncation",
    "reasoning",
    "max_tool_calls",
    "background",
    "conversation",
    "prompt",
    "context_management",
} | _EXTENSIONS
# Hints of OpenAI's service that cannot change what this server generates: accepted, ignored, noted once.
_IGNORED = {
    "service_tier": "one tier",
    "prompt_cache_key": "prefix caching needs no key here",
    "prompt_cache_retention": "prefix caching needs no settings here",
    "prompt_cache_options": "prefix caching needs no settings here",
    "safety_identifier": "no abuse tracking",
}
# Fields accepted only at the value that changes nothing here, with why any other is refused.
_NEUTRAL_ONLY = {
    "background": (False, "background responses are not built yet: ask without 'background'"),
    "conversation": (
        None,
        "the Conversations API is not built yet: send the history as 'input' or use 'previous_response_id'",
    ),
    "prompt": (None, "stored prompt templates are OpenAI's; send 'instructions' and 'input'"),
    "context_management": (None, "server-side compaction is not built yet"),
}
# `include` values: the logprobs are honoured; the others name content of tools or reasoning this
# server never produces, so there is nothing to include.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
_INCLUDABLE = {
    INCLUDE_LOGPROBS,
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
}
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_noted: set[str] = set()


@dataclass
class ResponsesRequest:
    """A /v1/responses request: the chat request it is generated as, and what the response echoes."""

    chat: ChatRequest  # messages: this request's own input only (no instructions, no history)
    input_messages: list[dict[str, Any]]
    input_items: list[dict[str, Any]]  # the input as items (a string input is one user message item)
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    include_logprobs: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)  # as given (Responses' flat function tools)
    tool_choice: Any = "auto"  # as given
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None

    @property
    def stream(self) -> bool:
        return self.chat.stream

    def conversation(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chat messages to generate from: instructions, the stored history, this input.
        (A previous response's instructions are not carried over, as on OpenAI's API.)"""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return system + list(history) + list(self.input_messages)


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Check a /v1/responses body; raise OpenAIRequestError naming the Responses field at fault."""
    if not isinstance(body, dict):
        raise OpenAIRequestError("the request body must be a JSON object")
    body = _drop_ignored(dict(body))
    refuse_unknown(body, RESPONSES_FIELDS, "/v1/responses")
    for key, (neutral, why) in _NEUTRAL_ONLY.items():
        if body.get(key) not in (None, neutral):
            raise OpenAIRequestError(f"'{key}' is not supported by this server: {why}", key)
    _check_reasoning(body.get("reasoning"))
    if body.get("truncation") not in (None, "disabled"):
        raise OpenAIRequestError(
            f"'truncation' {body['truncation']!r} is not built yet: only 'disabled' (a "
            "conversation longer than the context is refused with context_length_exceeded)",
            "truncation",
        )
    optional_int(body, "max_tool_calls", 1, None)  # built-in tools only: this server has none
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise OpenAIRequestError("'instructions' must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise OpenAIRequestError("'previous_response_id' must be a response id (a string)", "previous_response_id")
    items = input_items(body.get("input"), allow_empty=previous is not None)
    messages = items_to_messages(items)
    include = _include(body.get("include"))
    tools = function_tools(body.get("tools"), flat=True)
    top_logprobs = body.get("top_logprobs")
    chat_body: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages or [{"role": "user", "content": ""}],
        "tools": [
            {
                "type": "function",
                "function": {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t},
            }
            for t in tools
        ]
        or None,
        "tool_choice": _tool_choice(body.get("tool_choice")),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _text_format(body.get("text")),
        "max_completion_tokens": optional_int(body, "max_output_tokens", 1, None),
        "logprobs": INCLUDE_LOGPROBS in include or None,
        "top_logprobs": top_logprobs if top_logprobs else None,
        "stream": body.get("stream"),
        "metadata": body.get("metadata"),
        "user": body.get("user"),
        **{k: body.get(k) for k in ("temperature", "top_p", *_EXTENSIONS)},
    }
    if top_logprobs is not None and (not is_int(top_logprobs) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS):
        raise OpenAIRequestError(
            f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs!r}", "top_logprobs"
        )
    if top_logprobs:
        chat_body["logprobs"] = True  # asking for alternatives asks for the log-probs (OpenAI's rule)
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        raise OpenAIRequestError("'stream_options' must be an object", "stream_options")
    try:
        chat = parse_chat_request({k: v for k, v in chat_body.items() if v is not None})
    except OpenAIRequestError as err:
        raise _renamed(err) from None
    messages = chat.messages if messages else []  # normalized as chat's (developer -> system, ...)
    chat.messages = messages  # the input alone; the caller adds instructions and history (conversation())
    store = bool_field(body, "store", True)
    text = body.get("text") or {}
    return ResponsesRequest(
        chat=chat,
        input_messages=messages,
        input_items=items,
        instructions=instructions or None,
        previous_response_id=previous,
        store=store,
        include_logprobs=INCLUDE_LOGPROBS in include or bool(top_logprobs),
        tools=tools,
        tool_choice=body.get("tool_choice") or "auto",
        text_format=text.get("format") or {"type": "text"},
        max_output_tokens=chat.max_tokens,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        metadata=body.get("metadata"),
        user=body.get("user"),
    )


# --------------------------------------------------------------------------- fields
def _drop_ignored(body: dict) -> dict:
    for key in [k for k in body if k in _IGNORED]:
        if key not in _noted:
            _noted.add(key)
            log.warning("Responses field %r accepted and ignored (noted once): %s", key, _IGNORED[key])
        del body[key]
    return body


def _check_reasoning(reasoning: Any) -> None:
    """The served models do not reason: effort "none" (the Agents SDK's default for its default
    model) or nothing is accepted; asking for reasoning is refused rather than silently skipped."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise OpenAIRequestError("'reasoning' must be an object", "reasoning")
    effort = reasoning.get("effort")
    if effort not in (None, "none"):
        raise OpenAIRequestError(
            f"'reasoning.effort' {effort!r}: the served model does not reason; use 'none' "
            "or leave 'reasoning' out (Agents SDK: ModelSettings(reasoning=None))",
            "reasoning.effort",
        )
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) is not None:
            raise OpenAIRequestError(
                f"'reasoning.{key}': the served model does not reason, so there is no summary to give",
                f"reasoning.{key}",
            )


def _include(include: Any) -> set[str]:
    if include is None:
        return set()
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise OpenAIRequestError("'include' must be a list of strings", "include")
    unknown = sorted(set(include) - _INCLUDABLE)
    if unknown:
        raise OpenAIRequestError(
            f"'include' value(s) {unknown} are not known; this server takes {sorted(_INCLUDABLE)}", "include"
        )
    return set(include)


def _tool_choice(choice: Any) -> Any:
    """Responses' tool_choice in chat's shape: "auto" | "none" | "required" | {"type": "function", "name"}."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise OpenAIRequestError(
        f"'tool_choice' must be 'auto', 'none', 'required' or {{\"type\": \"function\", "
        f'"name": ...}} (hosted tools and allowed_tools are not supported), got {choice!r:.120}',
        "tool_choice",
    )


def _text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as chat's response_format; `text.verbosity` is a hint this server does not take."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise OpenAIRequestError("'text' must be an object", "text")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise OpenAIRequestError(
            f"text.{unknown[0]} is not supported (text takes format and verbosity)", f"text.{unknown[0]}"
        )
    return response_format(text.get("format"), "text.format", flat=True)


_RENAMED = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def _renamed(err: OpenAIRequestError) -> OpenAIRequestError:
    """A chat parser's error, naming the Responses field it came from."""
    param = err.param or ""
    for chat_name, ours in _RENAMED.items():
        if param == chat_name or param.startswith(chat_name + ".") or param.startswith(chat_name + "["):
            param = ours + param[len(chat_name) :]
            return OpenAIRequestError(
                err.message.replace(f"'{chat_name}'", f"'{ours}'"), param, err.status, err.kind, err.code
            )
    return err


# --------------------------------------------------------------------------- input items
def input_items(value: Any, allow_empty: bool = False) -> list[dict[str, Any]]:
    """`input` as a list of item dicts (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if value is None and allow_empty:
        return []
    if not isinstance(value, list) or (not value and not allow_empty):
        raise OpenAIRequestError("'input' must be a string or a non-empty list of input items", "input")
    out = []
    for k, item in enumerate(value):
        item = as_object(item, f"input[{k}]")
        if "type" not in item and "role" in item:  # an "easy" message: the type is implied
            item = {"type": "message", **item}
        out.append(item)
    return out


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items -> chat messages. Consecutive assistant output (a message and its function calls)
    is one assistant turn, as the model wrote it; reasoning items carry nothing here (the served
    models write none) and are skipped."""
    messages: list[dict[str, Any]] = []
    for k, item in enumerate(items):
        where = f"input[{k}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise OpenAIRequestError(
                    f"{where}.role must be one of {list(_MESSAGE_ROLES)}, got {role!r}", f"{where}.role"
                )
            text = item_text(item.get("content"), f"{where}.content")
            if role == "assistant" and _open_assistant_turn(messages) and not messages[-1].get("tool_calls"):
                messages[-1]["content"] = (messages[-1]["content"] or "") + text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise OpenAIRequestError(
                    f"{where} (function_call) needs 'call_id', 'name' and 'arguments' (a JSON string)", where
                )
            if not _open_assistant_turn(messages):
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise OpenAIRequestError(f"{where} (function_call_output) needs 'call_id'", f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else item_text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise OpenAIRequestError(
                f"{where}: item references are not built yet; send the item itself or use 'previous_response_id'", where
            )
        else:
            raise OpenAIRequestError(
                f"{where}: input items of type {kind!r} are not supported (this server takes "
                "message, function_call, function_call_output and reasoning items)",
                where,
            )
    return messages


def _open_assistant_turn(messages: list[dict[str, Any]]) -> bool:
    return bool(messages) and messages[-1]["role"] == "assistant"


def item_text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (input_text, output_text, refusal)."""
    if isinstance(content, str):
        return content
    return parts_text(content, where, _TEXT_PARTS, _MEDIA_PARTS, '{"type": "input_text", "text": ...}')
