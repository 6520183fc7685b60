"""When to speculate and how far: the proposal length per request and the choice per step.

Why adaptive: a verifying step feeds 1 + k tokens per row and pays for all of them, while
only the accepted ones come out. How much that costs depends on the batch: on a CPU a decode
step of 1-8 rows is mostly per-call overhead (0.4-0.8 ms per token on the tiny kits, against
0.2 ms at 17-32 rows), so feeding a few more tokens per row is nearly free there and costs
about their compute at large batches. Neither the acceptance rate nor the cost is known in
advance (both depend on the policy, the prompts and the machine), so both are measured as
the engine runs:

- **Per request**, the proposal length weighs what a token is worth against what it costs. Its
  worth: the request's recent acceptance rate a (accepted per proposed token tried, decayed, with
  a prior of 1/2): the k-th proposed token is used with probability a^k. Its cost: c, the time
  one more fed token per row adds to a verifying step, in units of a plain step's time per row,
  measured at this batch size (a prior of 1/4 until both kinds of step ran). The request proposes
  the longest k <= `max_draft` with a^k >= c; when even one token is not worth it, it proposes
  nothing, except one token every `_PROBE` steps (so its rate stays measured). On a CPU c is small at one row (the step is per-call overhead) and near 1 at 64
  (the step is compute): long proposals in the tail, short ones in a full batch.
- **Per step**, the engine speculates when the measured tokens per second of verifying steps
  beat those of plain decode steps at this batch size (batch sizes bucketed by powers of
  two). A bucket without measurements of one kind tries it; every `_EXPLORE` steps the other
  kind runs once, so a verdict follows the policy as it changes. `max_rows` caps the batch
  that may speculate at all (None: the measurements decide alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_EMA = 0.2  # weight of the newest measurement in the running averages
_EXPLORE = 64  # steps of one kind in a bucket before the other kind is measured again
_DECAY = 0.8  # a request's acceptance counts fade by this per verifying step
_PRIOR_COST = 0.25  # an extra fed token per row, in plain-step time per row, before it is measured
_PROBE = 8  # a request whose proposals do not pay proposes one token every this many steps


def bucket_of(rows: int) -> int:
    """Batch-size bucket: 1, 2, 4, 8, ... (the power of two at or above `rows`)."""
    b = 1
    while b < rows:
        b *= 2
    return b


@dataclass
class _Rate:
    """Running averages of one kind of step in one bucket: seconds per step, tokens out per step,
    rows and fed tokens per step."""

    seconds: float = 0.0
    tokens: float = 0.0
    rows: float = 0.0
    fed: float = 0.0
    n: int = 0

    def add(self, seconds: float, tokens: float, rows: float, fed: float) -> None:
        if self.n == 0:
            self.seconds, self.tokens, self.rows, self.fed = seconds, tokens, rows, fed
        else:
            self.seconds += _EMA * (seconds - self.seconds)
            self.tokens += _EMA * (tokens - self.tokens)
            self.rows += _EMA * (rows - self.rows)
            self.fed += _EMA * (fed - self.fed)
        self.n += 1

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Bucket:
    decode: _Rate = field(default_factory=_Rate)
    verify: _Rate = field(default_factory=_Rate)
    since_other: int = 0  # steps of the current verdict's kind since the other kind last ran


class SpeculationPolicy:
    """Proposal lengths and the speculate-or-decode choice (see module docstring)."""

    def __init__(self, max_draft: int = 4, max_rows: int | None = None) -> None:
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or not 1 <= max_draft <= 16:
            raise ValueError(f"max_draft must be an integer in [1, 16], got {max_draft!r}")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
            raise ValueError(f"max_rows must be an integer >= 1 or None, got {max_rows!r}")
        self.max_draft = max_draft
        self.max_rows = max_rows
        self._tries: dict[str, tuple[float, float]] = {}  # rid -> (accepted, tried), decayed
        self._idle: dict[str, int] = {}  # rid -> steps since it last proposed (when proposing does not pay)
        self._buckets: dict[int, _Bucket] = {}

    # ---------------------------------------------------------------- per request
    def acceptance(self, rid: str) -> float:
        """Request `rid`'s recent chance that a proposed token is accepted (prior 1/2)."""
        accepted, tried = self._tries.get(rid, (0.0, 0.0))
        return (accepted + 1.0) / (tried + 2.0)

    def draft_length(self, rid: str, rows: int = 1, cost: float | None = None) -> int:
        """How many tokens request `rid` should propose in a step over `rows` rows: the longest
        k <= max_draft whose k-th token is worth its cost (a^k >= c); 0 when none is, but 1 every
        `_PROBE` steps so that its acceptance stays measured. `cost`: `token_cost(rows)`, when the
        caller has it already (one step asks for every row)."""
        a, c = self.acceptance(rid), self.token_cost(rows) if cost is None else cost
        k, worth = 0, 1.0
        while k < self.max_draft and worth * a >= c:
            k, worth = k + 1, worth * a
        if k:
            self._idle.pop(rid, None)
            return k
        idle = self._idle.get(rid, 0) + 1
        self._idle[rid] = 0 if idle >= _PROBE else idle
        return 1 if idle >= _PROBE else 0

    def accepted(self, rid: str, proposed: int, accepted: int) -> None:
        """Request `rid` proposed `proposed` tokens and `accepted` of them were taken (the tokens
        tried are the accepted ones and, when one was rejected, that one)."""
        if proposed <= 0:
            return
        tried = accepted + (1 if accepted < proposed else 0)
        a, t = self._tries.get(rid, (0.0, 0.0))
        self._tries[rid] = (a * _DECAY + accepted, t * _DECAY + tried)

    def forget(self, rid: str) -> None:
        self._tries.pop(rid, None)
        self._idle.pop(rid, None)

    def cost_measured(self, rows: int) -> bool:
        """Whether `token_cost(rows)` is measured (verifying and plain steps ran at this batch size)."""
        b = self._buckets.get(bucket_of(rows))
        return b is not None and b.verify.n > 0 and b.decode.n > 0 and b.verify.fed > b.verify.rows

    def token_cost(self, rows: int) -> float:
        """What one more fed token per row adds to a verifying step over `rows` rows, in plain-step
        time per row (measured: verifying steps against plain ones in this bucket)."""
        if not self.cost_measured(rows):
            return _PRIOR_COST
        b = self._buckets[bucket_of(rows)]
        per_row = b.decode.seconds / max(b.decode.rows, 1.0)
        extra = (b.verify.seconds - per_row * b.verify.rows) / (b.verify.fed - b.verify.rows)
        return min(max(extra / per_row, 0.02), 4.0)

    # ---------------------------------------------------------------- per step
    def speculate(self, rows: int) -> bool:
        """Whether a step over `rows` running rows should verify proposals (else decode plainly)."""
        if self.max_rows is not None and rows > self.max_rows:
            return False
        b = self._buckets.setdefault(bucket_of(rows), _Bucket())
        if b.verify.n == 0:
            return True  # never measured here: try it
        if b.decode.n == 0:
            return False  # the baseline first
        verdict = b.verify.per_second >= b.decode.per_second
        if b.since_other >= _EXPLORE:  # measure the other kind again: the policy and the batch mix move
            b.since_other = 0
            return not verdict
        b.since_other += 1
        return verdict

    def measured(self, rows: int, verified: bool, seconds: float, tokens: int, fed: int | None = None) -> None:
        """A step over `rows` rows fed `fed` tokens (a plain step: one per row), took `seconds` and
        emitted `tokens` tokens."""
        b = self._buckets.setdefault(bucket_of(rows), _Bucket())
        (b.verify if verified else b.decode).add(seconds, float(tokens), float(rows), float(fed if fed else rows))

    def rates(self) -> dict[int, tuple[float, float]]:
        """Per bucket, tokens per second of (decode, verify) steps so far (0 where unmeasured)."""
        return {k: (b.decode.per_second, b.verify.per_second) for k, b in sorted(self._buckets.items())}
