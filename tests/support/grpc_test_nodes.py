"""Test-only implementations hosted by worker processes in the gRPC and launcher tests.

Importable in a worker because the tests put tests/ on the child's PYTHONPATH.
"""

from __future__ import annotations

import os
import signal

import torch

from areal_graph.data.packed import PackedBatch


class EchoNode:
    """Returns its input, optionally scaled, plus a key it computes, so tests can check values."""

    def __init__(self, scale: float = 1.0, label: str = "echo") -> None:
        self.scale = scale
        self.label = label
        self.version = 0

    def echo(self, batch: PackedBatch) -> PackedBatch:
        return batch

    def double(self, batch: PackedBatch, key: str, out_key: str) -> PackedBatch:
        out = (batch.tokens[key].to(torch.float64) * 2 * self.scale).to(torch.float32)
        return PackedBatch(batch.cu_seqlens.clone(), {out_key: out})

    def seq_sum(self, batch: PackedBatch, key: str) -> PackedBatch:
        sums = torch.tensor(
            [float(batch.sequence(i, key).to(torch.float64).sum()) for i in range(batch.num_seqs)], dtype=torch.float64
        )
        return PackedBatch(
            batch.cu_seqlens.clone(),
            seqs={"sum": sums},
            meta={"label": [f"{self.label}-{i}" for i in range(batch.num_seqs)]},
        )

    def sleep(self, batch: PackedBatch, seconds: float) -> PackedBatch:
        """Stands in for a long rollout call: blocks its server thread, not the others."""
        import time

        time.sleep(seconds)
        return batch

    def nothing(self, batch: PackedBatch) -> None:
        return None

    def fail(self, batch: PackedBatch, message: str = "boom") -> PackedBatch:
        raise ValueError(f"deliberate failure: {message}")

    def set_version(self, version: int) -> dict:
        self.version = version
        return {"version": self.version, "label": self.label}

    def crash_call(self) -> None:
        raise KeyError("no such weights")

    def pid(self) -> int:
        return os.getpid()

    def spawn_child(self) -> int:
        """Start a grandchild (sleep) so the tests can check shutdown kills the whole tree."""
        import subprocess

        p = subprocess.Popen(["sleep", "300"])
        return p.pid

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class BrokenInit:
    def __init__(self, **kwargs) -> None:
        raise RuntimeError("cannot build this node")
