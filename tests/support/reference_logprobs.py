"""Log-probs to compare the engines against: each sequence alone in float64 (the independent
reference), and the HF path's packed scoring of a whole batch."""

from __future__ import annotations

import copy

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.packed_scoring import ROW_TOKENS, row_forwards, rows_logprobs


def naive_logprobs(model, batch: PackedBatch, temperature: float = 1.0, entropy: bool = False):
    """Each sequence alone, in float64, token by token: the independent reference.
    Returns log-probs, and with `entropy` also the entropy of each predicted distribution."""
    m = copy.deepcopy(model).double()
    out, ent = [], []
    with torch.no_grad():
        for i in range(batch.num_seqs):
            ids = batch.sequence(i, "input_ids").unsqueeze(0)
            logits = m(input_ids=ids, use_cache=False).logits[0] / temperature
            lp = torch.log_softmax(logits, -1)
            out.extend([0.0] + [float(lp[t - 1, ids[0, t]]) for t in range(1, ids.shape[1])])
            ent.extend([0.0] + [-sum(float(p.exp() * p) for p in lp[t - 1]) for t in range(1, ids.shape[1])])
    lp_t = torch.tensor(out, dtype=torch.float64)
    return (lp_t, torch.tensor(ent, dtype=torch.float64)) if entropy else lp_t


def packed_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    row_tokens: int = ROW_TOKENS,
    with_entropy: bool = False,
    temperature: float = 1.0,
):
    """The HF path's scoring of a whole batch as TrainEngine runs it per micro-batch:
    `rows_logprobs` over the forwards of `row_forwards`, each token written by exactly one."""
    parts = [
        rows_logprobs(model, batch, rows, with_entropy, temperature)
        for rows in row_forwards(batch.seqlens().tolist(), row_tokens)
    ]
    if not parts:
        return rows_logprobs(model, batch, [], with_entropy, temperature)
    return sum(p[0] for p in parts), (sum(p[1] for p in parts) if with_entropy else None)
