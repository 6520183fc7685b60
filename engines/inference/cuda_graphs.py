"""The lean decode step replayed from CUDA graphs, one per batch-size bucket.

Why: on a GPU a decode step of a small model is a few milliseconds of kernels behind tens of
milliseconds of launching them. Measured on an H200 (benchmarks/bench_gpu.py, Qwen2-0.5B
shape, bf16): 1.7 ms of kernels in a 48 ms step at batch 1. A CUDA graph records the step's
~500 launches once and replays them as one, so the host cost no longer scales with layers.

How: a graph replays fixed shapes at fixed addresses, so
- the batch is padded up to a bucket (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, ..., max rows);
  padding rows attend only to the column they write, in buffer rows no request holds;
- attention reads every column of the KV buffers under a mask (`LeanForward.decode_static`)
  instead of a window sliced to this step's width, and the write column is a device tensor;
- the inputs (tokens, positions, each row's first column and write column) are copied into
  one static tensor before each replay, and the logits come out of a static one.
A graph stays valid while the KV buffers, the weights and the rotary table keep their
storage: weight updates copy in place, the cache keeps its buffers across `clear()` and the
table is built once for the longest context; when one moves (the cache grew), the graphs are
dropped and captured again on demand.

Capture runs the step once eagerly first (on the real inputs, so what it writes into the
KV buffers is what the replay writes again). If capture fails, the runner falls back to
the eager step and says so once in the log; `capture=False` runs the same static step
eagerly (how the CPU tests check the bucketing, masks and invalidation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.lean_forward import LeanForward

log = logging.getLogger(__name__)

__all__ = ["GraphedDecode", "buckets_for"]


def buckets_for(max_rows: int) -> list[int]:
    """Batch sizes graphs are captured for: powers of two, then steps of half the previous
    power (padding wastes at most a third), ending at `max_rows`."""
    out, b = [], 1
    while b < max_rows:
        out.append(b)
        b = b * 2 if b < 32 else b + b // 2 if (b & (b - 1)) == 0 else (b // 3) * 4
    return out + [max_rows]


@dataclass
class _Step:
    inputs: torch.Tensor  # [4 * B] int64: tokens, positions, first columns, write columns
    logits: torch.Tensor  # [B, V]: what a replay writes
    replay: Callable[[], Any]


class GraphedDecode:
    """Decode steps over a `BatchedKVCache` through captured graphs (see module docstring)."""

    def __init__(self, lean: LeanForward, max_rows: int, max_positions: int, capture: bool = True) -> None:
        self.lean = lean
        self.buckets = buckets_for(max_rows)
        self.max_positions = max_positions
        self.capture = capture
        self.captures = 0  # graphs captured so far (stats and tests)
        self._steps: dict[int, _Step] = {}
        self._key: tuple | None = None

    def _storage_key(self, cache: BatchedKVCache) -> tuple:
        """What the graphs' addresses depend on: the KV buffers and the weights."""
        weights = (
            self.lean.embed,
            self.lean.norm,
            self.lean.layers[0].q[0],
            self.lean.layers[-1].down[0],
            self.lean._cos,
            self.lean._sin,
        )
        return (
            tuple(t.data_ptr() for t in cache.keys + cache.values),
            tuple(cache.keys[0].shape),
            tuple(t.data_ptr() for t in weights),
        )

    def decode(self, last_tokens: list[int], cache: BatchedKVCache) -> torch.Tensor:
        """Logits [B, V] for one new token per row; writes the rows' keys and values and advances."""
        b = len(last_tokens)
        _, end = cache.decode_window(1)  # repacks first if column `end` does not exist
        self.lean.ensure_rope(self.max_positions)  # before the key: the table's storage is part of it
        key = self._storage_key(cache)
        if key != self._key:
            self._steps.clear()
            self._key = key
        bucket = next(x for x in self.buckets if x >= b)
        pad = bucket - b
        write = cache.write_columns()  # `end` for every row unless some lag after a verifying step
        host = torch.tensor(
            list(last_tokens)
            + [0] * pad
            + list(cache.lens)
            + [0] * pad
            + [c - n for c, n in zip(write, cache.lens)]
            + [end] * pad
            + write
            + [end] * pad,
            dtype=torch.int64,
        )
        step = self._steps.get(bucket)
        if step is None:
            step = self._steps[bucket] = self._make(bucket, cache, host)
        else:
            step.inputs.copy_(host, non_blocking=True)
            step.replay()
        cache.advance(1)
        return step.logits[:b]

    def _make(self, bucket: int, cache: BatchedKVCache, host: torch.Tensor) -> _Step:
        """Run the step once on `host` inputs (its result is this step's), then capture it."""
        device = cache.keys[0].device
        inputs = host.to(device)
        keys, values = list(cache.keys), list(cache.values)

        def run() -> torch.Tensor:
            tok, pos, lo, col = (
                inputs[:bucket],
                inputs[bucket : 2 * bucket],
                inputs[2 * bucket : 3 * bucket],
                inputs[3 * bucket :],
            )
            return self.lean.decode_static(tok, pos, lo, col, keys, values)

        if not self.capture:
            logits = run()
            step = _Step(inputs, logits, lambda: None)
            step.replay = lambda: step.logits.copy_(run())
            return step
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            run()  # warm-up outside the graph (kernel selection, workspace); writes the same KV values
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads may use CUDA meanwhile
            logits = run()
        graph.replay()
        self.captures += 1
        log.debug("captured the decode step for batch %d (%d captures)", bucket, self.captures)
        return _Step(inputs, logits, graph.replay)
