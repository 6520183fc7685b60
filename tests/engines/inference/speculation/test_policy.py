"""When to speculate and how far (speculation/policy.py), and what the speculator counts."""

from __future__ import annotations

import pytest

from areal_graph.engines.inference.speculation.policy import SpeculationPolicy, bucket_of
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings, Speculator


def test_buckets_are_powers_of_two():
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]


def test_the_proposal_length_weighs_acceptance_against_cost():
    p = SpeculationPolicy(max_draft=6)
    assert p.acceptance("a") == 0.5 and p.token_cost(1) == 0.25
    assert p.draft_length("a") == 2  # 0.5^2 = 0.25 >= 0.25, 0.5^3 < 0.25
    for _ in range(20):
        p.accepted("a", 4, 4)  # everything accepted: a -> 1
    assert p.acceptance("a") > 0.95 and p.draft_length("a") == 6
    for _ in range(20):
        p.accepted("a", 4, 0)  # the first token rejected each time: a -> 0
    assert p.acceptance("a") < 0.2
    lengths = [p.draft_length("a") for _ in range(16)]
    assert lengths == ([0] * 7 + [1]) * 2  # not worth proposing: one token every 8th step keeps a measured
    p.forget("a")
    assert p.acceptance("a") == 0.5


def test_the_cost_of_a_fed_token_is_measured_per_batch_size():
    p = SpeculationPolicy(max_draft=8)
    p.measured(1, False, 0.001, 1)  # one row: 1 ms a plain step
    p.measured(1, True, 0.0012, 3, fed=5)  # 4 more fed tokens cost 0.2 ms: 0.05 of a row's step each
    assert p.token_cost(1) == pytest.approx(0.05)
    p.measured(64, False, 0.010, 64)  # 64 rows: 0.156 ms per row
    p.measured(64, True, 0.030, 90, fed=192)  # 128 more fed tokens cost 20 ms: 1.0 per token
    assert p.token_cost(64) == pytest.approx(1.0)
    for _ in range(10):
        p.accepted("a", 4, 3)
    a = p.acceptance("a")
    assert 0.6 < a < 0.8
    assert p.draft_length("a", rows=1) == max(k for k in range(1, 9) if a**k >= 0.05)  # long in the tail
    assert p.draft_length("a", rows=64) == 0  # a full batch pays for every fed token: none is worth it


def test_the_step_choice_follows_the_measured_rates():
    p = SpeculationPolicy(max_draft=4)
    assert p.speculate(8)  # nothing measured at 8 rows: try verifying
    p.measured(8, True, 0.010, 20, fed=24)  # 2000 tokens/s verifying
    assert not p.speculate(8)  # no plain measurement yet: the baseline first
    p.measured(8, False, 0.004, 8)  # 2000 tokens/s decoding
    assert p.speculate(8)  # a tie goes to speculation
    for _ in range(30):
        p.measured(8, True, 0.010, 10, fed=24)  # verifying falls to 1000 tokens/s
    decisions = [p.speculate(8) for _ in range(200)]
    assert decisions.count(True) in range(1, 6)  # decode, but re-measure verifying now and then
    assert p.speculate(1)  # another bucket has its own measurements


def test_max_rows_caps_the_batch_that_speculates():
    p = SpeculationPolicy(max_draft=3, max_rows=8)
    assert p.speculate(8) and not p.speculate(9)
    with pytest.raises(ValueError, match="max_draft"):
        SpeculationPolicy(max_draft=0)
    with pytest.raises(ValueError, match="max_rows"):
        SpeculationPolicy(max_rows=0)


class _Req:
    def __init__(self, rid, prompt, out, max_new=64, constraint=None):
        self.rid, self.prompt, self.output_ids, self.constraint = rid, prompt, out, constraint
        self.params = type("P", (), {"max_new_tokens": max_new})()


def test_the_speculator_proposes_within_max_tokens_and_skips_constrained_requests():
    s = Speculator(SpeculativeSettings(enabled=True, max_draft=4))
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]
    rows = [_Req("a", prompt, []), _Req("b", prompt, [], max_new=2), _Req("c", prompt, [], constraint=object())]
    drafts = s.proposals(rows)
    assert drafts is not None
    assert drafts[0] is not None and drafts[0].tokens == (3, 4) and drafts[0].source == "prompt"  # a prior's length
    assert drafts[1] is not None and len(drafts[1].tokens) == 1  # room for one more token after the step's own
    assert drafts[2] is None  # a grammar's state cannot be rolled back: it decodes plainly
    s.verified(rows, drafts, [2, 0, 0])
    stats = s.stats()
    assert stats["proposed"]["prompt"] == 3 and stats["accepted"]["prompt"] == 2
    assert stats["fed"] == 3 + 2 + 1 and stats["emitted"] == 3 + 1 + 1
    assert stats["tokens_per_forward"] == pytest.approx(5 / 3)
    for r in rows:
        s.finish(r)
    assert s.drafts.stats()["live"] == 0


def test_a_step_feeds_the_proposal_length_that_pays_most():
    """A proposal whose fed tokens cost more than they are likely to give is dropped (a plain step):
    in a full batch where a fed token costs two rows' worth; the same proposal alone in the tail,
    where a fed token costs little, is verified whole; before the cost is measured at a batch
    size, proposals are verified as they are."""
    s = Speculator(SpeculativeSettings(enabled=True, max_draft=4))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    for _ in range(20):
        s.policy.accepted("a", 4, 4)  # request a's proposals always hold
    lone = [_Req("a", prompt, [])] + [_Req(f"x{i}", [9, 9 + i], []) for i in range(7)]
    assert s.proposals(lone) is not None  # the cost at 8 rows is not measured yet: verify
    s.policy.measured(8, False, 0.008, 8)  # 1 ms per row a plain step
    s.policy.measured(8, True, 0.024, 10, fed=16)  # 8 more fed tokens cost 16 ms: 2 rows' worth each
    assert s.proposals(lone) is None  # padding 7 rows to a's length costs more than a gains
    s.policy.measured(1, False, 0.001, 1)
    s.policy.measured(1, True, 0.0011, 3, fed=5)  # at one row a fed token costs 0.025 of a step
    alone = s.proposals([_Req("a", prompt, [])])
    assert alone is not None and alone[0].tokens == (3, 4, 5, 6)


def test_each_row_keeps_the_proposed_tokens_that_pay_at_this_batch():
    """The verifying forward is packed, so each row's proposal is cut on its own: a token is kept
    while the chance it is used (a^k) beats what it costs, priced at the step's tokens per unit of
    time. A row whose proposals hold keeps all four, a row accepted half of the time keeps one."""
    s = Speculator(SpeculativeSettings(enabled=True, max_draft=4))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    for _ in range(30):
        s.policy.accepted("good", 4, 4)
        s.policy.accepted("half", 2, 1)
    s.policy.measured(8, False, 0.008, 8)  # 1 ms per row a plain step
    s.policy.measured(8, True, 0.0104, 12, fed=16)  # 8 more fed tokens: 0.3 of a row's step each; it paid
    assert s.policy.token_cost(8) == pytest.approx(0.3)
    rows = [_Req("good", prompt, []), _Req("half", prompt, [])] + [_Req(f"x{i}", [9, 9 + i], []) for i in range(6)]
    drafts = s.proposals(rows)
    assert drafts is not None
    assert drafts[0].tokens == (3, 4, 5, 6)  # 0.97^4 = 0.88: worth it
    assert drafts[1].tokens == (3,)  # 0.5 is, 0.25 is not (below 0.3 at a rate above 1)
    assert all(d is None for d in drafts[2:])  # nothing to propose there
