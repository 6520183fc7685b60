"""A node kind of one's own, in one module: its parameters, its registry entry and its host.

`tests/fixtures/custom_kind.yaml` names it as `kind: support.kinds_example:CLIP` and nothing else in the
engine changes: validation reads the entry (parameters, model rule, phase), placement starts
the process it names (`clipper`), dispatch calls `ClipHost.run` there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal_graph.api.fields import cfg
from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kind import Call, Hosting, NodeKind


@dataclass(frozen=True)
class ClipParams:
    low: float = cfg(0.0, None, "lowest reward kept")
    high: float = cfg(1.0, None, "highest reward kept")


class ClipHost:
    """Runs in its own worker process; clamps a per-sequence key into [low, high]."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def run(self, batch: PackedBatch, in_key: str, out_key: str) -> tuple[PackedBatch, dict[str, float]]:
        values = batch[in_key].float()
        clipped = values.clamp(self.low, self.high)
        stats = {"clipped": float((clipped != values).sum())}
        return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: clipped.to(torch.float32)}), stats


CLIP = NodeKind(
    name="clip",
    params=ClipParams,
    model="forbidden",
    phase="generation",
    doc="clamps one per-sequence key into [low, high]",
    hosting=lambda node, spec: Hosting("clipper", node.name, "support.kinds_example:ClipHost"),
    host_args=lambda node, spec, info: {"low": node.params.low, "high": node.params.high},
    call=lambda node, spec: Call("run", {"in_key": node.reads[0], "out_key": node.writes[0]}),
)
