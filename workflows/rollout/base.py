"""Packing trajectories (the `Rollout` interface's output, api/rollout.py) into a PackedBatch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from areal_graph.api.episode import info_json
from areal_graph.api.rollout import Trajectory
from areal_graph.data.packed import PackedBatch

__all__ = ["pack_trajectories"]


def pack_trajectories(trajectories: Sequence[Trajectory]) -> PackedBatch:
    """Lay trajectories end to end as a PackedBatch (keys per data/packed.py).

    A rollout that counts tool calls (`info["tool_calls"]`, the tool agents) also gets the
    per-sequence key `tool_calls`: the controller logs the tool-call rate from it."""
    if not trajectories:
        raise ValueError("pack_trajectories needs at least one trajectory")
    batch = PackedBatch.from_sequences(
        tokens={
            "input_ids": [t.input_ids for t in trajectories],
            "loss_mask": [t.loss_mask for t in trajectories],
            "behav_logprobs": [t.behav_logprobs for t in trajectories],
            "versions": [t.versions for t in trajectories],
        },
        seqs={
            "group_id": [int(t.group_id) for t in trajectories],
            "sample_id": [int(t.sample_id) for t in trajectories],
            "seq_no_eos": [bool(t.no_eos) for t in trajectories],
        },
        meta={
            "answer": [str(t.answer) for t in trajectories],
            "info": [info_json(t.info, f"Trajectory.info of sample {t.sample_id}") for t in trajectories],
        },
        dtypes={
            "input_ids": torch.int64,
            "loss_mask": torch.int64,
            "behav_logprobs": torch.float32,
            "versions": torch.int64,
            "group_id": torch.int64,
            "sample_id": torch.int64,
            "seq_no_eos": torch.bool,
        },
    )
    if any("tool_calls" in t.info for t in trajectories):
        batch.seqs["tool_calls"] = torch.tensor(
            [int(t.info.get("tool_calls", 0)) for t in trajectories], dtype=torch.int64
        )
    return batch
