"""The engine's speculation: which running rows propose what, and what came of it.

Why a component of its own: the scheduler (`engine.py`) only asks, before a decode step,
"what does each row propose?" and tells, after the verifying step, "this many were
accepted". Where proposals come from (`drafts.py`: suffix matches in the request's own
prompt and answer, its group's other answers, earlier answers to the same prompt), how long
they are and whether to speculate at this batch size at all (`policy.py`), and the counts the
trace shows are kept here.

Exactness never rests on a proposal: the engine samples every fed position exactly as a
plain decode step would (same sampler, same per-request uniforms) and keeps a proposed token
only when the sample equals it (engine.py `_verify`). A request decodes without proposals
when speculation cannot be combined with one of its features: a constrained request
(`json_schema`, `grammar`), whose grammar state cannot be advanced through a proposal and
rolled back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_graph.engines.inference.speculation.drafts import SOURCES, Draft, DraftStore
from areal_graph.engines.inference.speculation.policy import SpeculationPolicy, bucket_of

__all__ = ["SpeculativeSettings", "Speculator"]


@dataclass(frozen=True)
class SpeculativeSettings:
    """How the embedded engine speculates (the workflow's `inference.speculative`)."""

    enabled: bool = False
    max_draft: int = 4  # tokens a request proposes at most per step
    max_rows: int | None = None  # speculate only at this many running rows or fewer (None: measured)
    min_match: int = 2  # shortest suffix that counts as a match
    max_match: int = 4  # longest suffix looked up first
    history_prompts: int = 128  # prompts whose finished answers are kept for later requests
    history_answers: int = 8  # finished answers kept per prompt
    # speculation off: count what it would have accepted for the answers to one prompt in this many (0: none; shadow.py)
    shadow_every: int = 16


class Speculator:
    """Proposals for the running rows and what came of them (see module docstring)."""

    def __init__(self, settings: SpeculativeSettings) -> None:
        self.settings = settings
        self.drafts = DraftStore(
            max_prompts=settings.history_prompts,
            max_answers=settings.history_answers,
            min_match=settings.min_match,
            max_match=settings.max_match,
        )
        self.policy = SpeculationPolicy(settings.max_draft, settings.max_rows)
        self._live: set[str] = set()
        self.proposed: Counter[str] = Counter()  # tokens proposed, by source
        self.accepted: Counter[str] = Counter()  # of those, accepted
        self.steps = 0  # verifying steps
        self.row_steps = 0  # rows over those steps (a row verified in a step counts once)
        self.fed = 0  # tokens fed to verifying steps (rows x (1 + proposal))
        self.emitted = 0  # tokens they emitted
        self.by_rows: dict[int, list[int]] = {}  # batch bucket -> [proposed, accepted]

    def proposals(self, reqs: Sequence[Any]) -> list[Draft | None] | None:
        """Per running request its proposal (None: it decodes plainly), or None for the whole step
        when the policy says decode plainly at this batch size or no proposal pays."""
        if not self.policy.speculate(len(reqs)):
            return None
        out: list[Draft | None] = []
        cost = self.policy.token_cost(len(reqs))
        for r in reqs:
            draft = None
            if r.constraint is None:
                room = r.params.max_new_tokens - len(r.output_ids) - 1
                k = min(self.policy.draft_length(r.rid, len(reqs), cost), room)
                if k > 0:
                    if r.rid not in self._live:
                        self.drafts.start(r.rid, r.prompt)
                        self._live.add(r.rid)
                    draft = self.drafts.propose(r.rid, r.output_ids, k)
            out.append(draft)
        return self._trim(reqs, out)

    def _trim(self, reqs: Sequence[Any], drafts: list[Draft | None]) -> list[Draft | None] | None:
        """Cut each row's proposal to what pays, or None to decode plainly.

        The verifying forward is packed (ModelRunner.verify): a row pays only for the tokens it
        is fed. A step over `rows` rows that feeds them F proposed tokens in all takes rows + F c
        in plain-step time per row (c: the measured cost of a fed token at this batch size), and
        the k-th proposed token of a row with acceptance a is used with probability a^k. Adding
        a token raises the step's tokens per unit of time R exactly when its a^k exceeds c R, so
        each row keeps its tokens down to that threshold, R settled by a few rounds."""
        lengths = [len(d.tokens) if d is not None else 0 for d in drafts]
        if not any(lengths):
            return None
        rows = len(reqs)
        if not self.policy.cost_measured(rows):
            return drafts  # verify as proposed: what a fed token costs here is measured by doing it
        cost = self.policy.token_cost(rows)
        accept = [self.policy.acceptance(r.rid) for r in reqs]
        rate, cuts = 1.0, lengths
        for _ in range(3):
            cuts = [_keep(a, k, cost * rate) for a, k in zip(accept, lengths)]
            gained = sum(sum(a**j for j in range(1, k + 1)) for a, k in zip(accept, cuts))
            rate = (rows + gained) / (rows + cost * sum(cuts))
        if not any(cuts):
            return None
        return [
            (Draft(d.tokens[:k], d.source, d.match) if k else None) if d is not None else None
            for d, k in zip(drafts, cuts)
        ]

    def verified(self, reqs: Sequence[Any], drafts: Sequence[Draft | None], accepted: Sequence[int]) -> None:
        """After a verifying step: `accepted[i]` of request i's proposal were taken."""
        self.steps += 1
        self.row_steps += len(reqs)
        tally = self.by_rows.setdefault(bucket_of(len(reqs)), [0, 0])
        for r, d, a in zip(reqs, drafts, accepted):
            self.fed += 1 + (len(d.tokens) if d is not None else 0)
            self.emitted += 1 + a
            if d is None:
                continue
            self.proposed[d.source] += len(d.tokens)
            self.accepted[d.source] += a
            tally[0] += len(d.tokens)
            tally[1] += a
            self.policy.accepted(r.rid, len(d.tokens), a)

    def measured(self, rows: int, verified: bool, seconds: float, tokens: int, fed: int | None = None) -> None:
        self.policy.measured(rows, verified, seconds, tokens, fed)

    def finish(self, req: Any, keep: bool = True) -> None:
        """Request `req` is done: its answer stays as a draft source for its prompt (keep)."""
        if req.rid in self._live:
            self._live.discard(req.rid)
            self.drafts.extend(req.rid, req.output_ids)
            self.drafts.finish(req.rid, keep=keep)
        self.policy.forget(req.rid)

    def stats(self) -> dict[str, Any]:
        """Counts for the engine's stats and the trace: proposed and accepted tokens by source,
        tokens per row and verifying forward (1 is plain decoding), acceptance by batch size."""
        return {
            "steps": self.steps,
            "row_steps": self.row_steps,
            "tokens_per_forward": self.emitted / self.row_steps if self.row_steps else 0.0,
            "fed": self.fed,
            "emitted": self.emitted,
            "proposed": {s: self.proposed[s] for s in SOURCES},
            "accepted": {s: self.accepted[s] for s in SOURCES},
            "acceptance_by_rows": {str(k): (v[1] / v[0] if v[0] else 0.0) for k, v in sorted(self.by_rows.items())},
            "rates_by_rows": {str(k): list(v) for k, v in self.policy.rates().items()},
        }


def _keep(acceptance: float, proposed: int, threshold: float) -> int:
    """How many of a row's `proposed` tokens are each used with probability above `threshold`."""
    k = 0
    while k < proposed and acceptance ** (k + 1) > threshold:
        k += 1
    return k
