"""The controller's handle on one worker process (see runtime/rpc/worker_server.py).

Thread-safe: one gRPC channel, many concurrent calls (the controller runs node calls from a
thread pool). Every failure becomes a `WorkerError` that names the worker, the
implementation, the method and carries the remote error text, so a crashed node reads like a
local traceback in the controller's log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc

from areal_graph.data.packed import PackedBatch
from areal_graph.protos import worker_pb2 as pb
from areal_graph.protos import worker_pb2_grpc as pb_grpc
from areal_graph.runtime.rpc.tensor_codec import (
    DEFAULT_CHUNK_BYTES,
    MalformedStream,
    check_encodable,
    decode_batch_and_stats,
    encode_batch,
)
from areal_graph.runtime.rpc.worker_server import GRPC_OPTIONS, TOKEN_METADATA_KEY

# Batches whose tensors are smaller than this go in one unary ExecuteOne message (no streams:
# ~4x less per-call latency in Python gRPC, measured 4.9 -> ~1 ms); bigger ones are streamed
# in chunks, so no message grows past what a stream chunk holds many times over.
ONE_MESSAGE_BYTES = 8 << 20


def _tensor_bytes(batch: PackedBatch) -> int:
    """About what `batch` takes on the wire: tensor bytes plus the per-sequence strings."""
    tensors = sum(
        t.numel() * t.element_size() for t in (batch.cu_seqlens, *batch.tokens.values(), *batch.seqs.values())
    )
    return tensors + sum(len(str(v)) for values in batch.meta.values() for v in values)


class WorkerError(RuntimeError):
    """A call on a worker failed: remote exception, unknown method, transport error, bad token."""

    def __init__(self, worker: str, impl: str, method: str, message: str, code: grpc.StatusCode | None = None) -> None:
        self.worker, self.impl, self.method, self.remote_message, self.code = worker, impl, method, message, code
        code_txt = f" [{code.name}]" if code is not None else ""
        super().__init__(f"worker {worker!r}, implementation {impl!r}, method {method!r} failed{code_txt}:\n{message}")

    @property
    def summary(self) -> str:
        """The remote exception in one line (a traceback's last line), for the console; the whole
        traceback stays in the worker's own log."""
        lines = [line.strip() for line in self.remote_message.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"{self.method} failed"


class WorkerClient:
    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout: float | None = 600.0,
        name: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        """`address` is "host:port"; `timeout` (seconds) bounds every call, None for no deadline."""
        self.address = address
        self.name = name or address
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self._metadata = ((TOKEN_METADATA_KEY, token),) if token else None
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._stub = pb_grpc.WorkerStub(self._channel)

    # ------------------------------------------------------------------ helpers
    def _error(self, impl: str, method: str, e: grpc.RpcError) -> WorkerError:
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else str(e)
        return WorkerError(self.name, impl, method, details or str(e), code)

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # ------------------------------------------------------------------ API
    def configure(
        self, name: str, impl: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> None:
        """Host `impl` ("module:Class", built with **params) under `name` on the worker."""
        req = pb.ConfigureRequest(name=name, impl=impl, params_json=json.dumps(params or {}))
        try:
            reply = self._stub.Configure(req, timeout=self._timeout(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(name, "__init__", e) from None
        if not reply.ok:
            raise WorkerError(self.name, name, f"__init__ ({impl})", reply.error)

    def execute(
        self,
        impl: str,
        method: str,
        batch: PackedBatch,
        /,
        *,
        _step: int = 0,
        _version: int = 0,
        _timeout: float | None = None,
        **args: Any,
    ) -> PackedBatch:
        """Stream `batch` through `impl.method(batch, **args)` remotely; returns what it wrote."""
        return self.execute_with_stats(impl, method, batch, _step=_step, _version=_version, _timeout=_timeout, **args)[
            0
        ]

    def execute_with_stats(
        self,
        impl: str,
        method: str,
        batch: PackedBatch,
        /,
        *,
        _step: int = 0,
        _version: int = 0,
        _timeout: float | None = None,
        **args: Any,
    ) -> tuple[PackedBatch, dict[str, float]]:
        """`execute`, also returning the stats the method reported with its batch.

        The underscored keywords are the client's own (trace step/version recorded in the
        worker's span, a per-call deadline) so they never collide with a method's arguments.
        """
        check_encodable(batch)
        header = pb.BatchChunk(
            header=pb.ExecuteHeader(impl=impl, method=method, step=_step, version=_version, args_json=json.dumps(args))
        )

        def requests() -> Iterator[pb.BatchChunk]:
            yield header
            yield from encode_batch(batch, self.chunk_bytes)

        try:
            if _tensor_bytes(batch) < ONE_MESSAGE_BYTES:  # most node calls: one unary call
                reply = self._stub.ExecuteOne(
                    pb.BatchMessage(chunks=list(requests())), timeout=self._timeout(_timeout), metadata=self._metadata
                )
                return decode_batch_and_stats(reply.chunks)
            replies = self._stub.Execute(requests(), timeout=self._timeout(_timeout), metadata=self._metadata)
            return decode_batch_and_stats(replies)
        except grpc.RpcError as e:
            raise self._error(impl, method, e) from None
        except MalformedStream as e:
            raise WorkerError(self.name, impl, method, f"malformed reply stream: {e}") from None

    def call(self, impl: str, method: str, /, *, _timeout: float | None = None, **args: Any) -> Any:
        """`impl.method(**args)` remotely, JSON in and out (for small things: versions, paths)."""
        req = pb.CallRequest(impl=impl, method=method, args_json=json.dumps(args))
        try:
            reply = self._stub.Call(req, timeout=self._timeout(_timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(impl, method, e) from None
        return json.loads(reply.result_json)

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        try:
            r = self._stub.Health(pb.HealthRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error("-", "Health", e) from None
        return {"ok": r.ok, "name": r.name, "pid": r.pid, "impls": list(r.impls)}

    def stats(self, drain_spans: bool = True, timeout: float = 10.0) -> dict[str, Any]:
        """Uptime, rss, call counts and the spans recorded since the last drain."""
        try:
            r = self._stub.Stats(pb.StatsRequest(drain_spans=drain_spans), timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error("-", "Stats", e) from None
        return json.loads(r.stats_json)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask the worker to exit. A worker that is already gone is not an error."""
        try:
            self._stub.Shutdown(pb.ShutdownRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise self._error("-", "Shutdown", e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
