"""RecordingProxy: the recording client (`RecordingOpenAI`) behind a loopback HTTP endpoint.

Why: an environment that cannot run in the rollout worker's process (verifiers pins openai<3,
so it lives in its own virtualenv; an agent written in another language) still calls an
OpenAI-compatible server. This proxy is that server, inside the rollout worker's event loop:
`POST /ep/<key>/v1/chat/completions` (and `/v1/completions`, `/v1/responses`, `GET /v1/models`) is answered by
the `RecordingOpenAI` registered under `<key>`, one per episode, so the episode's calls are
generated with the policy and recorded token for token exactly as an in-process agent's are
(the continuation rule of openai_recording.py included). `/ep/untrained/v1/...` generates
with the policy without recording (a seat of a multi-agent environment that is not trained).

Only loopback, and every request must carry the proxy's own bearer token (`api_key`): another
local process cannot borrow the policy through it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import openai
from aiohttp import web

log = logging.getLogger(__name__)

UNTRAINED = "untrained"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status=status)


def _as_json(obj: Any) -> dict[str, Any]:
    """An openai type built with construct() (nested values may still be dicts) as plain JSON."""
    return json.loads(obj.model_dump_json(exclude_unset=True, warnings=False))


class RecordingProxy:
    """Per-episode recording clients, served over HTTP on 127.0.0.1 (an ephemeral port)."""

    def __init__(self, untrained_client: Callable[[], openai.AsyncOpenAI] | None = None) -> None:
        self.api_key = secrets.token_hex(16)
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._untrained = untrained_client
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, key: str) -> str:
        """The base_url an OpenAI client uses for episode `key`."""
        return f"{self.root}/ep/{key}/v1"

    def register(self, client: openai.AsyncOpenAI) -> str:
        """Serve `client` under a fresh key; returns the key."""
        key = secrets.token_hex(8)
        self._clients[key] = client
        return key

    def unregister(self, key: str) -> None:
        self._clients.pop(key, None)

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/ep/{key}/v1/chat/completions", self._chat)
        app.router.add_post("/ep/{key}/v1/completions", self._text)
        app.router.add_post("/ep/{key}/v1/responses", self._responses)
        app.router.add_get("/ep/{key}/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner
        log.info("recording proxy on %s", self.root)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ handlers
    def _client(self, request: web.Request) -> openai.AsyncOpenAI | web.Response:
        if request.headers.get("Authorization", "") != f"Bearer {self.api_key}":
            return _error(401, "the recording proxy needs its bearer token", "authentication_error")
        key = request.match_info["key"]
        if key == UNTRAINED and self._untrained is not None:
            return self._untrained()
        client = self._clients.get(key)
        if client is None:
            return _error(404, f"no episode {key!r} is running (it ended, or never started)")
        return client

    async def _call(self, request: web.Request, create: Callable[[openai.AsyncOpenAI], Any]) -> web.StreamResponse:
        client = self._client(request)
        if isinstance(client, web.Response):
            return client
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        try:
            result = await create(client)(**body)
        except openai.BadRequestError as err:
            return web.json_response(
                err.body
                if isinstance(err.body, dict) and "error" in err.body
                else {"error": {"message": err.message, "type": "invalid_request_error"}},
                status=400,
            )
        except TypeError as err:  # an argument create() does not take
            return _error(400, str(err))
        except (asyncio.CancelledError, web.HTTPException):
            raise
        except Exception as err:  # noqa: BLE001 - one bad request must not take the worker down
            log.exception("recording proxy: %s failed", request.path)
            return _error(500, f"{type(err).__name__}: {err}", "server_error")
        if not body.get("stream"):
            return web.json_response(_as_json(result))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        async for chunk in result:
            data = _as_json(chunk)
            named = f"event: {data['type']}\n" if request.path.endswith("/responses") else ""  # Responses' events
            await response.write(f"{named}data: {json.dumps(data)}\n\n".encode())
        if not request.path.endswith("/responses"):  # chat and completions end with [DONE]; Responses do not
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, lambda c: c.chat.completions.create)

    async def _text(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, lambda c: c.completions.create)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, lambda c: c.responses.create)

    async def _models(self, request: web.Request) -> web.Response:
        client = self._client(request)
        if isinstance(client, web.Response):
            return client
        name = getattr(client, "model_name", "policy")
        return web.json_response(
            {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "areal-graph"}]}
        )
