"""Off-policy corrections of the behaviour weight, and the train/inference mismatch they correct.

Every policy loss here weights token t by w_t = pi_prox(t) / pi_behav(t): pi_behav is what the
inference engine reported when it sampled the token (possibly several versions ago), pi_prox
is the trainer's log-prob of the same token under the weights of this step. Two things make w
differ from 1, and a user needs to tell them apart:

- staleness: the token was sampled by an older policy version (asynchronous RL, eta > 0);
- numerics: engine and trainer compute the same policy differently (kernels, batch shapes,
  precision). At staleness 0 this is all there is, and it should be near float rounding.

Peers (verl, slime, SkyRL, NeMo-RL, prime-rl, AReaL) bound w in four ways, all here as pure
functions on packed 1-D tensors (data/packed.py layout; `mask` marks the tokens trained):

- `tis`        token-level truncated IS: weight min(w, high); every token stays (Yao et al. 2025).
- `token_mask` token-level masked IS (rejection): tokens with w outside [low, high] leave the
               loss *and its normaliser*; the rest keep weight w (verl's rollout rejection,
               slime #657: a rejected token must not dilute the mean).
- `seq_mask`   sequence-level masked IS on the geometric mean of w over the sequence's tokens:
               a sequence outside [low, high] leaves the loss whole (verl's geometric mask).
- `icepop`     IcePop (Ring-1T): tokens with w outside [low, high] get zero gradient but stay in
               the normaliser, as in IcePop's objective; the rest keep weight w.

Rejection (`token_mask`, `seq_mask`) is decided on the whole batch before the step, because
the normaliser is computed once for the batch (ppo_loss.loss_normalizer); that needs
pi_prox before the step, so these two modes do not fuse the proximal forward into training.
All bounds are compared in log space: exp of a large log-weight never overflows a decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from areal_graph.api.corrections import DEFAULT_BOUNDS, ISCorrection
from areal_graph.data.packed import response_positions, token_seq_ids


def behaviour_log_weight(prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log w = log pi_prox - log pi_behav where `mask`, 0 elsewhere (prompt log-probs are junk)."""
    return torch.where(mask != 0, prox.detach() - behav.detach(), torch.zeros_like(prox))


def _outside(log_w: torch.Tensor, low: float | None, high: float) -> torch.Tensor:
    out = log_w > math.log(high)
    if low is not None:
        out = out | (log_w < math.log(low))
    return out


def seq_mean_log_weight(log_w: torch.Tensor, mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per sequence, the mean of log w over its masked tokens: the log of their geometric mean
    weight (0 for a sequence with no such token)."""
    ids = token_seq_ids(cu_seqlens, log_w.numel())
    n_seq = cu_seqlens.numel() - 1
    m = (mask != 0).to(torch.float64)
    total = torch.zeros(n_seq, dtype=torch.float64, device=log_w.device).index_add_(0, ids, log_w.double() * m)
    count = torch.zeros(n_seq, dtype=torch.float64, device=log_w.device).index_add_(0, ids, m)
    return total / count.clamp_min(1.0)


def accepted_tokens(
    corr: ISCorrection, log_w: torch.Tensor, mask: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Tokens of `mask` that a rejecting correction keeps (all of `mask` for the others)."""
    keep = mask != 0
    if corr.mode == "token_mask":
        return keep & ~_outside(log_w, *corr.bounds())
    if corr.mode == "seq_mask":
        seq_out = _outside(seq_mean_log_weight(log_w, mask, cu_seqlens), *corr.bounds())
        return keep & ~seq_out[token_seq_ids(cu_seqlens, log_w.numel())]
    return keep


def corrected_weight(corr: ISCorrection, log_w: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, affected): the behaviour weight each token of `mask` is trained with, 0 elsewhere,
    and the tokens the in-loss correction changed (truncated by `tis`, zeroed by `icepop`).

    Rejecting modes were applied to `mask` already (`accepted_tokens`): here they keep w."""
    keep = mask != 0
    w = torch.where(keep, torch.exp(log_w), torch.zeros_like(log_w))
    affected = torch.zeros_like(keep)
    if corr.mode == "tis":
        cap = corr.upper()
        affected = keep & (log_w > math.log(cap))
        w = torch.where(affected, torch.full_like(w, cap), w)
    elif corr.mode == "icepop":
        affected = keep & _outside(log_w, *corr.bounds())
        w = torch.where(affected, torch.zeros_like(w), w)
    return w, affected


# --------------------------------------------------------------------------- the mismatch, measured
@dataclass(frozen=True)
class MismatchGroups:
    """Which trained tokens are fresh (sampled by the weights being trained, staleness 0) and
    which stale, with the whole batch's counts: every stat a micro-batch returns is its share of
    a batch-level mean, so that the engine's sum over micro-batches is the batch's mean."""

    n_tokens: dict[str, float]  # group -> trained tokens in the whole batch (at least 1)
    n_seqs: dict[str, float]  # group -> sequences with a trained token in the group


POSITION_BUCKETS: tuple[tuple[int, int], ...] = ((0, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 1 << 30))


def bucket_name(lo: int, hi: int) -> str:
    return f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi - 1}"


def staleness_groups(
    mask: torch.Tensor, versions: torch.Tensor | None, policy_version: int | None
) -> dict[str, torch.Tensor]:
    """group -> its tokens among `mask`: "all", and with versions "fresh" (0) and "stale" (> 0)."""
    keep = mask != 0
    groups = {"all": keep}
    if versions is not None and policy_version is not None:
        stale = (policy_version - versions.to(torch.int64)) > 0
        groups.update(fresh=keep & ~stale, stale=keep & stale)
    return groups


def mismatch_groups(
    mask: torch.Tensor, cu_seqlens: torch.Tensor, versions: torch.Tensor | None, policy_version: int | None
) -> MismatchGroups:
    ids = token_seq_ids(cu_seqlens, mask.numel())
    n_seq = cu_seqlens.numel() - 1
    tokens, seqs = {}, {}
    for name, sel in staleness_groups(mask, versions, policy_version).items():
        tokens[name] = max(float(sel.sum()), 1.0)
        has = torch.zeros(n_seq, dtype=torch.bool, device=mask.device).index_fill_(0, ids[sel], True)
        seqs[name] = max(float(has.sum()), 1.0)
    return MismatchGroups(tokens, seqs)


def mismatch_stats(
    log_w: torch.Tensor,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    versions: torch.Tensor | None,
    policy_version: int | None,
    totals: MismatchGroups,
) -> dict[str, float]:
    """This micro-batch's share of the batch's mismatch stats (keys `mismatch/<group>/<stat>`).

    Per group: `abs_mean` and `abs_max` of |log pi_prox - log pi_behav|, `k3` (the k3 estimate
    of KL(pi_behav || pi_prox), >= 0), `share` of the batch's trained tokens, and for each
    correction at its default bounds the share of tokens it would touch (`past_<mode>`; for
    `seq_mask` the share of sequences). Then `mismatch/pos/<bucket>/abs_mean` by position in
    the response. Keys ending in `_max` combine by max, the others by sum."""
    lw = log_w.double()
    k3 = torch.expm1(lw) - lw
    seq_out = _outside(seq_mean_log_weight(log_w, mask, cu_seqlens), *DEFAULT_BOUNDS["seq_mask"])
    ids = token_seq_ids(cu_seqlens, mask.numel())
    out: dict[str, float] = {}
    rows: list[torch.Tensor] = []
    names: list[str] = []
    for name, sel in staleness_groups(mask, versions, policy_version).items():
        n, f = totals.n_tokens[name], sel.double()
        has = torch.zeros(seq_out.numel(), dtype=torch.bool, device=mask.device).index_fill_(0, ids[sel], True)
        rows += [
            (lw.abs() * f).sum() / n,
            (k3 * f).sum() / n,
            f.sum() / totals.n_tokens["all"],
            (_outside(lw, None, DEFAULT_BOUNDS["tis"][1]) & sel).double().sum() / n,
            (_outside(lw, *DEFAULT_BOUNDS["token_mask"]) & sel).double().sum() / n,
            (_outside(lw, *DEFAULT_BOUNDS["icepop"]) & sel).double().sum() / n,
            (seq_out & has).double().sum() / totals.n_seqs[name],
        ]
        names += [
            f"mismatch/{name}/{s}"
            for s in ("abs_mean", "k3", "share", "past_tis", "past_token_mask", "past_icepop", "past_seq_mask")
        ]
        rows.append(torch.where(sel, lw.abs(), torch.zeros_like(lw)).max() if sel.any() else lw.new_zeros(()))
        names.append(f"mismatch/{name}/abs_max")
    pos = response_positions(mask, cu_seqlens)
    keep = mask != 0
    for lo, hi in POSITION_BUCKETS:
        sel = keep & (pos >= lo) & (pos < hi)
        rows += [(lw.abs() * sel.double()).sum(), sel.double().sum()]
        names += [f"mismatch/pos/{bucket_name(lo, hi)}/abs_sum", f"mismatch/pos/{bucket_name(lo, hi)}/tokens"]
    out.update(zip(names, torch.stack(rows).tolist()))
    return out


def finish_mismatch_stats(stats: dict[str, float]) -> dict[str, float]:
    """Turn the summed `mismatch/pos/<bucket>/abs_sum` and `.../tokens` of a step into
    `mismatch/pos/<bucket>/abs_mean` (buckets with no token are left out)."""
    out = {k: v for k, v in stats.items() if not k.startswith("mismatch/pos/")}
    for lo, hi in POSITION_BUCKETS:
        name = bucket_name(lo, hi)
        n = stats.get(f"mismatch/pos/{name}/tokens", 0.0)
        if n > 0:
            out[f"mismatch/pos/{name}/abs_mean"] = stats[f"mismatch/pos/{name}/abs_sum"] / n
    return out
