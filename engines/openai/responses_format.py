"""Pure conversions from a generated chat turn to the Responses API's objects and stream events.

A turn is generated as a chat completion (`responses_requests.py` says why); here its message
becomes Responses output items: the text as one `message` item with one `output_text` part
(with the tokens' log-probs when `include` asks for them), each tool call as a
`function_call` item whose `call_id` is the chat tool call's id. A turn cut by
`max_output_tokens` is `status: "incomplete"` with `incomplete_details.reason
"max_output_tokens"`, as on OpenAI's API.

Streaming follows OpenAI's event order, every event numbered by `sequence_number`:
`response.created`, `response.in_progress`, per item `response.output_item.added`, (text:
`response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`; a call: `response.function_call_arguments.delta` and `.done`),
`response.output_item.done`, and last `response.completed` (or `response.incomplete`) with the
whole response, which is what the Agents SDK reads.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from areal_graph.engines.openai import chat_format as fmt
from areal_graph.engines.openai.responses_requests import ResponsesRequest

__all__ = [
    "turn_response",
    "output_items",
    "response_json",
    "ResponseEvents",
    "whole_response_events",
    "assistant_message",
]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(message: dict[str, Any], finish: str, logprobs: list[dict] | None) -> list[dict[str, Any]]:
    """A chat turn's message {content, tool_calls} as Responses output items."""
    status = "incomplete" if finish == "length" else "completed"
    items: list[dict[str, Any]] = []
    text = message.get("content") or ""
    if text or not message.get("tool_calls"):
        items.append(message_item(new_id("msg"), text, logprobs, status))
    for call in message.get("tool_calls") or []:
        items.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": _arguments_text(call["function"]["arguments"]),
                "status": status,
            }
        )
    return items


_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def with_item_ids(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as stored: each with an id (its own, or a new one), as OpenAI lists them."""
    return [
        item if item.get("id") else {"id": new_id(_ITEM_PREFIX.get(item.get("type", ""), "item")), **item}
        for item in items
    ]


def message_item(item_id: str, text: str, logprobs: list[dict] | None, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}],
    }


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def assistant_message(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Output items back as the chat assistant message they came from (for the stored history)."""
    text = "".join(
        part.get("text", "") for item in items if item.get("type") == "message" for part in item.get("content", [])
    )
    calls = [
        {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in items
        if item.get("type") == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def response_json(
    response_id: str,
    created: float,
    model: str,
    request: ResponsesRequest,
    output: list[dict[str, Any]],
    prompt_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """The `response` object (status from the items: any incomplete item makes it incomplete)."""
    incomplete = any(item.get("status") == "incomplete" for item in output)
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "completed_at": created,
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": request.instructions,
        "metadata": request.metadata or {},
        "model": model,
        "output": output,
        "parallel_tool_calls": request.chat.parallel_tool_calls,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_logprobs": request.chat.top_logprobs,
        "tool_choice": request.tool_choice,
        "tools": request.tools,
        "text": {"format": request.text_format},
        "truncation": "disabled",
        "max_output_tokens": request.max_output_tokens,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": request.store,
        "background": False,
        "user": request.user,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        },
    }


def turn_response(
    response_id: str,
    request: ResponsesRequest,
    choice_json: dict[str, Any],
    finish: str,
    prompt_tokens: int,
    output_tokens: int,
    message_id: str | None = None,
) -> dict[str, Any]:
    """The response object of a turn generated as a chat completion (`choice_json`: its chat
    choice). `message_id`: the id a stream's events already gave the message item."""
    logprobs = choice_json["logprobs"]["content"] if choice_json["logprobs"] else None
    items = output_items(choice_json["message"], finish, logprobs)
    if message_id is not None and items and items[0]["type"] == "message":
        items[0]["id"] = message_id
    return response_json(response_id, time.time(), request.chat.model, request, items, prompt_tokens, output_tokens)


class ResponseEvents:
    """The stream events of one response, numbered in the order they are made."""

    def __init__(self) -> None:
        self.sequence = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """`response.created` and `response.in_progress` with the response as it begins (no output)."""
        begun = {
            **copy.deepcopy(response),
            "status": "in_progress",
            "output": [],
            "usage": None,
            "incomplete_details": None,
            "completed_at": None,
        }
        return [self._event("response.created", response=begun), self._event("response.in_progress", response=begun)]

    def message_start(self, item_id: str, index: int) -> list[dict[str, Any]]:
        started = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.output_item.added", output_index=index, item=started),
            self._event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part),
        ]

    def text_delta(self, item_id: str, index: int, delta: str, logprobs: list[dict] | None) -> dict[str, Any]:
        return self._event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=index,
            content_index=0,
            delta=delta,
            logprobs=logprobs or [],
        )

    def message_done(self, item: dict[str, Any], index: int) -> list[dict[str, Any]]:
        part = item["content"][0]
        return [
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=part["logprobs"],
            ),
            self._event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def function_call(self, item: dict[str, Any], index: int) -> list[dict[str, Any]]:
        started = {**item, "arguments": "", "status": "in_progress"}
        return [
            self._event("response.output_item.added", output_index=index, item=started),
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            ),
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def error(self, message: str) -> dict[str, Any]:
        """A failure after the stream began (OpenAI's `error` event)."""
        return self._event("error", code="server_error", message=message, param=None)

    def end(self, response: dict[str, Any]) -> dict[str, Any]:
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return self._event(kind, response=response)


def whole_response_events(
    tokenizer: Any, choice: fmt.GeneratedChoice, response: dict[str, Any], top_logprobs: int | None
) -> list[dict[str, Any]]:
    """The events of a response generated whole (a turn with tools: calls are parsed from all of
    it). The text goes out in pieces that end on clean characters, each with its tokens'
    log-probs when asked (`top_logprobs` None: not asked)."""
    events = ResponseEvents()
    out = events.start(response)
    for index, item in enumerate(response["output"]):
        if item["type"] == "function_call":
            out += events.function_call(item, index)
            continue
        out += events.message_start(item["id"], index)
        text = item["content"][0]["text"]
        only_text = len(response["output"]) == 1
        pieces = fmt.text_deltas(tokenizer, choice.output_ids, text) if only_text else [(text, 0, 0)]
        for piece, a, b in pieces:
            if piece:
                lp = fmt.token_logprobs(tokenizer, choice, a, b, top_logprobs) if top_logprobs is not None else None
                out.append(events.text_delta(item["id"], index, piece, lp))
        out += events.message_done(item, index)
    out.append(events.end(response))
    return out
