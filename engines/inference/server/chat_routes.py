"""OpenAI-compatible routes on the inference server: /v1/chat/completions, /v1/completions, /v1/models
(and /v1/responses: `responses_routes.py`).

Why: agents, evaluation harnesses and chat UIs speak OpenAI's API; with these routes any of
them (the official `openai` package included) can use a model being trained, against the
same engine that serves the RL rollouts, without a second server. The token-id `/generate`
stays the contract for training; these routes are a view of the same engine.

What they answer (parameters: `engines/openai/chat_requests.py`; conversions: `engines/openai/chat_format.py`):
- messages go through the model's chat template; `n` choices are `n` engine requests
  (prefilled once: the engine shares identical prompts), choice i seeded `seed + i`;
- temperature 0 is greedy; the log-probs are the engine's behaviour log-probs (the same
  numbers /generate returns for the same prompt, seed and weights), `top_logprobs` under the
  same distribution;
- `stream: true` sends Server-Sent Events (`data: {chunk}` ... `data: [DONE]`) as the engine
  decodes: the first text goes out with the first tokens, then every `STREAM_INTERVAL_S`;
  text that may still change (half a character, the start of a stop string) waits. A chat
  whose tool calls are parsed streams once the answer is whole (calls are parsed from all of
  it). A client that disconnects aborts its requests;
- each engine request is traced by the engine itself (request spans), as /generate's are;
- nothing heavy runs on the event loop: templates, tokenization and prompt scoring run in
  threads, and a prompt longer than `max_prompt_chars` characters (default 32 per token of
  context, `--max-prompt-chars`) is refused before it is tokenized, so one huge prompt cannot
  stall /health and every other request while its 400 is worked out;
- errors are OpenAI's shape `{"error": {message, type, param, code}}`: 400 for what is not
  supported (named), 503 when the queue is full, 500 for a bug. Authentication is the
  server's (`Authorization: Bearer KEY`, which is what an OpenAI client sends as `api_key`).

`register_openai_routes(server)` adds them to an `InferenceHTTPServer`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from areal_graph.engines.inference.server.openai_http import (
    PacedChoice,
    content_chars,
    error_response,
    openai_errors,
    send_chunks,
)
from areal_graph.engines.inference.server.responses_routes import ResponsesRoutes
from areal_graph.engines.inference.server.served_model import ServedModel
from areal_graph.engines.openai import chat_format as fmt
from areal_graph.engines.openai.chat_requests import (
    OpenAIRequestError,
    parse_chat_request,
    parse_completion_request,
)

log = logging.getLogger(__name__)

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses")


class OpenAIRoutes:
    """The /v1 chat, completions and models handlers over one server's `ServedModel`."""

    def __init__(self, server: Any, served: ServedModel | None = None) -> None:
        self.server = server
        self.served = served or ServedModel(server)
        self.created = int(time.time())
        self.responses = ResponsesRoutes(server, self.served)  # /v1/responses: responses_routes.py

    @property
    def model_id(self) -> str:
        return self.served.model_id

    # ------------------------------------------------------------------ handlers
    @openai_errors
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        chat = parse_chat_request(await self.server._json(request))
        tokenizer = self.served.tokenizer()
        self.served.check_chars(sum(content_chars(m.get("content")) for m in chat.messages), "messages")
        text = await asyncio.to_thread(fmt.render_chat_prompt, tokenizer, chat.messages, chat.tools)
        prompt_ids = await self.served.encode(text, "messages")
        params = await self.served.constrained(chat, self.served.sampling(chat, len(prompt_ids), "messages"))
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        if chat.stream and not chat.parse_tools:  # tool calls are parsed from the whole answer
            return await self._stream(request, [prompt_ids], [params], chat, cid, chat=True)
        choices = await self.served.generate(prompt_ids, params, chat.n, chat.top_logprobs if chat.logprobs else 0, cid)
        created = int(time.time())
        out_tokens = sum(len(c.output_ids) for c in choices)
        if chat.stream:
            chunks = fmt.chat_chunks(tokenizer, cid, created, chat.model, choices, chat, len(prompt_ids))
            return await send_chunks(request, chunks)
        body = fmt.chat_completion_json(
            cid,
            created,
            chat.model,
            [fmt.chat_choice_json(tokenizer, c, chat) for c in choices],
            prompt_ids,
            out_tokens,
            chat.return_token_ids,
        )
        return web.json_response(body)

    @openai_errors
    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_completion_request(await self.server._json(request))
        tokenizer = self.served.tokenizer()
        cid = f"cmpl-{uuid.uuid4().hex}"
        prompts = [p if isinstance(p, list) else await self.served.encode(p, "prompt") for p in req.prompts]
        if any(not p for p in prompts):
            raise OpenAIRequestError("a prompt encodes to no tokens", "prompt")
        params = [self.served.sampling(req, len(p), "prompt") for p in prompts]
        if req.stream:
            return await self._stream(request, prompts, params, req, cid, chat=False)
        groups = await asyncio.gather(
            *(
                self.served.generate(p, sp, req.n, req.logprobs or 0, cid, first_index=k * req.n)
                for k, (p, sp) in enumerate(zip(prompts, params))
            )
        )
        choices = [c for group in groups for c in group]
        created, prompt_tokens = int(time.time()), sum(len(p) for p in prompts)
        out_tokens = sum(len(c.output_ids) for c in choices)
        if req.stream:
            return await send_chunks(
                request, fmt.completion_chunks(tokenizer, cid, created, req.model, choices, req, prompt_tokens)
            )
        echoed: list[fmt.PromptScores | None] = [None] * len(prompts)
        if req.echo:  # a scoring forward per prompt, off the event loop (engine.score_prompt)
            top_n = req.logprobs or 0
            scores = (
                await asyncio.gather(*(asyncio.to_thread(self.server.engine.score_prompt, p, top_n) for p in prompts))
                if req.logprobs is not None
                else [(None, None)] * len(prompts)
            )
            echoed = [fmt.PromptScores(p, lps, top) for p, (lps, top) in zip(prompts, scores)]
        body = fmt.completion_json(
            cid,
            created,
            req.model,
            [fmt.completion_choice_json(tokenizer, c, req, echoed[c.index // req.n]) for c in choices],
            prompt_tokens,
            out_tokens,
        )
        if req.return_token_ids:
            body["prompt_token_ids"] = prompts if len(prompts) > 1 else prompts[0]
        return web.json_response(body)

    # ------------------------------------------------------------------ streaming
    async def _stream(
        self, request: web.Request, prompts: list[list[int]], params: list[Any], req: Any, cid: str, chat: bool
    ) -> web.StreamResponse:
        """Server-Sent Events as the engine decodes (`EmbeddedEngine.stream`): every choice of
        every prompt is pumped by a task of its own into one queue the response drains. A client
        that goes away ends the response; the pumps are cancelled and abort their requests."""
        created, model = int(time.time()), req.model
        top_n = (req.top_logprobs if req.logprobs else 0) if chat else (req.logprobs or 0)
        queue: asyncio.Queue = asyncio.Queue()
        pumps = []
        for k, (prompt, sp) in enumerate(zip(prompts, params)):
            for i in range(req.n):
                choice_sp = sp if sp.seed is None else dataclasses.replace(sp, seed=sp.seed + i)
                pumps.append(
                    asyncio.create_task(
                        self._pump(queue, prompt, choice_sp, req, cid, created, model, k * req.n + i, top_n, chat)
                    )
                )
        response: web.StreamResponse | None = None
        out_tokens, running = 0, len(pumps)
        try:
            while running:
                item = await queue.get()
                if isinstance(item, int):  # a pump is done: its token count
                    out_tokens, running = out_tokens + item, running - 1
                    continue
                if isinstance(item, BaseException) and response is None:
                    raise item  # nothing sent yet: an HTTP error (400 for a request the engine refuses, 503 ...)
                if response is None:  # headers go out with the first chunk
                    response = web.StreamResponse(
                        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                    )
                    await response.prepare(request)
                if isinstance(item, BaseException):  # the headers are out: the error is an event
                    log.error("a streamed choice failed", exc_info=item)
                    error = {
                        "message": f"{type(item).__name__}: {item}",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                    await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
                    break
                await response.write(f"data: {json.dumps(item)}\n\n".encode())
            else:
                if req.include_usage:
                    kind = "chat.completion.chunk" if chat else "text_completion"
                    counts = fmt.usage_json(sum(len(p) for p in prompts), out_tokens)
                    usage = fmt.usage_chunk(cid, kind, created, model, counts)
                    await response.write(f"data: {json.dumps(usage)}\n\n".encode())  # type: ignore[union-attr]
            assert response is not None  # every pump sends a finish chunk before its count
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        finally:
            for t in pumps:
                t.cancel()
        return response

    async def _pump(
        self,
        queue: asyncio.Queue,
        prompt: list[int],
        params: Any,
        req: Any,
        cid: str,
        created: int,
        model: str,
        index: int,
        top_n: int,
        chat: bool,
    ) -> None:
        """One choice: chunks into `queue` as its tokens arrive (at most every `STREAM_INTERVAL_S`,
        the first at once), then its finish chunk and its token count."""
        paced = PacedChoice(self.served.tokenizer(), req.stop, index, bool(top_n))
        acc, offset = paced.choice, 0
        # log-probs asked for: the last chunk carries the tokens no text delta has (an end-of-turn
        # token decodes to nothing), so that the chunks' log-probs count every generated token
        wants_logprobs = bool(req.logprobs) if chat else req.logprobs is not None
        try:
            if chat:
                queue.put_nowait(fmt.chat_chunk(cid, created, model, req, index, {"role": "assistant", "content": ""}))
            async for part in self.server.engine.stream(prompt, params, rid=f"{cid}-{index}", top_logprobs=top_n):
                step = paced.add(part)
                if step is None:
                    continue
                delta, a, b = step
                if delta or (part.finish_reason and b > a and wants_logprobs):
                    if chat:
                        lp = fmt.chat_content_logprobs(self.served.tokenizer(), acc, a, b, req)
                        queue.put_nowait(fmt.chat_chunk(cid, created, model, req, index, {"content": delta}, lp))
                    else:
                        lp = fmt.completion_delta_logprobs(self.served.tokenizer(), acc, a, b, req, offset)
                        queue.put_nowait(fmt.completion_chunk(cid, created, model, index, delta, lp))
                    offset += len(delta)
                if part.finish_reason:
                    if chat:
                        last_chunk = fmt.chat_chunk(cid, created, model, req, index, {}, None, part.finish_reason)
                        if req.return_token_ids:
                            last_chunk["choices"][0]["token_ids"] = list(acc.output_ids)
                            last_chunk["choices"][0]["token_versions"] = list(acc.output_versions)
                    else:
                        last_chunk = fmt.completion_chunk(cid, created, model, index, "", None, part.finish_reason)
                    queue.put_nowait(last_chunk)
            queue.put_nowait(len(acc.output_ids))
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # the response reports it (an engine failure mid-stream)
            queue.put_nowait(err)

    def table(self) -> list[web.RouteDef]:
        """Every /v1 route: ours, the Responses API's (`responses_routes.py`), then the catch-all
        that names what is answered."""
        responses = self.responses
        return [
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model:.+}", self.model),
            web.post("/v1/responses", responses.create),
            web.get("/v1/responses/{id}", responses.retrieve),
            web.delete("/v1/responses/{id}", responses.delete),
            web.get("/v1/responses/{id}/input_items", responses.input_items),
            web.route("*", "/v1/{tail:.*}", self.not_supported),
        ]

    def _model_json(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "areal-graph",
            "max_model_len": int(self.server.engine.max_context),
        }

    @openai_errors
    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_json()]})

    @openai_errors
    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.model_id:
            return error_response(
                404,
                f"the model {name!r} does not exist; this server serves {self.model_id!r}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return web.json_response(self._model_json())

    @openai_errors
    async def not_supported(self, request: web.Request) -> web.Response:
        if request.path in ROUTES:
            allowed = "GET" if request.path == "/v1/models" else "POST"
            return error_response(
                405, f"{request.method} {request.path} is not allowed; use {allowed}", "invalid_request_error"
            )
        return error_response(
            404,
            f"{request.path} is not implemented by this server; it answers {list(ROUTES)}",
            "invalid_request_error",
            code="not_found",
        )


def default_served_name(model_path: str | None) -> str:
    """The model's name when the server is given none: its directory's name. Not the path (vLLM's
    default), which would tell every client where the model lives and end up in evaluation
    harnesses' output names."""
    name = Path(model_path).name if model_path else ""
    return name or "areal-graph-embedded"


def register_openai_routes(server: Any) -> OpenAIRoutes:
    """Add the /v1 routes to `server.app` (an InferenceHTTPServer); its middlewares (auth) apply."""
    routes = OpenAIRoutes(server)
    server.app.router.add_routes(routes.table())
    return routes
