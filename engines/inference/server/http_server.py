"""An HTTP server for the embedded engine that speaks SGLang's native API (the RL subset).

Why SGLang's API: the rollout side has one client for every backend; if the embedded server
answers the same endpoints with the same JSON as `sglang.launch_server`, the only thing that
differs between a laptop run and a GPU cluster run is the URL (plus the few semantic
differences the client hides: see `client.py`).

Endpoints (names and fields as in SGLang's `http_server.py`):

    POST /generate                  {input_ids, sampling_params, return_logprob, rid, stream?, logprob_start_len?}
                                    -> {text, output_ids, meta_info: {id, finish_reason,
                                        prompt_tokens, completion_tokens, weight_version,
                                        output_token_logprobs: [[logprob, token_id, null], ...],
                                        input_token_logprobs (logprob_start_len >= 0): the same for the prompt,
                                        null for its first token,
                                        output_token_versions: [int, ...]}}
    POST /update_weights_from_disk  {model_path, weight_version?, load_format?, abort_all_requests?}
    POST /update_weights_from_shared_memory  {path, manifest, weight_version}   (ours: same machine)
    POST /pause_generation          {mode?: "abort" (default, as SGLang) | "in_place" | "retract"}
    POST /continue_generation
    POST /abort_request             {rid?, abort_all?}
    GET  /health, GET /health_generate, GET /get_model_info, GET /get_weight_version,
    GET  /get_server_info, GET|POST /flush_cache
    GET  /get_spans                 (ours: trace spans since the last call)
    GET  /get_weights_digest        (ours: {weight_version, digest, dtype}: engines/weights_digest.py)
    GET  /get_clock                 (ours: {"now": this server's span clock, unix seconds}: clock-offset probes)

`output_token_versions` is our extension (SGLang has no per-token versions): the policy
version that produced each output token. Everything else is SGLang's shape, including
`weight_version` being a string.

Authentication (as SGLang's `--api-key`): a server started with an API key answers every
endpoint but `GET /health` with 401 unless the request carries `Authorization: Bearer KEY`.
The key comes from the environment variable named by `--api-key-env` (never the command
line, where `ps` shows it to every local user); `areal-graph run` makes one per run.

Errors are JSON in SGLang's error shape `{"object": "error", "message", "type", "code"}`:
bad input -> 400 naming the field, a full queue -> 503 (retry later), anything unexpected
-> 500; a failing request never takes the server down.

Run: `python -m areal_graph.engines.inference.server.http_server --model DIR --port 0`; it prints
`areal-graph inference server listening on http://HOST:PORT` on stdout once it accepts requests.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from areal_graph.api.process import die_with_parent, pin_to_cores
from areal_graph.api.spans import SpanRecorder
from areal_graph.engines import shared_weights
from areal_graph.engines.inference.engine_errors import InvalidRequestError, QueueFullError
from areal_graph.engines.inference.engine_spans import step_span_args
from areal_graph.engines.inference.request_tags import parse_tags
from areal_graph.engines.inference.sampling import GenerationResult, SamplingParams
from areal_graph.engines.inference.server.args import DTYPES, build_arg_parser, speculative_settings
from areal_graph.engines.inference.server.chat_routes import default_served_name, register_openai_routes
from areal_graph.engines.inference.server.native_requests import (
    ABORT_FIELDS,
    CONTINUE_FIELDS,
    PAUSE_FIELDS,
    PAUSE_MODES,
    UPDATE_FIELDS,
    BadRequest,
    finish_reason_json,
    is_int,
    parse_generate_request,
    parse_logprob_start_len,
)
from areal_graph.engines.inference.server.openai_http import STREAM_INTERVAL_S
from areal_graph.engines.inference.server.process import READY_LINE

log = logging.getLogger(__name__)


def error_response(status: int, message: str, kind: str) -> web.Response:
    """SGLang's error body (`_create_error_response`), so clients parse one format."""
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status=status
    )


# --------------------------------------------------------------------------- the server
class InferenceHTTPServer:
    """Owns one engine and the aiohttp application that exposes it."""

    def __init__(
        self,
        engine: Any,
        model_path: str = "",
        tokenizer: Any = None,
        name: str = "inference",
        api_key: str | None = None,
        served_model_name: str | None = None,
        max_prompt_chars: int | None = None,
    ) -> None:
        self.engine = engine
        self.api_key = api_key
        self.model_path = model_path
        self.served_model_name = served_model_name or default_served_name(model_path)  # the /v1 model id
        self.max_prompt_chars = max_prompt_chars  # None: served_model.CHARS_PER_TOKEN_LIMIT per token of context
        self.tokenizer = tokenizer
        self.spans = SpanRecorder(name)  # off when the run turned tracing off (AREAL_GRAPH_TRACE=0)
        if hasattr(engine, "trace_into"):  # per-request and weight-swap spans (engine_spans.py)
            engine.trace_into(self.spans)
        self._update_lock = asyncio.Lock()
        self.app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._auth, self._errors])
        r = self.app.router
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/update_weights_from_shared_memory", self.update_weights_from_shared_memory)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/abort_request", self.abort_request)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/get_weight_version", self.get_weight_version)
        r.add_get("/get_weights_digest", self.get_weights_digest)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/get_spans", self.get_spans)
        register_openai_routes(self)  # /v1/chat/completions, /v1/completions, /v1/models: chat_routes.py
        r.add_get("/get_clock", self.get_clock)

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        """Every endpoint but the liveness probe needs the key, when the server has one."""
        if self.api_key is None or (request.method == "GET" and request.path == "/health"):
            return await handler(request)
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            return error_response(401, "missing or wrong API key (Authorization: Bearer KEY)", "Unauthorized")
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except BadRequest as err:
            return error_response(400, str(err), "BadRequest")
        except InvalidRequestError as err:
            return error_response(400, str(err), "BadRequest")
        except QueueFullError as err:
            return error_response(503, f"server overloaded: {err}; retry later", "ServiceUnavailable")
        except asyncio.CancelledError:
            raise
        except Exception as err:  # one bad request must never take the server down
            log.exception("request %s %s failed", request.method, request.path)
            return error_response(500, f"{type(err).__name__}: {err}", "InternalServerError")

    async def _json(self, request: web.Request, allowed: set[str] | None = None) -> dict:
        if not request.can_read_body:
            body: Any = {}
        else:
            try:
                body = await request.json()
            except ValueError as err:
                raise BadRequest(f"the request body is not valid JSON: {err}") from None
            except RecursionError:
                raise BadRequest("the request body is JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if allowed is not None:
            unknown = sorted(set(body) - allowed)
            if unknown:
                raise BadRequest(f"unknown field(s) {unknown}; supported: {sorted(allowed)}")
        return body

    # ------------------------------------------------------------------ generation
    async def generate(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        ids, params, ret_lp, rid = parse_generate_request(body, self.engine.max_context)
        start = parse_logprob_start_len(body, len(ids))
        tags = parse_tags(body.get("trace"))
        if tags is not None and hasattr(self.engine, "tag_request"):
            self.engine.tag_request(rid, tags)  # on the request's trace spans
        if body.get("stream") is True:
            return await self._generate_stream(request, ids, params, ret_lp, rid)
        try:
            result = await self.engine.generate(ids, params, rid=rid)
        except asyncio.CancelledError:  # the client went away: free the slot (as SGLang does)
            self.engine.abort(rid)
            raise
        # the request's spans (queued, prefill, decode, interrupted, ...) are the engine's: engine_spans.py
        out = self.result_json(result, ret_lp)
        if start is not None:  # the prompt's log-probs, from a scoring forward (EmbeddedEngine.score_prompt)
            prompt_lps, _ = await asyncio.to_thread(self.engine.score_prompt, ids)
            out["meta_info"]["input_token_logprobs"] = [
                [lp, int(t), None] for lp, t in zip(prompt_lps[start:], ids[start:])
            ]
        return web.json_response(out)

    async def _generate_stream(
        self, request: web.Request, ids: list[int], params: Any, ret_lp: bool, rid: str
    ) -> web.StreamResponse:
        """SGLang's streamed /generate: Server-Sent Events as the engine decodes, each the answer so
        far (text, output_ids and meta_info cumulative, finish_reason null until the last), then
        `data: [DONE]`. Leaving early (the client went away) aborts the request."""
        response: web.StreamResponse | None = None
        so_far = GenerationResult(
            rid=rid, output_ids=[], output_logprobs=[], output_versions=[], finish_reason="", prompt_len=len(ids)
        )
        last = 0.0
        async for part in self.engine.stream(ids, params, rid=rid):
            so_far.output_ids += part.output_ids
            so_far.output_logprobs += part.output_logprobs
            so_far.output_versions += part.output_versions
            now = time.monotonic()
            if not part.finish_reason and last and now - last < STREAM_INTERVAL_S:
                continue
            last = now
            body = self.result_json(so_far, ret_lp)
            if part.finish_reason:
                body["meta_info"]["finish_reason"] = finish_reason_json(
                    part.finish_reason, len(so_far.output_ids), so_far.output_ids[-1] if so_far.output_ids else None
                )
            else:
                body["meta_info"]["finish_reason"] = None
            if response is None:  # headers with the first event: an engine refusal before it is a plain 400
                response = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await response.prepare(request)
            await response.write(f"data: {json.dumps(body)}\n\n".encode())
        assert response is not None  # the last part always comes
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def result_json(self, result: Any, return_logprob: bool) -> dict[str, Any]:
        out_ids = list(result.output_ids)
        text = ""
        if self.tokenizer is not None:
            try:
                text = self.tokenizer.decode(out_ids, skip_special_tokens=True)
            except Exception:  # text is a convenience; token ids are the contract
                log.debug("decoding output failed", exc_info=True)
        versions = list(result.output_versions)
        meta: dict[str, Any] = {
            "id": result.rid,
            "finish_reason": finish_reason_json(result.finish_reason, len(out_ids), out_ids[-1] if out_ids else None),
            "prompt_tokens": result.prompt_len,
            "completion_tokens": len(out_ids),
            "cached_tokens": 0,
            "weight_version": str(versions[-1] if versions else self.engine.version),
            "output_token_versions": versions,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [
                [float(lp), int(t), None] for lp, t in zip(result.output_logprobs, out_ids)
            ]
        if result.output_forced is not None:  # ours: tokens a schema or grammar forced (constrained.py)
            meta["output_token_forced"] = [bool(f) for f in result.output_forced]
        return {"text": text, "output_ids": out_ids, "meta_info": meta}

    # ------------------------------------------------------------------ weights and control
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await self._json(request, UPDATE_FIELDS)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("'model_path' (a directory with the new weights) is required")
        version = body.get("weight_version")
        if version is not None:
            try:
                version = int(version)
            except (TypeError, ValueError):
                raise BadRequest(f"'weight_version' must be an integer (or its string), got {version!r}") from None
        fmt = body.get("load_format")
        if fmt not in (None, "auto", "safetensors"):
            raise BadRequest(f"'load_format' {fmt!r} is not supported; use 'auto'")
        if body.get("abort_all_requests"):
            self.engine.abort_all()
        running = int(self.engine.stats().get("running", 0)) if hasattr(self.engine, "stats") else 0

        async def load() -> None:
            await asyncio.to_thread(self.engine.update_weights_from_disk, path, version)

        failed = await self._load_weights("disk", path, load, (OSError, ValueError), {"num_paused_requests": 0})
        if failed is not None:
            return failed
        msg = f"Succeeded to update model weights. Weight version updated to {self.engine.version}."
        return web.json_response({"success": True, "message": msg, "num_paused_requests": running})

    async def update_weights_from_shared_memory(self, request: web.Request) -> web.Response:
        """Our extension: load weights a trainer on this machine published into a shared-memory
        file (engines/shared_weights.py); the body holds its path and manifest, no tensors."""
        body = await self._json(request, {"path", "manifest", "weight_version"})
        path, manifest = body.get("path"), body.get("manifest")
        if not isinstance(path, str) or not path or not isinstance(manifest, list):
            raise BadRequest("'path' (the shared weights file) and 'manifest' (a list of tensors) are required")
        version = body.get("weight_version")
        if not is_int(version):
            raise BadRequest(f"'weight_version' must be an integer, got {version!r}")

        async def load() -> None:
            state = shared_weights.read(path, manifest)
            await asyncio.to_thread(self.engine.update_weights_from_state_dict, state, version)

        errors = (OSError, ValueError, KeyError, TypeError, RuntimeError)
        failed = await self._load_weights("shared_memory", path, load, errors, version_after=int(version))
        if failed is not None:
            return failed
        return web.json_response({"success": True, "message": f"weight version {self.engine.version}"})

    async def _load_weights(
        self,
        source: str,
        path: str,
        load: Callable[[], Awaitable[None]],
        errors: tuple[type[Exception], ...],
        failure: dict[str, Any] | None = None,
        version_after: int | None = None,
    ) -> web.Response | None:
        """Run `load` (read the weights and swap them in) under the update lock, recorded as the
        `update_weights` span (the engine's own `weight_swap` span nests inside); one of `errors` is
        a 400 naming `path` (plus the `failure` fields), else None."""
        async with self._update_lock:
            try:
                t0, before = time.perf_counter(), self.engine.version
                await load()
                self.spans.record(
                    "update_weights",
                    t0,
                    time.perf_counter(),
                    cat="weights",
                    node="weights",
                    source=source,
                    version_before=before,
                    version_after=self.engine.version if version_after is None else version_after,
                )
            except errors as err:
                body = {"success": False, "message": f"failed to load weights from {path}: {err}", **(failure or {})}
                return web.json_response(body, status=400)
        return None

    async def pause_generation(self, request: web.Request) -> web.Response:
        """SGLang's modes: "abort" (the default) returns in-flight requests as aborted; "in_place" and
        "retract" keep them (their KV is recomputed on resume if the weights changed meanwhile)."""
        body = await self._json(request, PAUSE_FIELDS)
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise BadRequest(f"'mode' must be one of {list(PAUSE_MODES)}, got {mode!r}")
        await asyncio.to_thread(self.engine.pause)
        aborted = await asyncio.to_thread(self.engine.abort_all) if mode == "abort" else 0
        return web.json_response(
            {"message": "Generation paused successfully.", "status": "ok", "mode": mode, "num_aborted": aborted}
        )

    async def continue_generation(self, request: web.Request) -> web.Response:
        await self._json(request, CONTINUE_FIELDS)
        await asyncio.to_thread(self.engine.resume)
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._json(request, ABORT_FIELDS)
        rid, abort_all = body.get("rid"), body.get("abort_all", False)
        if not isinstance(abort_all, bool):
            raise BadRequest(f"'abort_all' must be a boolean, got {abort_all!r}")
        if rid is not None and not isinstance(rid, str):
            raise BadRequest(f"'rid' must be a string, got {rid!r}")
        if not abort_all and not rid:
            raise BadRequest("give 'rid' or 'abort_all': true")
        n = self.engine.abort_all() if abort_all else int(bool(self.engine.abort(rid)))
        return web.json_response({"success": True, "num_aborted": n})

    # ------------------------------------------------------------------ info
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """Healthy only if a one-token generation completes (as SGLang's /health_generate)."""
        try:
            await asyncio.wait_for(
                self.engine.generate(
                    [0], SamplingParams(max_new_tokens=1, greedy=True), rid=f"health-{uuid.uuid4().hex}"
                ),
                timeout=20,
            )
        except Exception as err:
            log.warning("health_generate failed: %s", err)
            return web.Response(status=503)
        return web.Response(status=200)

    async def get_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path if self.tokenizer is not None else None,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": str(self.engine.version),
                "max_context": self.engine.max_context,
                "backend": "embedded",
            }
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": str(self.engine.version)})

    async def get_weights_digest(self, request: web.Request) -> web.Response:
        """Ours: the weights' version and a digest of them (engines/weights_digest.py), taken
        between loads (under the update lock), so the two belong together."""
        async with self._update_lock:
            version = self.engine.version
            digest = await asyncio.to_thread(self.engine.weights_digest)
        return web.json_response(
            {"weight_version": str(version), "digest": digest, "dtype": str(self.engine.dtype).removeprefix("torch.")}
        )

    async def get_server_info(self, request: web.Request) -> web.Response:
        stats = self.engine.stats() if hasattr(self.engine, "stats") else {}
        return web.json_response(
            {
                "model_path": self.model_path,
                "weight_version": str(self.engine.version),
                "internal_states": [_jsonable(stats)],
                "version": "areal-graph-embedded",
            }
        )

    async def get_spans(self, request: web.Request) -> web.Response:
        """Our extension: the trace spans recorded since the last call (requests, and the engine's
        busy intervals as `compute` spans), for the run's trace."""
        take = getattr(self.engine, "take_busy_spans", None)
        for start, end in take() if callable(take) else []:
            self.spans.record("engine", start, end, cat="compute", node="engine")
        steps = getattr(self.engine, "take_step_log", None)
        rows = steps() if callable(steps) else []
        if rows:
            start, end, args = step_span_args(rows)
            self.spans.record("engine_steps", start, end, cat="profile", node="engine", **args)
            stats = self.engine.stats() if hasattr(self.engine, "stats") else {}
            speculative = stats.get("speculative")
            if speculative:  # the running counts by source (trace_analysis/speculation_summary.py)
                self.spans.record("speculation", end, end, cat="profile", node="engine", **speculative)
            shadow = stats.get("speculative_shadow")
            if shadow:  # speculation off: what it would have accepted (speculation/shadow.py), the same way
                self.spans.record("speculation_shadow", end, end, cat="profile", node="engine", **shadow)
        return web.json_response({"spans": self.spans.take()})

    async def get_clock(self, request: web.Request) -> web.Response:
        """Our extension: this server's clock as its spans are stamped; the controller probes it a few
        times at connect to align this server's spans with its own (runtime/observability/clocks.py)."""
        return web.json_response({"now": self.spans.now()})

    async def flush_cache(self, request: web.Request) -> web.Response:
        # The embedded engine keeps no cross-request prefix cache: nothing to flush.
        return web.Response(text="Cache flushed.\n", status=200)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


# --------------------------------------------------------------------------- process entry
async def serve(server: InferenceHTTPServer, host: str, port: int, stop: asyncio.Event, announce: bool = True) -> None:
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # request in the engine (SGLang does the same), so retried requests leave no orphans.
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
    if announce:
        sys.stdout.write(f"{READY_LINE} http://{host}:{bound}\n")
        sys.stdout.flush()
    log.info("serving %s on http://%s:%d", server.model_path, host, bound)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    try:
        speculative = speculative_settings(args)
    except ValueError as err:
        parser.error(str(err))  # exits 2 with the usage line, as argparse does for a bad flag
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            sys.stderr.write(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty\n")
            return 2

    die_with_parent()
    pin_to_cores()  # resources.inference.cores (the launcher pinned it already; threads started since inherit)
    if os.environ.get("AREAL_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["AREAL_SWITCH_INTERVAL"]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    from areal_graph.engines.inference.engine import EmbeddedEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_path = args.model
    engine = EmbeddedEngine(
        model_path,
        device=args.device,
        dtype=getattr(torch, DTYPES[args.dtype]),
        max_running=args.max_running,
        max_queue=args.max_queue,
        max_context=args.max_context,
        version=args.weight_version,
        seed=args.seed,
        kv_on_update=args.kv_on_update,
        speculative=speculative,
    )
    tokenizer = getattr(engine, "tokenizer", None)
    engine.start()
    server = InferenceHTTPServer(
        engine,
        model_path=model_path,
        tokenizer=tokenizer,
        name=args.name,
        api_key=api_key,
        served_model_name=args.served_model_name,
        max_prompt_chars=args.max_prompt_chars,
    )

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(server, args.host, args.port, stop)

    try:
        asyncio.run(_run())
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
