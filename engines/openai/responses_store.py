"""Stored responses (`store: true`), so `previous_response_id` continues a conversation.

Why in memory and bounded: a server answers `previous_response_id` "within its lifetime" (the
Agents SDK's `previous_response_id` mode, `client.responses.retrieve`); a restart forgets, and
the client is told so by name, never given a shorter conversation. Each stored response keeps
its whole conversation (instructions excluded, as OpenAI does not carry them over), so a chain
never depends on an older entry still being there; the least recently used are dropped past
`max_responses` or `max_chars` of text, which bounds memory whatever clients send.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from areal_graph.engines.openai import responses_format as rfmt
from areal_graph.engines.openai.chat_requests import OpenAIRequestError
from areal_graph.engines.openai.responses_requests import ResponsesRequest

__all__ = ["StoredResponse", "ResponseStore"]


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object as returned
    messages: list[dict[str, Any]]  # the conversation it answered: history + its input (no instructions)
    answer: dict[str, Any]  # its output as the chat assistant message
    input_items: list[dict[str, Any]]  # its own input, as items

    def size(self) -> int:
        return len(json.dumps([self.messages, self.answer, self.input_items, self.response["output"]], default=str))


class ResponseStore:
    """The last responses created with `store: true`, least recently used dropped first."""

    def __init__(self, max_responses: int = 1000, max_chars: int = 64 * 1024 * 1024) -> None:
        self.max_responses, self.max_chars = max_responses, max_chars
        self._entries: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._chars = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, stored: StoredResponse) -> None:
        rid = stored.response["id"]
        self.delete(rid)
        size = stored.size()
        self._entries[rid] = (stored, size)
        self._chars += size
        while len(self._entries) > 1 and (len(self._entries) > self.max_responses or self._chars > self.max_chars):
            _, (_, dropped) = self._entries.popitem(last=False)
            self._chars -= dropped
            self.evicted += 1

    def remember(self, request: ResponsesRequest, history: list[dict[str, Any]], response: dict[str, Any]) -> None:
        """Keep a created response, if its request asked to (`store`, default true)."""
        if request.store:
            self.put(
                StoredResponse(
                    response,
                    [*history, *request.input_messages],
                    rfmt.assistant_message(response["output"]),
                    rfmt.with_item_ids(request.input_items),
                )
            )

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)
        return entry[0]

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._chars -= entry[1]
        return entry is not None

    def history(self, previous_response_id: str | None) -> list[dict[str, Any]]:
        """The conversation a new turn continues: the stored one's messages and its answer."""
        if previous_response_id is None:
            return []
        stored = self.get(previous_response_id)
        if stored is None:
            raise OpenAIRequestError(
                f"previous response {previous_response_id!r} was not found: it was created with store: false, "
                f"by another server, before this server started, or was dropped (this server keeps the last "
                f"{self.max_responses} stored responses)",
                "previous_response_id",
                status=400,
                code="previous_response_not_found",
            )
        return [*stored.messages, stored.answer]
