"""What every OpenAI-compatible route of the server shares: the error shape and Server-Sent Events.

Why a module of its own: the chat and completions routes (`server/chat_routes.py`) and the Responses
routes (`responses_routes.py`) answer failures the same way and stream the same way; one
place keeps them from drifting apart, and lets the Responses routes be registered by the chat
routes without the two importing each other.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from areal_graph.engines.inference.engine_errors import InvalidRequestError, QueueFullError
from areal_graph.engines.inference.server.native_requests import BadRequest
from areal_graph.engines.openai import chat_format as fmt
from areal_graph.engines.openai.chat_requests import OpenAIRequestError

log = logging.getLogger(__name__)

__all__ = [
    "STREAM_INTERVAL_S",
    "error_response",
    "openai_errors",
    "send_chunks",
    "prepare_events",
    "write_event",
    "content_chars",
    "PacedChoice",
]

# Streaming: a choice's text goes out as it is decoded, at most this often (the first at once),
# so a long answer costs tens of cumulative decodes a second, not one per token.
STREAM_INTERVAL_S = 0.05


def error_response(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def openai_errors(
    handler: Callable[..., Awaitable[web.StreamResponse]],
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Every failure of a /v1 handler as an OpenAI error body (the server's own middleware speaks SGLang's)."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: web.Request) -> web.StreamResponse:
        try:
            return await handler(self, request)
        except OpenAIRequestError as err:
            return web.json_response(err.body(), status=err.status)
        except (BadRequest, InvalidRequestError) as err:
            return error_response(400, str(err), "invalid_request_error")
        except QueueFullError as err:
            return error_response(503, f"server overloaded: {err}; retry later", "server_error", code="overloaded")
        except (asyncio.CancelledError, web.HTTPException):
            raise
        except Exception as err:  # one bad request must never take the server down
            log.exception("%s %s failed", request.method, request.path)
            return error_response(500, f"{type(err).__name__}: {err}", "server_error")

    return wrapped


async def send_chunks(request: web.Request, chunks: list[dict]) -> web.StreamResponse:
    """Chat-style Server-Sent Events: one `data:` line per chunk, then `data: [DONE]`."""
    response = await prepare_events(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def prepare_events(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def write_event(response: web.StreamResponse, event: dict[str, Any]) -> None:
    """One Responses-API Server-Sent Event as OpenAI sends them: `event: <type>` then `data: <json>`."""
    await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())


class PacedChoice:
    """One streamed choice as the engine's parts arrive: the tokens so far (`choice`), and the text
    to send, at most every `STREAM_INTERVAL_S` (the first piece at once, the last always)."""

    def __init__(self, tokenizer: Any, stop: list[str], index: int = 0, top_logprobs: bool = False) -> None:
        self.choice = fmt.GeneratedChoice(index, [], [], [], "", [] if top_logprobs else None)
        self.text = fmt.StreamedText(tokenizer, stop)
        self.last = 0.0  # when text last went out

    def add(self, part: Any) -> tuple[str, int, int] | None:
        """Take a part of `engine.stream`: (new text, first token, end token) to send now, or None
        while the last text went out less than `STREAM_INTERVAL_S` ago."""
        choice = self.choice
        choice.output_ids += part.output_ids
        choice.output_logprobs += part.output_logprobs
        choice.output_versions += part.output_versions
        if choice.top_logprobs is not None and part.output_top_logprobs:
            choice.top_logprobs += part.output_top_logprobs
        now = time.monotonic()
        if part.finish_reason:
            choice.finish_reason = part.finish_reason
            return self.text.final(choice.output_ids, part.finish_reason)
        if self.last and now - self.last < STREAM_INTERVAL_S:
            return None
        delta, a, b = self.text.delta(choice.output_ids)
        if delta:
            self.last = now
        return delta, a, b


def content_chars(content: Any) -> int:
    """Characters of a message's content: its text, or the JSON of anything else."""
    return len(content) if isinstance(content, str) else len(json.dumps(content)) if content else 0
