"""Function nodes that shape rewards: they read per-sequence keys and write a new one.

Each writes exactly one key; the function host passes the node's declared write as
`out_key` (so `writes: [rewards]` is all the YAML says about the output's name).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from areal_graph.data.packed import PackedBatch


def _response_lengths(batch: PackedBatch) -> torch.Tensor:
    mask = batch["loss_mask"].to(torch.float32)
    return torch.zeros(batch.num_seqs).index_add_(0, batch.seq_ids(), mask)


def overlong_penalty(
    batch: PackedBatch, out_key: str, max_tokens: int, buffer_tokens: int, penalty: float = 1.0
) -> PackedBatch:
    """DAPO's soft overlong punishment: 0 up to `max_tokens - buffer_tokens` generated tokens,
    then falling linearly to `-penalty` at `max_tokens` (and staying there beyond).

    Why soft: a hard penalty for truncated answers punishes sound reasoning that merely ran
    long; the ramp tells the policy to be brief before it hits the limit (Yu et al., 2025).
    Reads `loss_mask` (generated tokens are where it is 1).
    """
    if not 0 < buffer_tokens <= max_tokens:
        raise ValueError(f"need 0 < buffer_tokens <= max_tokens, got {buffer_tokens}, {max_tokens}")
    over = (_response_lengths(batch) - (max_tokens - buffer_tokens)).clamp(min=0.0)
    shaped = -penalty * (over / buffer_tokens).clamp(max=1.0)
    return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: shaped})


def weighted_sum(batch: PackedBatch, out_key: str, weights: Mapping[str, float]) -> PackedBatch:
    """`out_key` = sum of weight * key over per-sequence keys (several reward nodes combined)."""
    if not weights:
        raise ValueError("weighted_sum needs at least one key in `weights`")
    total = torch.zeros(batch.num_seqs)
    for key, w in weights.items():
        values = batch.seqs.get(key)
        if values is None:
            raise KeyError(f"weighted_sum: {key!r} is not a per-sequence key of the batch (declare it in `reads`)")
        total = total + float(w) * values.float()
    return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: total})
