"""When to speculate and how far: the proposal length per request and the choice per step.

Why adaptive: a verifying step feeds 1 + k tokens per row and pays for all of them, while
only the accepted ones come out. How much that costs depends on the batch: on a CPU a decode
step of 1-8 rows is mostly per-call overhead (0.4-0.8 ms per token on the tiny kits, against
0.2 ms at 17-32 rows), so feeding a few more tokens per row is nearly free there and costs
about their compute at large batches. Neither the acceptance rate nor the cost is known in
advance (both depend on the policy, the prompts and the machine), so both are measured as
the engine runs:

- **Per request**, the proposal length follows its own recent acceptance: everything accepted
  grows it by one (up to `max_draft`), a rejection shrinks it to what was accepted plus one.
  A request whose proposals keep failing proposes one token at a time, which costs one more
  query per step.
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


def bucket_of(rows: int) -> int:
    """Batch-size bucket: 1, 2, 4, 8, ... (the power of two at or above `rows`)."""
    b = 1
    while b < rows:
        b *= 2
    return b


@dataclass
class _Rate:
    """Running averages of one kind of step in one bucket: seconds per step and tokens out per step."""

    seconds: float = 0.0
    tokens: float = 0.0
    n: int = 0

    def add(self, seconds: float, tokens: float) -> None:
        if self.n == 0:
            self.seconds, self.tokens = seconds, tokens
        else:
            self.seconds += _EMA * (seconds - self.seconds)
            self.tokens += _EMA * (tokens - self.tokens)
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
        self._length: dict[str, int] = {}  # rid -> its next proposal length
        self._buckets: dict[int, _Bucket] = {}

    # ---------------------------------------------------------------- per request
    def draft_length(self, rid: str) -> int:
        """How many tokens request `rid` may propose now."""
        return self._length.get(rid, min(2, self.max_draft))

    def accepted(self, rid: str, proposed: int, accepted: int) -> None:
        """Request `rid` proposed `proposed` tokens and `accepted` of them were taken."""
        if proposed <= 0:
            return
        k = self.draft_length(rid)
        self._length[rid] = min(k + 1, self.max_draft) if accepted >= proposed else max(1, accepted + 1)

    def forget(self, rid: str) -> None:
        self._length.pop(rid, None)

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

    def measured(self, rows: int, verified: bool, seconds: float, tokens: int) -> None:
        """A step over `rows` rows took `seconds` and emitted `tokens` tokens."""
        b = self._buckets.setdefault(bucket_of(rows), _Bucket())
        (b.verify if verified else b.decode).add(seconds, float(tokens))

    def rates(self) -> dict[int, tuple[float, float]]:
        """Per bucket, tokens per second of (decode, verify) steps so far (0 where unmeasured)."""
        return {k: (b.decode.per_second, b.verify.per_second) for k, b in sorted(self._buckets.items())}
