"""One model trained by several data-parallel ranks, served to the controller as one `ModelHost`.

A model with `dp_size: N` runs as N processes. Rank 0 is the model's gRPC worker, exactly
where a one-rank model's worker is, hosting a `DataParallelModelHost`: the same methods as
`ModelHost`, so the controller, the executor and the node kinds call it unchanged. Ranks
1..N-1 are plain processes (`python -m areal_graph.runtime.hosts.dp_model_host`) that the
launcher starts beside it; they serve no RPC. Every call rank 0 receives is first broadcast
to them over a gloo group (`RankChannel`), then all ranks run it on their own `ModelHost`:
the `TrainEngine` under DDP (CPU) or FSDP2 (CUDA) does the rest, as it does in
engines/training/data_parallel.py's tests.

Why rank 0 relays, rather than the executor fanning each call out to N workers: the
controller and the executor keep talking to one endpoint per model (a node call, a weight
sync, a checkpoint are one call each, as before), the whole batch crosses gRPC once, and
the ranks cannot receive calls in different orders (two callers of N workers could
interleave; one broadcast cannot).

Why every rank receives the *whole* batch rather than its share: the loss callback is built
from the whole batch (token and sequence counts, Dr.GRPO's constant), so its normalisers
are global with no extra collective, and each rank picks its token-balanced share with the
deterministic planner (`plan_microbatches(..., dp_size=N)` inside the engine). A batch is
token ids and a few floats per token: broadcasting it costs little next to the forward.

Commands travel without pickle (docs/design.md, the data contract): a JSON header and the batch in the gRPC wire
format of runtime/rpc/tensor_codec.py, framed by lengths.

A rank that fails a call exits: the launcher's watchdog reports it (a model process: the
run goes on from its last checkpoint, `runtime.auto_resume`), and no rank is left waiting in
a collective that the others will never join.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import struct
import sys
from typing import TYPE_CHECKING, Any

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training import data_parallel as dp
from areal_graph.protos import worker_pb2 as pb
from areal_graph.runtime.hosts.model_host import ModelHost
from areal_graph.runtime.launchers.local import rank_threads
from areal_graph.runtime.process_setup import prepare_worker_process
from areal_graph.runtime.rpc.tensor_codec import BatchDecoder, encode_batch

log = logging.getLogger(__name__)

MODULE = "areal_graph.runtime.hosts.dp_model_host"  # what the launcher runs for ranks 1..N-1
_LEN = struct.Struct("<Q")  # frame length prefix


# --------------------------------------------------------------------------- command wire format
def encode_command(method: str, kwargs: dict[str, Any], batch: PackedBatch | None = None) -> bytes:
    """A call as bytes: a framed JSON header, then the batch's chunks, each framed."""
    header = json.dumps({"method": method, "kwargs": kwargs, "batch": batch is not None}).encode()
    parts = [_LEN.pack(len(header)), header]
    if batch is not None:
        for chunk in encode_batch(batch):
            data = chunk.SerializeToString()
            parts += [_LEN.pack(len(data)), data]
    return b"".join(parts)


def decode_command(data: bytes) -> tuple[str, dict[str, Any], PackedBatch | None]:
    """The inverse of `encode_command`."""
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        (size,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if pos + size > len(data):
            raise ValueError(f"truncated command: a frame of {size} bytes at {pos} of {len(data)}")
        frames.append(data[pos : pos + size])
        pos += size
    if not frames:
        raise ValueError("empty command")
    header = json.loads(frames[0])
    batch = None
    if header["batch"]:
        decoder = BatchDecoder()
        for frame in frames[1:]:
            decoder.feed(pb.BatchChunk.FromString(frame))
        batch = decoder.finish()
    return header["method"], header["kwargs"], batch


class RankChannel:
    """Rank 0's calls, broadcast to the other ranks over the command group."""

    def __init__(self) -> None:
        self._dp = dp
        self.group = dp.init_from_env()
        self.rank, self.world_size = dp.world()

    def send(self, method: str, kwargs: dict[str, Any], batch: PackedBatch | None = None) -> None:
        self._dp.broadcast_bytes(encode_command(method, kwargs, batch), self.group)

    def receive(self) -> tuple[str, dict[str, Any], PackedBatch | None]:
        return decode_command(self._dp.broadcast_bytes(None, self.group))


def check_device(device: str, world_size: int) -> None:
    """Each rank needs a device of its own: "cuda" (rank r on cuda:r), never one pinned GPU."""
    if world_size > 1 and re.fullmatch(r"cuda:\d+", device):
        raise ValueError(
            f"device {device!r} would put all {world_size} data-parallel ranks on one GPU: "
            "set the model's `device: cuda` (rank r uses cuda:r) or dp_size: 1"
        )


# --------------------------------------------------------------------------- rank 0
class DataParallelModelHost:
    """Rank 0 of a data-parallel model: `ModelHost`'s methods, each run on every rank.

    Built by the worker from the same arguments as a `ModelHost`; the rank layout comes from
    the torchrun-style environment the launcher set (MASTER_ADDR/PORT, RANK, WORLD_SIZE).
    """

    def __init__(self, **host_args: Any) -> None:
        self.channel = RankChannel()
        if self.channel.rank != 0:
            raise RuntimeError(f"the model worker must be rank 0, this is rank {self.channel.rank}")
        check_device(str(host_args.get("device", "cpu")), self.channel.world_size)
        if host_args.get("threads") is not None:  # each rank's share of the model's training threads
            host_args["threads"] = rank_threads(host_args["threads"], self.channel.world_size)
        self.channel.send("init", host_args)
        self.host = ModelHost(**host_args)
        log.info("model %s: %d data-parallel ranks", host_args.get("model_path"), self.channel.world_size)

    def _all(self, method: str, batch: PackedBatch | None = None, **kwargs: Any) -> Any:
        self.channel.send(method, kwargs, batch)
        args = (batch,) if batch is not None else ()
        return getattr(self.host, method)(*args, **kwargs)

    def logprob(
        self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int, temperature: float = 1.0
    ) -> PackedBatch:
        return self._all(
            "logprob", batch, out_key=out_key, max_tokens_per_mb=max_tokens_per_mb, temperature=temperature
        )

    def values(self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int) -> PackedBatch:
        return self._all("values", batch, out_key=out_key, max_tokens_per_mb=max_tokens_per_mb)

    def train(
        self,
        batch: PackedBatch,
        params: dict[str, Any],
        max_tokens_per_mb: int,
        temperature: float = 1.0,
        fused_prox: bool = False,
        policy_version: int | None = None,
    ) -> tuple[PackedBatch, dict[str, float]]:
        return self._all(
            "train",
            batch,
            params=params,
            max_tokens_per_mb=max_tokens_per_mb,
            temperature=temperature,
            fused_prox=fused_prox,
            policy_version=policy_version,
        )

    def publish_weights(self, path: str) -> list[dict]:
        return self._all("publish_weights", path=path)

    def export_weights(self, path: str, with_tokenizer: bool = False) -> str:
        return self._all("export_weights", path=path, with_tokenizer=with_tokenizer)

    def export_adapter(self, path: str) -> str:
        return self._all("export_adapter", path=path)

    def save_checkpoint(self, path: str) -> str:
        return self._all("save_checkpoint", path=path)

    def load_checkpoint(self, path: str) -> str:
        return self._all("load_checkpoint", path=path)

    @property
    def engine(self) -> Any:
        """Rank 0's engine (in-process use, as `ModelHost.engine`); not callable over RPC."""
        return self.host.engine


# --------------------------------------------------------------------------- ranks 1..N-1
def run_follower(host: ModelHost, method: str, kwargs: dict[str, Any], batch: PackedBatch | None) -> None:
    """This rank's part of one of rank 0's calls; results stay with rank 0, which answers."""
    if method == "publish_weights":  # rank 0 writes the file; gathering is a collective under FSDP
        if host.engine.parallel == "fsdp":
            host.engine.state_dict_for_sync(copy=False)
    elif method == "export_weights":  # rank 0 writes; the tokenizer too
        host.export_weights(kwargs["path"])
    elif batch is not None:
        getattr(host, method)(batch, **kwargs)
    else:
        getattr(host, method)(**kwargs)


def serve_rank() -> None:
    """Join rank 0's group, build the same `ModelHost`, run every call rank 0 broadcasts, until
    the launcher stops this process (or rank 0 is gone: the next receive fails)."""
    channel = RankChannel()
    method, kwargs, _ = channel.receive()
    if method != "init":
        raise RuntimeError(f"rank {channel.rank}: the first command must be init, got {method!r}")
    host = ModelHost(**kwargs)
    log.info("rank %d/%d ready: %s", channel.rank, channel.world_size, kwargs.get("model_path"))
    while True:
        method, kwargs, batch = channel.receive()
        if method.startswith("_") or not callable(getattr(host, method, None)):
            raise RuntimeError(f"rank {channel.rank}: unknown command {method!r}")
        run_follower(host, method, kwargs, batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="a data-parallel rank (1..N-1) of one model; rank 0 is its "
        "gRPC worker. The rank layout comes from MASTER_ADDR, MASTER_PORT, "
        "RANK and WORLD_SIZE in the environment."
    )
    parser.add_argument("--name", default="model-rank", help="appears in the log lines")
    args = parser.parse_args(argv)

    prepare_worker_process(args.name)
    try:
        serve_rank()
    except Exception:  # exit, so the launcher reports it rather than a rank hanging in a collective
        log.exception("rank %s failed", os.environ.get("RANK"))
        return 1
    return 0


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import ModelService

    def _serves(host: DataParallelModelHost) -> ModelService:
        return host


if __name__ == "__main__":
    sys.exit(main())
