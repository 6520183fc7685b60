"""A worker process: hosts named implementations and serves them over gRPC.

    python -m areal_graph.runtime.rpc.worker_server --port 0 --name NAME \
        [--host 127.0.0.1] [--port-file FILE] [--token-env VAR] [--parent-pid PID]

Why each piece exists:
- `--port 0` + `--port-file`: the OS picks a free port and the launcher reads it back, so
  parallel runs never race for ports.
- Loopback by default. Binding any other address requires a shared secret (read from the
  environment variable named by `--token-env`, never from the command line where `ps` shows
  it); every call must carry it in the `x-areal-token` metadata or gets UNAUTHENTICATED.
- `--parent-pid`: the worker polls its parent and exits when it is gone, so a controller
  killed with SIGKILL leaves no orphans behind.
- An exception in an implementation becomes a gRPC INTERNAL error whose details hold the
  remote traceback; the worker keeps serving.
- A span (name, start, end, worker) is recorded per Execute/Call; `Stats` hands them to the
  controller, which merges them into the run's trace. Execute spans are category "compute"
  unless the host object sets `span_category` (the rollout host: "rollout", it waits on servers).

Hosted implementations are plain objects: `Execute` calls
`impl.<method>(batch: PackedBatch, **args) -> PackedBatch | None | (PackedBatch, stats)`
(stats: a dict of numbers, sent back with the batch) and `Call` calls
`impl.<method>(**args) -> JSON-able`.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, NoReturn

import grpc
import psutil

from areal_graph.api.imports import import_object
from areal_graph.api.spans import tracing_enabled_by_env
from areal_graph.data.packed import PackedBatch
from areal_graph.protos import worker_pb2 as pb
from areal_graph.protos import worker_pb2_grpc as pb_grpc
from areal_graph.runtime.process_setup import prepare_worker_process
from areal_graph.runtime.rpc.tensor_codec import BatchDecoder, MalformedStream, encode_batch

log = logging.getLogger(__name__)

TOKEN_METADATA_KEY = "x-areal-token"
MAX_MESSAGE_BYTES = 1 << 30
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Error details travel in HTTP/2 trailers; keep them well under the default 8 KiB header limit.
MAX_ERROR_DETAILS = 6000


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_result(result: Any, batch: PackedBatch, where: str) -> tuple[PackedBatch, dict[str, float]]:
    """A hosted method's return value as (batch, stats): None means "wrote nothing"."""
    stats: dict[str, float] = {}
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        result, stats = result
    if result is None:
        result = PackedBatch(batch.cu_seqlens.clone())
    if not isinstance(result, PackedBatch):
        raise TypeError(
            f"{where} returned {type(result).__name__}, expected PackedBatch, None or (PackedBatch, dict of stats)"
        )
    return result, {str(k): float(v) for k, v in stats.items()}


def _short(text: str) -> str:
    if len(text) <= MAX_ERROR_DETAILS:
        return text
    return "...(truncated)...\n" + text[-MAX_ERROR_DETAILS:]


def refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with `code`: grpc's `abort` raises, which its type stubs do not say."""
    context.abort(code, message)
    raise AssertionError("grpc's ServicerContext.abort returned")


class WorkerService(pb_grpc.WorkerServicer):
    """The gRPC servicer: a registry of hosted implementations plus bookkeeping."""

    def __init__(self, name: str, token: str | None = None, chunk_bytes: int = 1 << 20) -> None:
        self.name = name
        self.token = token
        self.chunk_bytes = chunk_bytes
        self.impls: dict[str, Any] = {}
        self.started = time.time()
        self.calls = 0
        self.errors = 0
        self._spans: list[dict[str, Any]] = []
        self._trace = tracing_enabled_by_env()  # runtime.trace: false -> no spans kept
        self._lock = threading.Lock()
        self.stop_requested = threading.Event()

    # ------------------------------------------------------------------ helpers
    def _authorize(self, context: grpc.ServicerContext) -> None:
        if self.token is None:
            return
        given = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY)
        if given is None or not hmac.compare_digest(str(given).encode(), self.token.encode()):
            refuse(context, grpc.StatusCode.UNAUTHENTICATED, f"worker {self.name}: missing or wrong token")

    def _impl(self, name: str, context: grpc.ServicerContext) -> Any:
        impl = self.impls.get(name)
        if impl is None:
            refuse(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"worker {self.name}: no implementation named {name!r}; configured: {sorted(self.impls)}",
            )
        return impl

    def _method(self, impl_name: str, method: str, context: grpc.ServicerContext) -> Any:
        impl = self._impl(impl_name, context)
        if method.startswith("_") or not callable(getattr(impl, method, None)):
            refuse(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"worker {self.name}: implementation {impl_name!r} ({type(impl).__name__}) "
                f"has no public method {method!r}",
            )
        return getattr(impl, method)

    def _record(self, name: str, start: float, ok: bool, cat: str = "worker", **args: Any) -> None:
        span = {
            "name": name,
            "cat": cat,
            "start": start,
            "end": time.time(),
            "worker": self.name,
            "pid": os.getpid(),
            "tid": threading.get_ident(),
            "ok": ok,
            "args": args,
        }
        with self._lock:
            self.calls += 1
            self.errors += 0 if ok else 1
            if self._trace:
                self._spans.append(span)

    def _fail(self, context: grpc.ServicerContext, where: str) -> None:
        text = f"worker {self.name}: {where} raised\n{traceback.format_exc()}"
        log.error("%s", text)
        refuse(context, grpc.StatusCode.INTERNAL, _short(text))

    # ------------------------------------------------------------------ RPCs
    def Configure(self, request: pb.ConfigureRequest, context: grpc.ServicerContext) -> pb.ConfigureReply:
        self._authorize(context)
        start = time.time()
        try:
            params = json.loads(request.params_json or "{}")
            if not isinstance(params, dict):
                raise TypeError(f"params must be a JSON object, got {type(params).__name__}")
            cls = import_object(request.impl, what="implementation")
            self.impls[request.name] = cls(**params)
        except Exception:
            self._record(f"configure:{request.name}", start, ok=False, impl=request.impl)
            text = _short(
                f"worker {self.name}: configuring {request.name!r} as {request.impl} failed\n" + traceback.format_exc()
            )
            log.error("%s", text)
            return pb.ConfigureReply(ok=False, error=text)
        self._record(f"configure:{request.name}", start, ok=True, impl=request.impl)
        log.info("configured %s = %s", request.name, request.impl)
        return pb.ConfigureReply(ok=True)

    def Execute(
        self, request_iterator: Iterator[pb.BatchChunk], context: grpc.ServicerContext
    ) -> Iterator[pb.BatchChunk]:
        yield from self._execute(request_iterator, context)

    def ExecuteOne(self, request: pb.BatchMessage, context: grpc.ServicerContext) -> pb.BatchMessage:
        return pb.BatchMessage(chunks=self._execute(iter(request.chunks), context))

    def _execute(self, request_iterator: Iterator[pb.BatchChunk], context: grpc.ServicerContext) -> list[pb.BatchChunk]:
        """One Execute, streamed or in one message: the reply's chunks."""
        self._authorize(context)
        first = next(request_iterator, None)
        if first is None or not first.HasField("header"):
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "Execute stream must start with an ExecuteHeader")
        head = first.header
        fn = self._method(head.impl, head.method, context)
        try:
            args = json.loads(head.args_json or "{}")
        except json.JSONDecodeError as e:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"Execute args are not JSON: {e}")
        dec = BatchDecoder()
        try:
            for chunk in request_iterator:
                dec.feed(chunk)
                if dec.done:
                    break
            batch = dec.finish()
        except MalformedStream as e:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"worker {self.name}: malformed batch: {e}")
        start = time.time()
        where = f"{head.impl}.{head.method}"
        try:
            out, stats = split_result(fn(batch, **args), batch, where)
            chunks = list(encode_batch(out, self.chunk_bytes, stats))
        except Exception:
            self._record(where, start, ok=False, step=head.step, version=head.version)
            self._fail(context, where)
        # An Execute is the node's own work ("compute") unless its host says it mostly waits on
        # other processes (the rollout host waits on inference servers): the trace's overhead
        # accounting counts compute spans only.
        self._record(
            where,
            start,
            ok=True,
            step=head.step,
            version=head.version,
            seqs=batch.num_seqs,
            tokens=batch.num_tokens,
            cat=getattr(fn.__self__, "span_category", "compute") if hasattr(fn, "__self__") else "compute",
        )
        return chunks

    def Call(self, request: pb.CallRequest, context: grpc.ServicerContext) -> pb.CallReply:
        self._authorize(context)
        fn = self._method(request.impl, request.method, context)
        try:
            args = json.loads(request.args_json or "{}")
        except json.JSONDecodeError as e:
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"Call args are not JSON: {e}")
        where = f"{request.impl}.{request.method}"
        start = time.time()
        try:
            result = json.dumps(fn(**args))
        except Exception:
            self._record(where, start, ok=False)
            self._fail(context, where)
        self._record(where, start, ok=True)
        return pb.CallReply(result_json=result)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        self._authorize(context)
        return pb.HealthReply(ok=True, name=self.name, pid=os.getpid(), impls=sorted(self.impls))

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsReply:
        self._authorize(context)
        with self._lock:
            spans = self._spans
            if request.drain_spans:
                self._spans = []
            # "now": this worker's clock, which stamps its spans (the controller's clock-offset probe)
            stats = {
                "name": self.name,
                "pid": os.getpid(),
                "now": time.time(),
                "uptime_s": time.time() - self.started,
                "rss_bytes": _rss_bytes(),
                "calls": self.calls,
                "errors": self.errors,
                "impls": sorted(self.impls),
                "spans": list(spans),
            }
        return pb.StatsReply(stats_json=json.dumps(stats))

    def Shutdown(self, request: pb.ShutdownRequest, context: grpc.ServicerContext) -> pb.ShutdownReply:
        self._authorize(context)
        log.info("shutdown requested")
        self.stop_requested.set()
        return pb.ShutdownReply(ok=True)


def _rss_bytes() -> int:
    try:
        return int(psutil.Process().memory_info().rss)
    except Exception:  # stats are best effort
        return -1


def serve(
    name: str, host: str = "127.0.0.1", port: int = 0, token: str | None = None, max_workers: int = 64
) -> tuple[grpc.Server, WorkerService, int]:
    """Start a server in this process; returns (server, service, bound port). Used by tests too."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"refusing to bind {host!r} without a token: a worker reachable from other hosts runs "
            "arbitrary implementations, so pass --token-env VAR with the shared secret in $VAR"
        )
    service = WorkerService(name, token=token)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"w-{name}"), options=GRPC_OPTIONS
    )
    pb_grpc.add_WorkerServicer_to_server(service, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind {host}:{port}")
    server.start()
    return server, service, bound


def _parent_alive(pid: int) -> bool:
    try:
        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="areal-graph gRPC worker process")
    parser.add_argument("--name", required=True, help="worker name (appears in errors, spans, logs)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (non-loopback needs --token-env)")
    parser.add_argument("--port", type=int, default=0, help="0 lets the OS pick a free port")
    parser.add_argument("--port-file", type=Path, help="write the bound port here (atomically)")
    parser.add_argument("--token-env", help="name of the environment variable holding the shared secret")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    parser.add_argument(
        "--max-workers",
        type=int,
        default=64,
        help="gRPC handler threads = the most concurrent calls this worker serves",
    )
    args = parser.parse_args(argv)

    prepare_worker_process(args.name)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            parser.error(f"--token-env {args.token_env}: that environment variable is unset or empty")
    try:
        server, service, port = serve(args.name, args.host, args.port, token, args.max_workers)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    log.info("worker %s listening on %s:%d (pid %d)", args.name, args.host, port, os.getpid())
    print(f"PORT {port}", flush=True)
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, args.port_file)

    while not service.stop_requested.wait(0.5):
        if args.parent_pid and not _parent_alive(args.parent_pid):
            log.warning("parent %d is gone; exiting", args.parent_pid)
            break
    server.stop(grace=0.5).wait(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
