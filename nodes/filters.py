"""Function nodes that drop prompt groups (`kind: function`, generation side).

A function node gets the packed batch of one prompt group on the generation side (or the
step's batch on the training side) holding its declared reads plus `group_id` and
`sample_id`, and returns the sequences it keeps: `batch.select(kept)`. Dropped groups are
counted in the run's metrics (`groups/dropped`, `<node>/groups_dropped_total`) and, on the
generation side, give their slot back to the staleness gate, so more prompts are generated
in their place and the bound stays exact.
"""

from __future__ import annotations

import torch

from areal_graph.data.packed import PackedBatch

ID_KEYS = ("group_id", "sample_id")


def _kept(batch: PackedBatch, keep_seq: torch.Tensor) -> PackedBatch:
    """The ids of the kept sequences (a filter writes no keys of its own)."""
    idx = torch.nonzero(keep_seq, as_tuple=False).flatten().tolist()
    return batch.select(idx).select_keys([k for k in ID_KEYS if k in batch.seqs])


def drop_uniform_groups(batch: PackedBatch, key: str = "rewards", tol: float = 1e-6) -> PackedBatch:
    """DAPO's dynamic sampling: drop every prompt group whose `key` values are all equal.

    Why: with group-normalised advantages (GRPO, RLOO) a group in which every answer got the
    same reward has advantage 0 everywhere; it costs a training slot and teaches nothing.
    Dropping it makes the generation side sample more prompts until B informative
    trajectories are buffered (Yu et al., 2025, "DAPO", section 3.2).
    """
    values = batch[key].float()
    groups = batch["group_id"]
    _, inv = torch.unique(groups, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    hi = torch.full((n,), float("-inf")).scatter_reduce(0, inv, values, "amax")
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inv, values, "amin")
    informative = (hi - lo) > tol
    return _kept(batch, informative[inv])
