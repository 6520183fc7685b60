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
- **The cost of a verifying step**: `verify_step_ms` (below), from the decode and prefill fits.
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


def bucket_of(rows: int) -> int:
    """The engine's batch-size bucket: 1, 2, 4, 8, ... (engines/inference/speculation/policy.py)."""
    b = 1
    while b < rows:
        b *= 2
    return b


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


def verify_step_ms(decode_ms: float, prefill: LinearFit, extra_fed: float, width: float) -> float:
    """A verifying step over the rows of a plain decode step that took `decode_ms`, feeding
    `extra_fed` proposed tokens besides each row's last token: decode_ms + extra_fed x
    `fed_token_ms(width)` (why: `fed_token_ms`). With no proposal it is the plain step."""
    return decode_ms + max(extra_fed, 0.0) * fed_token_ms(prefill, width)


@dataclass
class Verdict:
    """The engine's steady-state choice at one batch size: `draft` the proposal length that gives
    the most tokens per ms (what a row with a proposal is fed when the step verifies), the tokens
    per ms of that verifying step and of a plain one."""

    draft: int
    verify_rate: float
    plain_rate: float

    @property
    def verifies(self) -> bool:
        """Whether verifying beats decoding plainly here (the policy's verdict)."""
        return self.verify_rate > self.plain_rate * (1 + 1e-9)


def best_draft(
    rows: int, acc: BucketAcceptance, plain_ms: float, token_ms: float, max_draft: int, fixed_ms: float = 0.0
) -> Verdict:
    """What the engine's policy settles on at `rows` rows (engines/inference/speculation/policy.py).

    The policy verifies when the measured tokens per second of verifying steps beat those of
    plain steps in this batch-size bucket, and each row proposes the longest k whose k-th token
    is worth its cost (its chance of being used against the cost of feeding it, in plain-step
    time per row, scaled by the step's rate; speculator.py `_trim`). At its steady state that is
    the k that maximises the verifying step's tokens per ms,

        rate(k) = rows (1 + q E[accepted | k]) / (plain_ms + fixed_ms + rows q k token_ms),

    q the share of rows with a proposal, `fixed_ms` what verifying costs beyond the plain step
    whatever is fed (0 when priced from the prefill fit), and verifying pays when
    rate(k) > rows / plain_ms. What
    this leaves out: that each request proposes by its own recent acceptance (one rate per
    bucket here), the measurement noise that can flip a close verdict, and (the caller's part)
    its exploration of the other kind."""
    plain = rows / plain_ms if plain_ms > 0 else 0.0
    best = Verdict(0, 0.0, plain)
    for k in range(1, max_draft + 1):
        ms = plain_ms + fixed_ms + rows * acc.rate * k * token_ms
        rate = rows * (1.0 + acc.rate * acc.expected_accepted(k)) / ms if ms > 0 else 0.0
        if rate > best.verify_rate * (1 + 1e-9):
            best = Verdict(k, rate, plain)
    return best
