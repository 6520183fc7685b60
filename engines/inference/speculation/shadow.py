"""What speculation would have accepted while it is off (shadow acceptance).

Why: the performance simulator (perfmodel/) prices a run from what the run's trace measured, and
a run that decoded plainly measured nothing about speculation. Pricing it needs the acceptance of
proposals on this model, these prompts and this batch mix, by batch size. The engine has all of
it at hand: the requests to one prompt in `shadow_every` (chosen by the prompt's tokens) propose,
at every plain decode step where the live speculator would (`Speculator.proposals`, its policy
forced to propose `max_draft` tokens: the same DraftStore, the same sources and limits, fed the
same way), and the tokens plain decoding emits next are compared with the proposal.

Why the count is what a verifying step would have accepted, for sampled requests too: a
verifying step (engine.py `_verify`, token_intake.py `take_verified`) feeds a row its last token
and its proposal d1..dk and samples position j with the same sampler, the penalties over the
answer as it would be there, and the request's own uniform for output index n + j
(`requests.py:Request.uniform_at`: drawn from the request's seeded generator, whatever the batch
or the schedule). Position j is read only when d1..dj all equalled the samples before it, so its
context is exactly the one plain decoding reaches, its logits are plain decoding's (up to float
rounding of the packed forward) and its sample is plain decoding's token n + j; d(j+1) is kept
exactly when that token equals it. So the tokens accepted are the longest prefix of the proposal
that equals the tokens plain decoding emitted, for greedy and for seeded sampling alike, not just
in distribution. Three rules of the verifying step are copied: a token that finishes the request
(EOS, a stop token or string) ends the row there even when it equals the proposal's token
(`take_verified` counts it as the emitted token, not an accepted one), so here it counts as
reached and not accepted; a proposal never runs past `max_new_tokens` (room for its tokens and
the one the step always emits); and the next proposal comes where the speculator's would, right
after the token a verifying step emits past the accepted ones (one step after a mismatch, two
after a full match). A single request's counts are then exactly the live speculator's
(tests/engines/inference/speculation/test_shadow.py).

Why whole prompts and not sampled steps: proposals are resolved at the positions the previous
one left off, and acceptance depends on where in an answer a proposal starts (openings copy the
prompt or the group, later tokens less); sampling every k-th step picks the same positions in
every row of a lockstep batch, which measured a very different acceptance (on tiny-arith's
groups, 8 times fewer proposals and twice the acceptance). A shadowed request follows the live
schedule from its first decode step to its end. Why prompts and not single requests: the draft
material of a request is its prompt's answers, in flight and finished, so only a shadowed
prompt's answers need indexing, and a prompt chosen by its tokens (a hash, the same in every
process) is shadowed again when it returns, with its earlier answers as `history`. The store
keeps `history_prompts / shadow_every` prompts (at least one), so that its history reaches as
far back in the run as the live speculator's. The sample is unbiased over prompts (a hash of
their tokens), coarser than over requests: one prompt's answers resemble each other.

A proposal is resolved when a token differs, when all of it matched, or when its request ends
(the finishing token is compared first, as above). It is dropped uncounted when its request is
aborted or fails, and when the weights change (a verifying step runs on one version; with
`kv_on_update: recompute` the row is re-prefilled): what a half-compared proposal matched so far
says nothing of the tokens it would have been compared with.

What can differ from a live run's counts with several rows: the store holds the other answers to
a prompt as the live one would if every step verified (each up to its previous step, the rows
before a proposer in the batch up to this one), but live steps emit several tokens per row, so
under speculation siblings are at other positions than under plain decoding. Group counts agree
in kind, not token for token (on tiny-arith's groups: within a few per cent).

Cost: a shadowed prompt's answers are indexed once (about a microsecond a token, as the live
speculator's store; and the Python objects the index holds make the garbage collector's passes
longer, which was most of the cost when every answer was indexed), a proposal costs 4-12 us,
and a step looks at each row once (a dict lookup) and compares the open proposals' new tokens;
none of it is timed as part of a decode step in the engine's step log.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from areal_graph.engines.inference.speculation.drafts import SOURCES, DraftStore
from areal_graph.engines.inference.speculation.policy import bucket_of

__all__ = ["ShadowSpeculation"]

_UNSEEN: Any = object()  # a request not seen in a decode step yet


@dataclass
class _Open:
    """A proposal not resolved yet: tokens[i] is compared with the request's output token start + i."""

    req: Any
    tokens: tuple[int, ...]
    source: str
    bucket: int
    start: int
    matched: int = 0


@dataclass
class _Tally:
    """One batch-size bucket's counts. reached[k]: proposals whose position k + 1 was sampled (all
    before it accepted); accepted_at[k]: of those, the ones whose position k + 1 was accepted too."""

    tries: int = 0  # rows asked for a proposal
    proposals: int = 0  # resolved proposals
    proposed: int = 0  # their tokens
    accepted: int = 0  # of those, accepted
    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        mean = self.accepted / self.proposals if self.proposals else 0.0
        return {
            "tries": self.tries,
            "proposals": self.proposals,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "reached": list(self.reached),
            "accepted_at": list(self.accepted_at),
            "mean_accepted": mean,
            # a verifying forward emits 1 + the accepted tokens per row it verifies
            "tokens_per_forward": 1.0 + mean if self.proposals else 0.0,
            "acceptance_by_position": [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached)],
        }


class ShadowSpeculation:
    """Counts what the speculator would have accepted while the engine decodes plainly (see
    module docstring). The engine calls `before_step` before, and `after_step` after, each plain
    decode step, `finish` when a request is resolved and `interrupt` when the weights change."""

    def __init__(self, settings: Any) -> None:
        every = settings.shadow_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"shadow_every must be an integer >= 1 to count, got {every!r}")
        if isinstance(settings.max_draft, bool) or not isinstance(settings.max_draft, int) or settings.max_draft < 1:
            raise ValueError(f"max_draft must be an integer >= 1, got {settings.max_draft!r}")
        self.every = every
        self.max_draft = settings.max_draft
        self.drafts = DraftStore(
            max_prompts=max(1, settings.history_prompts // every),
            max_answers=settings.history_answers,
            min_match=settings.min_match,
            max_match=settings.max_match,
        )
        # requests in flight seen in a decode step -> their prompt's tokens when shadowed, else None
        self._rows: dict[str, tuple[int, ...] | None] = {}
        self._groups: dict[tuple[int, ...], dict[str, Any]] = {}  # prompt -> its requests in flight in the store
        self._open: dict[str, _Open] = {}  # rid -> its unresolved proposal
        self._resume: dict[str, int] = {}  # rid -> answer length before which it does not propose again
        self.shadowed = 0  # requests shadowed so far
        self.dropped = 0  # proposals dropped uncounted (abort, failure, weight change)
        self.proposed: Counter[str] = Counter()  # tokens proposed, by source
        self.accepted: Counter[str] = Counter()  # of those, accepted
        self.proposals: Counter[str] = Counter()  # resolved proposals, by source
        self.by_rows: dict[int, _Tally] = {}  # batch bucket -> counts

    # ------------------------------------------------------------------ per step
    def before_step(self, rows: list[Any]) -> None:
        """Before a plain decode step over `rows` (the running requests, in order): each shadowed row
        without an open proposal proposes what the speculator would."""
        tally: _Tally | None = None
        caught: set[tuple[int, ...]] = set()
        for r in rows:
            key = self._rows.get(r.rid, _UNSEEN)
            if key is _UNSEEN:
                key = self._join(r)
            if key is None or r.rid in self._open:
                continue
            out = r.output_ids
            k = min(self.max_draft, r.params.max_new_tokens - len(out) - 1)
            if k < 1 or len(out) < self._resume.get(r.rid, 0):
                continue
            if tally is None:
                tally = self._tally(bucket_of(len(rows)))
            tally.tries += 1
            if key not in caught:
                # the group's answers as the live store holds them when every row proposes every
                # step: up to each one's previous step, and the rows before in the batch up to this
                # one, as each proposes (propose indexes the proposer's answer so far)
                caught.add(key)
                for sid, s in self._groups[key].items():
                    self.drafts.extend(sid, s.output_ids, upto=len(s.output_ids) - 1)
            draft = self.drafts.propose(r.rid, out, k)
            if draft is not None:
                self._open[r.rid] = _Open(r, draft.tokens, draft.source, bucket_of(len(rows)), len(out))

    def after_step(self) -> None:
        """After a plain decode step: compare the open proposals with the tokens emitted."""
        if not self._open:
            return
        for p in list(self._open.values()):
            self._advance(p)

    def finish(self, req: Any, keep: bool = True) -> None:
        """Request `req` is resolved: a finished one's last token is compared; an aborted or failed
        one's open proposal is dropped. Its answer stays draft material for its prompt (keep), as
        the speculator keeps it (a request that never reached a decode step never was material)."""
        p = self._open.get(req.rid)
        if p is not None:
            if keep and req.finish_reason in ("stop", "length"):
                self._advance(p)
            if req.rid in self._open:
                del self._open[req.rid]
                self.dropped += 1
        self._resume.pop(req.rid, None)
        key = self._rows.pop(req.rid, None)
        if key is None:
            return
        members = self._groups[key]
        members.pop(req.rid, None)
        if not members:
            del self._groups[key]
        self.drafts.extend(req.rid, req.output_ids)
        self.drafts.finish(req.rid, keep=keep)

    def interrupt(self) -> None:
        """The weights change: drop every open proposal uncounted (a verifying step runs on one
        version, and a recomputed row's next token comes from a prefill)."""
        self.dropped += len(self._open)
        self._open.clear()

    def _join(self, r: Any) -> tuple[int, ...] | None:
        """Request `r`'s first decode step: when its prompt is shadowed it starts in the store here, as
        the live speculator's rows do. Returns the prompt's tokens when shadowed, else None."""
        key = tuple(r.prompt)
        # a constrained request never proposes (speculator.py) and is no material either
        if r.constraint is not None or hash(key) % self.every:
            self._rows[r.rid] = None
            return None
        self.drafts.start(r.rid, key)
        self._groups.setdefault(key, {})[r.rid] = r
        self.shadowed += 1
        self._rows[r.rid] = key
        return key

    # ------------------------------------------------------------------ counting
    def _advance(self, p: _Open) -> None:
        """Compare the tokens `p`'s request emitted since the last look; resolve `p` on a mismatch,
        a full match or the request's finishing token."""
        out = p.req.output_ids
        done = p.req.finish_reason is not None
        while p.start + p.matched < len(out):
            i = p.matched
            at = p.start + i
            if out[at] != p.tokens[i] or (done and at == len(out) - 1):
                self._close(p, accepted=i, reached=i + 1)
                return
            p.matched += 1
            if p.matched == len(p.tokens):
                self._close(p, accepted=p.matched, reached=p.matched)
                self._resume[p.req.rid] = p.start + p.matched + 1  # the verifying step's extra token
                return

    def _close(self, p: _Open, accepted: int, reached: int) -> None:
        del self._open[p.req.rid]
        n = len(p.tokens)
        self.proposed[p.source] += n
        self.accepted[p.source] += accepted
        self.proposals[p.source] += 1
        t = self._tally(p.bucket)
        t.proposals += 1
        t.proposed += n
        t.accepted += accepted
        for k in range(reached):
            t.reached[k] += 1
        for k in range(accepted):
            t.accepted_at[k] += 1

    def _tally(self, bucket: int) -> _Tally:
        t = self.by_rows.get(bucket)
        if t is None:
            t = self.by_rows[bucket] = _Tally(reached=[0] * self.max_draft, accepted_at=[0] * self.max_draft)
        return t

    # ------------------------------------------------------------------ reporting
    def bookkeeping(self) -> dict[str, int]:
        """What the counter holds per request in flight (for tests of its bounds): rows seen, prompts
        with requests in flight, open proposals, resume marks."""
        return {
            "rows": len(self._rows),
            "groups": len(self._groups),
            "open": len(self._open),
            "resume": len(self._resume),
        }

    def stats(self) -> dict[str, Any]:
        """Counts for the engine's stats and the trace: proposed and accepted tokens by source, and
        by batch size the mean accepted per proposal, tokens per verifying forward and acceptance
        per position (the raw counts too, so servers' counts add up)."""
        return {
            "every": self.every,
            "shadowed": self.shadowed,
            "dropped": self.dropped,
            "proposals": {s: self.proposals[s] for s in SOURCES},
            "proposed": {s: self.proposed[s] for s in SOURCES},
            "accepted": {s: self.accepted[s] for s in SOURCES},
            "by_rows": {str(k): v.as_dict() for k, v in sorted(self.by_rows.items())},
        }
