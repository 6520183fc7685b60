"""The Responses API on the inference server: POST /v1/responses, GET/DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

Why: the OpenAI Agents SDK's default model, LangChain's `use_responses_api=True` and
`client.responses.create` speak this API, not chat completions; vLLM and SGLang serve it. A
request is generated as a chat turn over the same engine (`responses_requests.py` says why),
with the chat routes' rules: the chat template, tools as `<tool_call>` blocks, constrained
decoding for a forced tool or `text.format`, the engine's behaviour log-probs, a prompt too
long for the context refused before it is tokenized, work off the event loop, OpenAI's error
shape.

- `store` (default true) keeps the response in memory (`ResponseStore`, bounded) so
  `previous_response_id` continues it and it can be retrieved, listed or deleted; a server
  restart forgets, and a continuation of a forgotten response is a 400 naming it.
- `stream: true` sends OpenAI's events (`responses_format.py`) as `event:`/`data:` lines: the
  text as the engine decodes it (as for chat: the first piece at once, then at most every 50 ms),
  or, when tools may be called, once the turn is whole (calls are parsed from all of it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from areal_graph.engines.inference.server.openai_http import (
    PacedChoice,
    content_chars,
    openai_errors,
    prepare_events,
    write_event,
)
from areal_graph.engines.inference.server.served_model import ServedModel
from areal_graph.engines.openai import chat_format as fmt
from areal_graph.engines.openai import responses_format as rfmt
from areal_graph.engines.openai.chat_requests import OpenAIRequestError
from areal_graph.engines.openai.responses_requests import ResponsesRequest, parse_responses_request
from areal_graph.engines.openai.responses_store import ResponseStore, StoredResponse

log = logging.getLogger(__name__)

RESPONSES_ROUTES = ("/v1/responses", "/v1/responses/{id}", "/v1/responses/{id}/input_items")


class ResponsesRoutes:
    """The /v1/responses handlers over one server's `ServedModel` (shared with the chat routes,
    whose route table, `OpenAIRoutes.table`, mounts them)."""

    def __init__(self, server: Any, served: ServedModel, store: ResponseStore | None = None) -> None:
        self.server, self.served = server, served
        self.store = store or ResponseStore()

    @openai_errors
    async def create(self, request: web.Request) -> web.StreamResponse:
        req = parse_responses_request(await self.server._json(request))
        tokenizer = self.served.tokenizer()
        history = self.store.history(req.previous_response_id)
        req.chat.messages = req.conversation(history)
        self.served.check_chars(sum(content_chars(m.get("content")) for m in req.chat.messages), "input")
        text = await asyncio.to_thread(fmt.render_chat_prompt, tokenizer, req.chat.messages, req.chat.tools)
        prompt_ids = await self.served.encode(text, "input")
        params = await self.served.constrained(req.chat, self.served.sampling(req.chat, len(prompt_ids), "input"))
        rid = rfmt.new_id("resp")
        top_n = req.chat.top_logprobs if req.include_logprobs else None
        if req.stream and not req.chat.parse_tools:
            return await self._stream(request, req, prompt_ids, params, rid, history, top_n)
        [choice] = await self.served.generate(prompt_ids, params, 1, top_n or 0, rid)
        response = self._finish(req, rid, choice, prompt_ids, history)
        if not req.stream:
            return web.json_response(response)
        out = await prepare_events(request)
        for event in rfmt.whole_response_events(tokenizer, choice, response, top_n):
            await write_event(out, event)
        await out.write_eof()
        return out

    def _finish(
        self,
        req: ResponsesRequest,
        rid: str,
        choice: fmt.GeneratedChoice,
        prompt_ids: list[int],
        history: list[dict[str, Any]],
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """The response object for a generated turn; stored when asked."""
        cj = fmt.chat_choice_json(self.served.tokenizer(), choice, req.chat)
        response = rfmt.turn_response(
            rid, req, cj, choice.finish_reason, len(prompt_ids), len(choice.output_ids), message_id
        )
        self.store.remember(req, history, response)
        return response

    async def _stream(
        self,
        request: web.Request,
        req: ResponsesRequest,
        prompt_ids: list[int],
        params: Any,
        rid: str,
        history: list[dict[str, Any]],
        top_n: int | None,
    ) -> web.StreamResponse:
        """A text turn's events as the engine decodes it. Nothing is sent before the engine has
        taken the request, so a refusal is still an HTTP error; a client that goes away closes the
        engine's stream, which aborts the request."""
        tokenizer = self.served.tokenizer()
        parts = self.server.engine.stream(prompt_ids, params, rid=f"{rid}-0", top_logprobs=top_n or 0)
        paced = PacedChoice(tokenizer, req.chat.stop, 0, bool(top_n))
        acc = paced.choice
        events, message_id = rfmt.ResponseEvents(), rfmt.new_id("msg")
        out: web.StreamResponse | None = None
        try:
            async for part in parts:
                step = paced.add(part)
                if out is None:
                    out = await prepare_events(request)
                    begun = rfmt.response_json(rid, time.time(), req.chat.model, req, [], len(prompt_ids), 0)
                    for event in events.start(begun) + events.message_start(message_id, 0):
                        await write_event(out, event)
                if step is not None and step[0]:
                    delta, a, b = step
                    lp = fmt.token_logprobs(tokenizer, acc, a, b, top_n) if top_n is not None else None
                    await write_event(out, events.text_delta(message_id, 0, delta, lp))
        except (OpenAIRequestError, ConnectionResetError):
            raise  # a refusal, or the client went away (cancellation is not an Exception either)
        except Exception as err:
            if out is None:
                raise  # nothing sent yet: an HTTP error
            log.error("a streamed response failed", exc_info=err)
            await write_event(out, events.error(f"{type(err).__name__}: {err}"))
            await out.write_eof()
            return out
        finally:
            await parts.aclose()
        assert out is not None  # the engine's stream always yields its last part
        response = self._finish(req, rid, acc, prompt_ids, history, message_id)
        for event in events.message_done(response["output"][0], 0) + [events.end(response)]:
            await write_event(out, event)
        await out.write_eof()
        return out

    # ------------------------------------------------------------------ stored responses
    def _stored(self, request: web.Request) -> StoredResponse:
        rid = request.match_info["id"]
        stored = self.store.get(rid)
        if stored is None:
            raise OpenAIRequestError(
                f"no stored response {rid!r} (not created with store, by another server or "
                "before this one started, or dropped)",
                "response_id",
                status=404,
                code="not_found",
            )
        return stored

    @openai_errors
    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self._stored(request).response)

    @openai_errors
    async def delete(self, request: web.Request) -> web.Response:
        rid = self._stored(request).response["id"]
        self.store.delete(rid)
        return web.json_response({"id": rid, "object": "response", "deleted": True})

    @openai_errors
    async def input_items(self, request: web.Request) -> web.Response:
        """The response's own input items (`order` asc|desc, default desc; `limit` 1-100, default 20)."""
        items = list(self._stored(request).input_items)
        order = request.query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise OpenAIRequestError(f"'order' must be 'asc' or 'desc', got {order!r}", "order")
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise OpenAIRequestError("'limit' must be an integer in [1, 100]", "limit")
        if order == "desc":
            items.reverse()
        page = items[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": page,
                "has_more": len(items) > limit,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
            }
        )
