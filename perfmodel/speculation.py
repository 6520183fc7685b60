"""Pricing speculative decoding: what a verifying step costs and what it emits, as pure functions.

The engine (engines/inference/speculation/) verifies a step's proposals in one forward: every
running row is fed its last token and, when it has one, its proposal d1..dk; the row emits 1 +
the accepted tokens (the longest prefix of the proposal that plain decoding would have emitted).
Pricing a run with speculation needs three things, all read off a calibration run WITHOUT it:

- **Acceptance**, by batch-size bucket (powers of two, as the engine's policy buckets): how
  often a row asked for a proposal has one (the draft store finds a suffix match), and per
  position j of a proposal the chance that d_j is accepted once d_1..d_(j-1) were. Both come
  from the run's shadow counts (engines/inference/speculation/shadow.py: the trace's
  `speculation_shadow` record, per bucket `tries`, `proposals`, `reached` and `accepted_at`),
  which count exactly what a verifying step would have accepted.
- **The cost of a verifying step**: the plain step of its rows plus what feeding the proposals
  adds: `verify_step_ms` (below) from the decode and prefill fits alone, or, where the run's
  model is on this machine, a fit of the engine's verifying step probed alone (costs.py
  `_probe_verify`: a fixed and a per-row part the prefill fit cannot know, `verify_fixed_ms`,
  and a per-token part, `verify_token_ms`).
- **The engine's choice per step**: `best_draft` (below), the steady state of its policy.

`Acceptance` keeps the raw counts, so buckets with few proposals can be pooled with their
neighbours (`Acceptance.at`) and servers' counts add up.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_graph.engines.inference.speculation.policy import bucket_of  # the engine's buckets, one definition
from areal_graph.perfmodel.fits import LinearFit

MIN_PROPOSALS = 40  # proposals a bucket's acceptance is read from at least (neighbours pooled until then)


class CannotPriceSpeculation(ValueError):
    """The cost model has no acceptance to price speculative decoding with."""


NO_ACCEPTANCE = (
    "the calibration has no shadow acceptance (no `speculation_shadow` record in its trace: a run "
    "older than shadow counting, one with inference.speculative.shadow_every: 0, or a cost model "
    "saved before speculation was priced), so the simulator cannot price speculative decoding; "
    "calibrate on a run of this version with speculation off"
)


@dataclass
class BucketAcceptance:
    """One bucket's (or a pool of buckets') acceptance: `rate` the share of rows asked that had a
    proposal, `positions[j]` the chance that a proposal's token j + 1 is accepted when every one
    before it was."""

    rate: float
    positions: list[float]
    proposals: int = 0
    buckets: list[int] = field(default_factory=list)

    def expected_accepted(self, k: int) -> float:
        """Accepted tokens expected of a proposal of `k` tokens (see `expected_accepted`)."""
        return expected_accepted(self.positions, k)


@dataclass
class Acceptance:
    """Shadow counts by batch-size bucket ("1", "2", "4", ...): each {"tries": rows asked for a
    proposal, "proposals": proposals resolved, "reached": [proposals whose position j + 1 was
    compared], "accepted_at": [of those, accepted]}. `max_draft`: the proposal length counted
    (the shadow proposes the longest the speculator may); `every`: one prompt in this many was
    counted; `source`: where the counts come from."""

    max_draft: int = 4
    every: int = 0
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = "speculation_shadow"

    def at(self, rows: int) -> BucketAcceptance:
        """The acceptance at a step over `rows` rows: its bucket's counts, pooled with the nearest
        buckets (by powers of two) until they hold `MIN_PROPOSALS` proposals. Why pool: a run at 64
        running decodes few steps of 1-8 rows, and a handful of proposals would make the tail's
        acceptance a coin toss; neighbours are alike (the same answers at other moments)."""
        have = sorted(int(k) for k, v in self.buckets.items() if int(v.get("tries", 0)) > 0)
        if not have:
            raise CannotPriceSpeculation(NO_ACCEPTANCE)
        want = math.log2(bucket_of(rows))
        order = sorted(have, key=lambda b: (abs(math.log2(b) - want), b))
        chosen: list[int] = []
        for b in order:
            chosen.append(b)
            if sum(int(self.buckets[str(c)].get("proposals", 0)) for c in chosen) >= MIN_PROPOSALS:
                break
        return pooled([self.buckets[str(b)] for b in chosen], self.max_draft, sorted(chosen))

    def total_proposals(self) -> int:
        return sum(int(v.get("proposals", 0)) for v in self.buckets.values())

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Acceptance:
        return cls(**raw)


def pooled(counts: Sequence[dict[str, Any]], max_draft: int, buckets: list[int] | None = None) -> BucketAcceptance:
    """The acceptance of buckets' raw counts added up (a position nobody reached counts as never
    accepted: nothing was seen to say otherwise)."""
    tries = sum(int(c.get("tries", 0)) for c in counts)
    proposals = sum(int(c.get("proposals", 0)) for c in counts)
    reached = [0] * max_draft
    accepted = [0] * max_draft
    for c in counts:
        for j, (r, a) in enumerate(zip(c.get("reached", []), c.get("accepted_at", []))):
            if j < max_draft:
                reached[j] += int(r)
                accepted[j] += int(a)
    return BucketAcceptance(
        min(proposals / tries, 1.0) if tries else 0.0,
        [a / r if r else 0.0 for a, r in zip(accepted, reached)],
        proposals,
        list(buckets or []),
    )


def expected_accepted(positions: Sequence[float], k: int) -> float:
    """Accepted tokens expected of a proposal of `k` tokens: token j is accepted only when tokens
    1..j all are (a verifying step keeps the longest matching prefix), so
    E = sum_{j=1..k} prod_{i<=j} p_i. Positions past what was counted are never accepted."""
    total, reach = 0.0, 1.0
    for j in range(min(k, len(positions))):
        reach *= positions[j]
        total += reach
    return total


def sample_accepted(rng: random.Random, positions: Sequence[float], k: int) -> int:
    """One proposal of `k` tokens: how many are accepted, drawn position by position (the first
    rejected one ends it), so rows finish at realistic times rather than at the mean."""
    j = 0
    while j < min(k, len(positions)) and rng.random() < positions[j]:
        j += 1
    return j


def fed_token_ms(prefill: LinearFit, width: float) -> float:
    """What one more token fed to a verifying step costs, in ms, at an attention window of `width`.

    Why the prefill fit's marginal token: a verifying forward is packed (engine.py `_verify`,
    ModelRunner.verify: only real tokens are computed), so a proposed token is one more row of
    the step's matrix products, projections and MLP alike, exactly what one more prefilled token
    is to a prefill chunk; and it attends over its row's KV window as a decode row does. The
    prefill fit prices a chunk as fixed + per padded token + per padded token x window: the
    per-token term is the matrix products, the per-token-x-window term the attention, so one
    fed token costs per_token + per_token_x_window x `width` (the window it attends over, the
    decode window). What it leaves out: the per-position sampling and the proposal lookup a
    verifying step does in Python besides the forward (`CostModel.verify_ms`, fitted on a run
    with speculation, says how much that is)."""
    coef = dict(zip(prefill.terms, prefill.coef))
    return coef.get("padded_k", 0.0) / 1e3 + coef.get("padded_x_width_m", 0.0) * width / 1e6


def verify_fixed_ms(fit: LinearFit, rows: float) -> float:
    """What a verifying step over `rows` rows costs beyond the plain step whatever it is fed, by a
    verifying-step fit (terms "1", "rows", "extra_k", "extra_x_width_m": costs.py VERIFY_TERMS)."""
    return fit.predict(rows=rows, extra_k=0.0, extra_x_width_m=0.0)


def verify_token_ms(fit: LinearFit, width: float) -> float:
    """One more fed token at window `width`, by a verifying-step fit (see `verify_fixed_ms`)."""
    coef = dict(zip(fit.terms, fit.coef))
    return coef.get("extra_k", 0.0) / 1e3 + coef.get("extra_x_width_m", 0.0) * width / 1e6


def verify_step_ms(decode_ms: float, prefill: LinearFit, extra_fed: float, width: float) -> float:
    """A verifying step over the rows of a plain decode step that took `decode_ms`, feeding
    `extra_fed` proposed tokens besides each row's last token: decode_ms + extra_fed x
    `fed_token_ms(width)` (why: `fed_token_ms`). With no proposal it is the plain step."""
    return decode_ms + max(extra_fed, 0.0) * fed_token_ms(prefill, width)


PRIOR_COST = 0.25  # speculation/policy.py _PRIOR_COST: a fed token's cost before it is measured
PROBE = 8  # speculation/policy.py _PROBE: a request whose proposals do not pay proposes 1 token this often


@dataclass
class Verdict:
    """The engine's steady-state choice at one batch size: rows that have a proposal (`share` of
    them) propose `draft` tokens; the tokens per ms of such a verifying step and of a plain one;
    `cost` the fed token's cost the policy measures (in plain-step time per row)."""

    draft: int
    share: float
    verify_rate: float
    plain_rate: float
    cost: float = PRIOR_COST

    @property
    def verifies(self) -> bool:
        """Whether verifying beats decoding plainly here (the policy's verdict)."""
        return self.verify_rate > self.plain_rate * (1 + 1e-9)


def policy_length(acceptance: float, cost: float, max_draft: int) -> int:
    """speculation/policy.py `draft_length`: the longest k <= max_draft whose k-th token is worth
    its cost, acceptance^k >= cost (0: none is)."""
    k, worth = 0, 1.0
    while k < max_draft and worth * acceptance >= cost:
        k, worth = k + 1, worth * acceptance
    return k


def best_draft(
    rows: int, acc: BucketAcceptance, plain_ms: float, token_ms: float, max_draft: int, fixed_ms: float = 0.0
) -> Verdict:
    """What the engine's policy settles on at `rows` rows (engines/inference/speculation/policy.py
    and speculator.py), followed to its steady state.

    The policy's rules, with the calibration's numbers in place of its running measurements:
    each request's acceptance a is accepted per tried token (here the bucket's: accepted over
    reached positions of the shadow's proposals); a fed token's cost c is what verifying steps
    took beyond plain ones per extra fed token, in plain-step time per row (prior 1/4: here the
    priced verifying step, `fixed_ms` included, since the engine's measurement includes it too);
    a row proposes the longest k with a^k >= c (none: one token every PROBE steps), cut to the
    tokens whose a^k beats c times the step's rate (`_trim`); and the step verifies when the
    tokens per ms of verifying,

        rows (1 + q E[accepted | k]) / (plain_ms + fixed_ms + rows q k token_ms),

    (q the share of rows with a proposal; E from the per-position acceptance, not a^k) beat
    the plain step's rows / plain_ms. c depends on k and k on c, as in the engine: a few rounds
    from the prior settle them. What this leaves out: that requests differ in acceptance (one a
    per bucket here), the noise of the engine's running averages (one slow verifying step can
    keep a bucket plain for a long while), and (the caller's part) its exploration."""
    plain = rows / plain_ms if plain_ms > 0 else 0.0
    per_row = plain_ms / rows if rows else plain_ms
    reached = sum(_reach(acc.positions))
    a = (acc.expected_accepted(len(acc.positions)) / reached) if reached > 0 else 0.0
    cost = PRIOR_COST
    verdict = Verdict(0, 0.0, 0.0, plain, cost)
    for _ in range(6):
        k = policy_length(a, cost, max_draft)
        share = acc.rate if k else acc.rate / PROBE
        k = k or 1
        rate = 1.0
        for _ in range(3):  # speculator.py _trim
            keep = 0
            while keep < k and a ** (keep + 1) > cost * rate:
                keep += 1
            gained = sum(a**j for j in range(1, keep + 1))
            rate = (rows + rows * share * gained) / (rows + cost * rows * share * keep)
        k = keep
        extra = rows * share * k
        if not k or extra <= 0:
            return Verdict(0, 0.0, 0.0, plain, cost)
        ms = plain_ms + fixed_ms + extra * token_ms
        verdict = Verdict(k, share, rows * (1.0 + share * acc.expected_accepted(k)) / ms, plain, cost)
        measured = ((ms - plain_ms) / extra) / per_row if per_row > 0 else cost
        new = min(max(measured, 0.02), 4.0)
        if abs(new - cost) < 1e-6:
            break
        cost = new
    return verdict


def _reach(positions: Sequence[float]) -> list[float]:
    """The chance that a proposal's position j + 1 is compared at all (every one before it accepted)."""
    out, reach = [], 1.0
    for p in positions:
        out.append(reach)
        reach *= p
    return out
