"""Advantage estimators on packed 1-D tensors (GRPO, RLOO, GAE, REINFORCE), and the advantage node.

Conventions (data/packed.py): per-token tensors share `cu_seqlens`; `loss_mask` marks the
tokens the policy generated. Only generated tokens are time steps of the MDP: prompt tokens
and tool/environment output inside a multi-turn response (loss_mask 0) are skipped by every
recursion *without* cutting it, so the "next" step of a generated token is the next generated
token of the same sequence. Every output is 0 on loss_mask-0 tokens.

No Python loop runs over tokens: recursions are done as a blocked reverse scan over response
positions, vectorised across all sequences at once (see `_segmented_discounted_sum`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from areal_graph.data.packed import PackedBatch, response_positions, token_seq_ids
from areal_graph.graph.kinds.functions import AdvantageParams
from areal_graph.nodes.ppo_loss import kl_penalty

_SCAN_BLOCK = 64  # positions per block of the reverse scan; discount**64 stays far from underflow


# --------------------------------------------------------------------------- per-sequence
def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    if group_ids.ndim != 1:
        raise ValueError(f"group_ids must be 1-D (one id per sequence), got shape {tuple(group_ids.shape)}")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def _check_rewards(rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
    if rewards.ndim != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be 1-D and the same length"
        )


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages: (r - mean of its group) [/ (std of its group + eps)].

    The std is the POPULATION std (divide by G, not G - 1): it is defined for a group of one
    (giving advantage 0 rather than NaN) and it makes every group's advantages have exactly
    unit root-mean-square, whatever the group size. (TRL's GRPO uses the sample std; the two
    differ by a factor sqrt((G-1)/G), about 3% for G = 16.)
    Groups need not be contiguous; ids can be any integers.
    """
    _check_rewards(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    inv, n_groups = _group_index(group_ids)
    r = rewards.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, r) / count
    # A group whose rewards are all equal (or of one answer) carries no signal: exactly 0, also
    # with eps = 0. Decided by comparing the rewards themselves: the mean of equal floats can
    # round (0.1 x 3), leaving a centred value and a std of ~1e-17 that would divide to +-1.
    lo = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce_(0, inv, r, "amin")
    hi = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, inv, r, "amax")
    uniform = (lo == hi)[inv]
    centred = torch.where(uniform, torch.zeros_like(r), r - mean[inv])
    if std_normalize:
        var = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, centred**2) / count
        std = var.sqrt()[inv]
        centred = torch.where(uniform, centred, centred / (std + eps))
    return centred.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - mean of the OTHER answers in its group (unbiased baseline).

    A group of one has no other answer to compare with and gets advantage 0.
    """
    _check_rewards(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    inv, n_groups = _group_index(group_ids)
    r = rewards.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, torch.ones_like(r))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, r)
    g = count[inv]
    others_mean = (total[inv] - r) / (g - 1).clamp_min(1.0)
    adv = torch.where(g > 1, r - others_mean, torch.zeros_like(r))
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


# --------------------------------------------------------------------------- packed helpers
def _check_tokens(loss_mask: torch.Tensor, cu_seqlens: torch.Tensor, **tensors: torch.Tensor) -> None:
    if loss_mask.ndim != 1:
        raise ValueError(f"loss_mask must be 1-D, got shape {tuple(loss_mask.shape)}")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 1 or int(cu_seqlens[-1]) != loss_mask.numel():
        raise ValueError(
            f"cu_seqlens (ending at {int(cu_seqlens[-1]) if cu_seqlens.numel() else None}) does not match "
            f"loss_mask with {loss_mask.numel()} tokens"
        )
    for name, t in tensors.items():
        if t.shape != loss_mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(loss_mask.shape)} like loss_mask")


def broadcast_to_tokens(per_seq: torch.Tensor, loss_mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Each sequence's value on its generated tokens, 0 elsewhere."""
    _check_tokens(loss_mask, cu_seqlens)
    if per_seq.shape != (cu_seqlens.numel() - 1,):
        raise ValueError(f"per_seq has shape {tuple(per_seq.shape)}, expected ({cu_seqlens.numel() - 1},)")
    out = per_seq[token_seq_ids(cu_seqlens, loss_mask.numel())]
    return torch.where(loss_mask != 0, out, torch.zeros_like(out))


def _generated_grid(loss_mask: torch.Tensor, cu_seqlens: torch.Tensor):
    """Where each generated token goes in a [num_seqs, max_generated] grid.

    Returns (token_index, row, col, n_seq, width): the packed indices of the generated tokens
    and their (sequence, rank among the sequence's generated tokens) coordinates. Laying the
    generated tokens out this way drops the loss_mask-0 spans and makes "next generated token
    of the same sequence" simply the next column.
    """
    mask = loss_mask != 0
    n_seq = cu_seqlens.numel() - 1
    token_index = torch.nonzero(mask, as_tuple=False).flatten()
    row = token_seq_ids(cu_seqlens, loss_mask.numel())[token_index]
    col = response_positions(loss_mask, cu_seqlens)[token_index]
    width = int(col.max()) + 1 if col.numel() else 0
    return token_index, row, col, n_seq, width


def _reverse_discounted_scan(x: torch.Tensor, discount: float) -> torch.Tensor:
    """y[:, j] = x[:, j] + discount * y[:, j+1] along the last dim, y past the end = 0.

    Blocked: inside a block of B columns the recursion is a matrix product with the upper
    triangular matrix of discount powers; one carry per row links consecutive blocks. That is
    width / B Python steps instead of width, and keeps powers bounded by discount**B.
    """
    n, width = x.shape
    out = torch.zeros_like(x)
    if width == 0:
        return out
    b = min(_SCAN_BLOCK, width)
    idx = torch.arange(b, dtype=x.dtype)
    expo = idx[None, :] - idx[:, None]  # expo[i, j] = j - i
    tri = torch.where(
        expo >= 0, torch.tensor(discount, dtype=x.dtype) ** expo.clamp_min(0), torch.zeros((), dtype=x.dtype)
    )
    d = torch.tensor(discount, dtype=x.dtype)
    carry = torch.zeros(n, dtype=x.dtype)
    for end in range(width, 0, -b):
        start = max(0, end - b)
        k = end - start
        # y_i = sum_{j >= i} d^(j-i) x_j + d^(k-i) * carry   (carry = y at the next block's first column)
        y = x[:, start:end] @ tri[:k, :k].T + carry[:, None] * (d ** (k - idx[:k]))[None, :]
        out[:, start:end] = y
        carry = y[:, 0]
    return out


def _segmented_discounted_sum(
    values: torch.Tensor, loss_mask: torch.Tensor, cu_seqlens: torch.Tensor, discount: float
) -> torch.Tensor:
    """Over each sequence's generated tokens, s_t = v_t + discount * s_next (0 after the last)."""
    token_index, row, col, n_seq, width = _generated_grid(loss_mask, cu_seqlens)
    grid = torch.zeros(n_seq, width, dtype=torch.float64)
    grid[row, col] = values[token_index].to(torch.float64)
    scanned = _reverse_discounted_scan(grid, discount)
    out = torch.zeros(loss_mask.numel(), dtype=torch.float64)
    out[token_index] = scanned[row, col]
    return out


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.float32


# --------------------------------------------------------------------------- per-token estimators
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the generated tokens of packed sequences.

    delta_t = r_t + gamma * V_next - V_t and A_t = delta_t + gamma * lam * A_next, where
    "next" is the next generated token of the same sequence (loss_mask-0 spans are skipped,
    not treated as episode ends) and V after the last generated token is 0 (terminal).
    Rewards and values on loss_mask-0 tokens are ignored (put a tool step's reward on a
    generated token). Returns (advantages, returns = advantages + values), both 0 on
    loss_mask-0 tokens.
    Computed in float64 and cast back to the dtype of `values`.
    """
    _check_tokens(loss_mask, cu_seqlens, token_rewards=token_rewards, values=values)
    token_index, row, col, n_seq, width = _generated_grid(loss_mask, cu_seqlens)
    r = torch.zeros(n_seq, width, dtype=torch.float64)
    v = torch.zeros(n_seq, width, dtype=torch.float64)
    r[row, col] = token_rewards[token_index].to(torch.float64)
    v[row, col] = values[token_index].to(torch.float64)
    v_next = torch.zeros_like(v)
    v_next[:, :-1] = v[:, 1:]  # padding past a sequence's last generated token is 0: terminal value
    delta = r + gamma * v_next - v
    adv_grid = _reverse_discounted_scan(delta, gamma * lam)
    dtype = _float_dtype(values)
    adv = torch.zeros(loss_mask.numel(), dtype=torch.float64)
    adv[token_index] = adv_grid[row, col]
    ret = torch.zeros_like(adv)
    ret[token_index] = adv_grid[row, col] + v[row, col]
    return adv.to(dtype), ret.to(dtype)


def reinforce_returns(
    token_rewards: torch.Tensor, loss_mask: torch.Tensor, cu_seqlens: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """Discounted reward-to-go G_t = r_t + gamma * G_next over generated tokens (0 elsewhere)."""
    _check_tokens(loss_mask, cu_seqlens, token_rewards=token_rewards)
    return _segmented_discounted_sum(token_rewards, loss_mask, cu_seqlens, gamma).to(_float_dtype(token_rewards))


def outcome_token_rewards(
    seq_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards: the sequence's outcome reward on its LAST generated token, minus
    kl_coef * kl on every generated token. A sequence with no generated token gets nothing
    (there is no action to credit)."""
    _check_tokens(loss_mask, cu_seqlens)
    n_seq = cu_seqlens.numel() - 1
    if seq_rewards.shape != (n_seq,):
        raise ValueError(f"seq_rewards has shape {tuple(seq_rewards.shape)}, expected ({n_seq},)")
    dtype = _float_dtype(seq_rewards)
    mask = loss_mask != 0
    out = torch.zeros(loss_mask.numel(), dtype=dtype)
    token_index, row, col, _, _ = _generated_grid(loss_mask, cu_seqlens)
    if token_index.numel():
        # the last generated token of a sequence is the one with the largest column in its row
        last = torch.full((n_seq,), -1, dtype=torch.int64).scatter_reduce(0, row, token_index, reduce="amax")
        has = last >= 0
        out[last[has]] = seq_rewards[has].to(dtype)
    if kl is not None and kl_coef:
        if kl.shape != loss_mask.shape:
            raise ValueError(f"kl has shape {tuple(kl.shape)}, expected {tuple(loss_mask.shape)}")
        out = out - kl_coef * torch.where(mask, kl.to(dtype), torch.zeros_like(out))
    return out


def normalize_advantages(adv: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(adv - mean) / (std + eps) with mean and POPULATION std over generated tokens of the
    whole batch; 0 on loss_mask-0 tokens. Do it on the full batch, before micro-batching."""
    if adv.shape != loss_mask.shape:
        raise ValueError(f"adv has shape {tuple(adv.shape)}, expected {tuple(loss_mask.shape)}")
    mask = loss_mask != 0
    n = int(mask.sum())
    if n == 0:
        return torch.zeros_like(adv)
    a = adv.to(torch.float64)
    sel = a[mask]
    mean = sel.mean()
    std = ((sel - mean) ** 2).mean().sqrt()
    out = torch.where(mask, (a - mean) / (std + eps), torch.zeros_like(a))
    return out.to(adv.dtype)


def seat_group_ids(group_ids: torch.Tensor, seats: Sequence[int]) -> torch.Tensor:
    """Group ids that keep each (prompt group, seat) pair apart: a baseline per seat of a group.

    Why: in a two-player game the seats' rewards are not exchangeable (in a zero-sum game their
    means are opposite; the first mover wins more often), so one baseline over both credits a seat
    for where it sat rather than for how it played (SPIRAL's role-conditioned advantages)."""
    if len(seats) != group_ids.numel():
        raise ValueError(f"{len(seats)} seats for {group_ids.numel()} sequences")
    pairs = torch.stack([group_ids.to(torch.int64), torch.as_tensor(list(seats), dtype=torch.int64)], dim=1)
    _, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    return inverse


def seats_of(batch: PackedBatch) -> list[int]:
    """Each sequence's `info["seat"]`, or an error naming what writes it."""
    infos = batch.meta.get("info") if "info" in batch.meta else None
    if infos is None:
        raise KeyError("advantage node: baseline 'seat' needs the trajectories' info (the batch has none)")
    seats = []
    for i, raw in enumerate(infos):
        seat = (json.loads(raw) if isinstance(raw, str) else (raw or {})).get("seat")
        if not isinstance(seat, int) or isinstance(seat, bool):
            raise ValueError(
                f"advantage node: baseline 'seat' needs info['seat'] (an integer) on every trajectory; "
                f"sequence {i} has {seat!r} (TextArenaSelfPlay writes it; a single-seat rollout does not)"
            )
        seats.append(seat)
    return seats


# --------------------------------------------------------------------------- the advantage node
def advantage_node(batch: PackedBatch, **params: Any) -> PackedBatch:
    """The advantage kind's function (run by the controller): `compute_advantages` with the node's params."""
    return compute_advantages(AdvantageParams(**params), batch)


def compute_advantages(params: AdvantageParams, batch: PackedBatch) -> PackedBatch:
    """Return a batch holding `advantages` (and `returns` for GAE), same sequences as `batch`."""
    mask = batch["loss_mask"].to(torch.float32)
    cu = batch.cu_seqlens
    rewards = batch["rewards"].to(torch.float32)

    kl = None
    if params.kl_coef:
        if "ref_logprobs" not in batch:
            raise KeyError("advantage node: kl_coef > 0 needs ref_logprobs (add a ref logprob node)")
        policy_lp = batch["prox_logprobs"] if "prox_logprobs" in batch else batch["behav_logprobs"]
        kl = kl_penalty(policy_lp, batch["ref_logprobs"], params.kl_estimator) * mask

    out: dict[str, torch.Tensor] = {}
    if params.estimator in ("grpo", "rloo"):
        groups = batch["group_id"]
        if params.baseline == "seat":
            groups = seat_group_ids(groups, seats_of(batch))
        if params.estimator == "grpo":
            seq_adv = grpo_advantages(rewards, groups, std_normalize=params.group_std)
        else:
            seq_adv = rloo_advantages(rewards, groups)
        # The group baseline acts on the outcome; a KL penalty (if any) is per token, so the
        # advantage of a token is its baselined outcome minus the KL still to come after it.
        token_rewards = outcome_token_rewards(seq_adv, mask, cu, kl=kl, kl_coef=params.kl_coef)
        adv = reinforce_returns(token_rewards, mask, cu, gamma=params.gamma)
    elif params.estimator == "reinforce":
        token_rewards = outcome_token_rewards(rewards, mask, cu, kl=kl, kl_coef=params.kl_coef)
        adv = reinforce_returns(token_rewards, mask, cu, gamma=params.gamma)
    elif params.estimator == "gae":
        if "values" not in batch:
            raise KeyError("advantage node: estimator gae needs values (add a value node with a critic)")
        token_rewards = outcome_token_rewards(rewards, mask, cu, kl=kl, kl_coef=params.kl_coef)
        adv, returns = gae(token_rewards, batch["values"].float(), mask, cu, params.gamma, params.lam)
        out["returns"] = returns
    else:  # the spec validator rejects unknown estimators; this guards direct callers
        raise ValueError(f"unknown advantage estimator {params.estimator!r}")

    if params.normalize:
        adv = normalize_advantages(adv, mask)
    out["advantages"] = adv * mask
    return PackedBatch(cu.clone(), out)
