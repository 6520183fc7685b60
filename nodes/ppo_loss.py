"""Policy and value losses on packed 1-D tensors, and their batch-split-invariant aggregation.

The decoupled PPO objective (AReaL, Fu et al. 2025) separates the two jobs the old policy
does in standard PPO: pi_prox anchors the trust region, pi_behav (the policy that actually
sampled each token, possibly several versions ago) is corrected for by importance weighting:

    r_t  = exp(logp_t - prox_t)                  trust-region ratio (gradient flows here)
    w_t  = exp(prox_t - behav_t)                 behaviour weight (no gradient)
    loss = -w_t * min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps_high) * A_t)

With prox == behav, w == 1 and this is standard PPO. pi_prox is the policy before this
step's first optimizer update, so with one update per step (ppo_minibatches 1, ppo_epochs 1)
r == 1 where the gradient is taken and the clip never binds: the objective is then the
w-weighted policy gradient, and the trust region acts only from the second update of a step
on. Standard PPO on stale data instead clips against pi_behav, which does bind (measured:
~2-3% of tokens at lr 1e-4, staleness 8). Everything is per token; `aggregate`
turns per-token losses into a scalar whose sum over micro-batches is the full-batch loss,
because the normaliser is computed once over the whole batch (`loss_normalizer`).

Two more policy losses share the decoupled split of pi_prox (trust region) and pi_behav
(weight w): GSPO (`gspo_loss`: the ratio and its clip per sequence) and CISPO (`cispo_loss`:
the importance weight clipped and held constant, every token keeping its gradient). How w
itself is bounded (truncated, masked, IcePop) is nodes/off_policy.py's job: the losses take
the corrected weight as given.

Alignment: every per-token tensor follows data/packed.py (position t scores token t;
`loss_mask` marks generated tokens).
"""

from __future__ import annotations

from typing import Literal

import torch

from areal_graph.data.packed import token_seq_ids

AggMode = Literal["token-mean", "seq-mean-token-mean", "dr-grpo"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "dr-grpo")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"per-token tensors must share one shape, got {shapes}")
    for name, t in tensors.items():
        if t.ndim != 1:
            raise ValueError(f"{name} must be a packed 1-D tensor, got shape {tuple(t.shape)}")


# --------------------------------------------------------------------------- policy loss
def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    behav_imp_cap: float | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token decoupled PPO loss (zero where masked) and per-token diagnostics.

    `eps_high` (default: `clip_eps`) is the upper clip bound ("clip-higher", DAPO).
    `dual_clip` = c > 1 bounds the loss of negative-advantage tokens at -w*c*A (Ye et al.
    2020), so a huge ratio on a bad token cannot blow up the update. Tokens whose behaviour
    weight exceeds `behav_imp_cap` are dropped from the loss (None disables the cap).
    `weight`, when given, is the behaviour weight to train with in place of w (an off-policy
    correction of w, nodes/off_policy.py `corrected_weight`); the stats still report w.

    Stats (per-token tensors, detached): `ratio` r, `behav_weight` w, `clipped` (the clipped
    branch of the min was taken), `dual_clipped`, `capped_out`.
    """
    _check_same_shape(
        logprobs=logprobs,
        prox_logprobs=prox_logprobs,
        behav_logprobs=behav_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    eps_high = _check_clip(clip_eps, eps_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if behav_imp_cap is not None and behav_imp_cap <= 0:
        raise ValueError(f"behav_imp_cap must be > 0 (or None), got {behav_imp_cap}")

    mask = loss_mask != 0
    prox = prox_logprobs.detach()
    adv = advantages.detach()
    # Zero the log-ratio outside the mask so that prompt positions (log-prob 0 by convention,
    # or junk) can never produce inf/NaN that would leak into gradients through 0 * inf.
    log_ratio = torch.where(mask, logprobs - prox, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    behav_w = torch.exp(torch.where(mask, prox - behav_logprobs.detach(), torch.zeros_like(prox)))

    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * adv
    pg = torch.maximum(unclipped, clipped)  # == -min(r*A, clip(r)*A)
    clip_used = clipped > unclipped

    dual_used = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual_used = (adv < 0) & (pg > bound)
        pg = torch.where(dual_used, bound, pg)

    capped_out = torch.zeros_like(mask)
    if behav_imp_cap is not None:
        capped_out = mask & (behav_w > behav_imp_cap)
    keep = mask & ~capped_out
    used_w = behav_w if weight is None else weight.detach()
    loss = torch.where(keep, used_w * pg, torch.zeros_like(pg))

    stats = {
        "ratio": ratio.detach(),
        "behav_weight": behav_w,
        "clipped": (clip_used & keep).detach(),
        "dual_clipped": (dual_used & keep).detach(),
        "capped_out": capped_out,
    }
    return loss, stats


def _check_clip(clip_eps: float, eps_high: float | None) -> float:
    if clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
    eps_high = clip_eps if eps_high is None else eps_high
    if eps_high <= 0:
        raise ValueError(f"eps_high must be > 0, got {eps_high}")
    return eps_high


def gspo_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    weight: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    clip_eps: float = 3e-4,
    eps_high: float | None = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GSPO loss (Zheng et al. 2025): the ratio and its clip are per *sequence*.

        s_i  = exp(mean_t (logp_t - prox_t))       over sequence i's trained tokens
        loss = -w_t * min(s_i A_t, clip(s_i, 1 - eps, 1 + eps_high) A_t)

    The length-normalised sequence ratio stays near 1 where token ratios scatter, which is why
    GSPO's clip range is ~1e-4, not 0.2 (the paper: 3e-4 / 4e-4). Every token of a sequence
    carries the same clipped term, so with `agg: seq-mean-token-mean` the batch loss is GSPO's
    mean over sequences; `w_t` is the (corrected) behaviour weight pi_prox / pi_behav of the
    decoupled objective, 1 when nothing is stale or mismatched.
    Stats: `ratio` (s_i at each token), `clipped`.
    """
    _check_same_shape(
        logprobs=logprobs, prox_logprobs=prox_logprobs, weight=weight, advantages=advantages, loss_mask=loss_mask
    )
    _check_packed(loss_mask, cu_seqlens)
    eps_high = _check_clip(clip_eps, eps_high)
    mask = loss_mask != 0
    ids = token_seq_ids(cu_seqlens, logprobs.numel())
    log_ratio = torch.where(mask, logprobs - prox_logprobs.detach(), torch.zeros_like(logprobs))
    n_seq = cu_seqlens.numel() - 1
    count = _tokens_per_seq(loss_mask, cu_seqlens).to(logprobs.dtype).clamp_min(1.0)
    seq_log_ratio = (
        torch.zeros(n_seq, dtype=logprobs.dtype, device=logprobs.device).index_add(0, ids, log_ratio) / count
    )
    ratio = torch.exp(seq_log_ratio)[ids]
    adv = advantages.detach()
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * adv
    pg = torch.maximum(unclipped, clipped)
    loss = torch.where(mask, weight.detach() * pg, torch.zeros_like(pg))
    return loss, {"ratio": ratio.detach(), "clipped": ((clipped > unclipped) & mask).detach()}


def cispo_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    weight: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_eps: float = 1.0,
    eps_high: float | None = 4.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token CISPO loss (MiniMax-M1, 2025): clip the importance weight, not the update.

        loss = -w_t * sg(clip(r_t, 1 - eps, 1 + eps_high)) * A_t * logp_t,   r_t = exp(logp_t - prox_t)

    PPO's clip zeroes the gradient of a token whose ratio left the range, so rare tokens that
    matter (a "wait" before a correction) stop learning after one update; CISPO keeps every
    token's policy gradient and only bounds how much its weight can grow. The paper sets no
    lower bound (here: clip_eps >= 1) and tunes the upper one. The loss's *value* carries
    log-probs; only its gradient, -w * clip(r) * A * grad logp, means anything.
    Stats: `ratio` r, `clipped` (the weight was clipped).
    """
    _check_same_shape(
        logprobs=logprobs, prox_logprobs=prox_logprobs, weight=weight, advantages=advantages, loss_mask=loss_mask
    )
    eps_high = _check_clip(clip_eps, eps_high)
    mask = loss_mask != 0
    ratio = torch.exp(torch.where(mask, logprobs.detach() - prox_logprobs.detach(), torch.zeros_like(logprobs)))
    coef = torch.clamp(ratio, min=max(1.0 - clip_eps, 0.0), max=1.0 + eps_high)
    safe_lp = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    loss = torch.where(mask, -(weight.detach() * coef * advantages.detach()) * safe_lp, torch.zeros_like(logprobs))
    return loss, {"ratio": ratio, "clipped": (mask & (coef != ratio)).detach()}


# --------------------------------------------------------------------------- aggregation
def _tokens_per_seq(loss_mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    n_seq = cu_seqlens.numel() - 1
    ids = token_seq_ids(cu_seqlens, loss_mask.numel())
    return torch.zeros(n_seq, dtype=torch.float64, device=loss_mask.device).index_add_(
        0, ids, (loss_mask != 0).to(torch.float64)
    )


def _check_packed(loss_mask: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 1:
        raise ValueError("cu_seqlens must be a 1-D tensor of n+1 offsets")
    if int(cu_seqlens[-1]) != loss_mask.numel():
        raise ValueError(f"cu_seqlens ends at {int(cu_seqlens[-1])} but loss_mask has {loss_mask.numel()} tokens")


def loss_normalizer(
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    mode: AggMode = "token-mean",
    max_tokens: int | None = None,
) -> float:
    """The denominator of the batch loss, computed once from the WHOLE batch.

    Computing it per micro-batch would weight tokens differently depending on how the
    planner split the batch; computing it here makes the split irrelevant.

    - token-mean: number of generated tokens.
    - seq-mean-token-mean: number of sequences with at least one generated token (a sequence
      with none contributes nothing to the numerator, so it must not dilute the mean).
    - dr-grpo: num_seqs * max_tokens (Dr.GRPO's constant); `max_tokens` should be the
      generation budget (max_new_tokens); None uses the longest response in the batch.
    Never returns less than 1, so an all-masked batch gives a zero loss rather than NaN.
    """
    _check_packed(loss_mask, cu_seqlens)
    per_seq = _tokens_per_seq(loss_mask, cu_seqlens)
    if mode == "token-mean":
        value = float(per_seq.sum())
    elif mode == "seq-mean-token-mean":
        value = float((per_seq > 0).sum())
    elif mode == "dr-grpo":
        if max_tokens is None:
            max_tokens = int(per_seq.max()) if per_seq.numel() else 0
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        value = float(per_seq.numel() * max_tokens)
    else:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
    return max(value, 1.0)


def aggregate(
    per_token: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    mode: AggMode,
    normalizer: float,
) -> torch.Tensor:
    """This micro-batch's share of the batch loss: summing it over micro-batches (made of whole
    sequences) gives the full-batch loss. `normalizer` comes from `loss_normalizer` on the batch."""
    _check_packed(loss_mask, cu_seqlens)
    if per_token.shape != loss_mask.shape:
        raise ValueError(f"per_token shape {tuple(per_token.shape)} != loss_mask shape {tuple(loss_mask.shape)}")
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    mask = loss_mask != 0
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))
    if mode in ("token-mean", "dr-grpo"):
        return masked.sum() / normalizer
    if mode == "seq-mean-token-mean":
        n_seq = cu_seqlens.numel() - 1
        ids = token_seq_ids(cu_seqlens, per_token.numel())
        seq_sum = torch.zeros(n_seq, dtype=per_token.dtype, device=per_token.device).index_add(0, ids, masked)
        counts = _tokens_per_seq(loss_mask, cu_seqlens).to(per_token.dtype).clamp_min(1.0)
        return (seq_sum / counts).sum() / normalizer
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")


# --------------------------------------------------------------------------- value loss, KL
def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    clip: float | None,
) -> torch.Tensor:
    """Per-token clipped value loss, 0.5 * max((V - R)^2, (V_clip - R)^2), zero where masked.

    V_clip = V_old + clamp(V - V_old, -clip, clip) keeps the critic near its old estimate, as
    PPO does for the policy; `clip=None` gives the plain squared error.
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, loss_mask=loss_mask)
    mask = loss_mask != 0
    err = (values - returns) ** 2
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"value clip must be > 0 (or None), got {clip}")
        old = old_values.detach()
        v_clip = old + torch.clamp(values - old, -clip, clip)
        err = torch.maximum(err, (v_clip - returns) ** 2)
    return torch.where(mask, 0.5 * err, torch.zeros_like(err))


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman, "Approximating KL").

    With log r = ref - logp: k1 = -log r (unbiased, high variance, can be negative),
    k2 = 0.5 (log r)^2 (biased, low variance), k3 = (r - 1) - log r (unbiased, always >= 0).
    Callers multiply by loss_mask: prompt positions are meaningless.
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
