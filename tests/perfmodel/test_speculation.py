"""perfmodel/speculation.py and speculative decoding in the simulator: the verifying step's
price against numbers worked out by hand, acceptance read off a trace's shadow records, the
cost model's JSON with and without it (old calibration files price no speculation), and the
simulated engine: speculating on nothing accepted is never faster, on much accepted with cheap
fed tokens it is; `tune` searches it only when the calibration measured acceptance."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from areal_graph.engines.inference.speculation.policy import SpeculationPolicy
from areal_graph.graph.loader import load_workflow
from areal_graph.perfmodel.cost_model import CostModel, LengthModel, SidePlacement, describe_costs
from areal_graph.perfmodel.costs import shadow_acceptance
from areal_graph.perfmodel.fits import LinearFit
from areal_graph.perfmodel.simulator import SimConfig, simulate
from areal_graph.perfmodel.speculation import (
    MIN_PROPOSALS,
    PRIOR_COST,
    Acceptance,
    BucketAcceptance,
    CannotPriceSpeculation,
    best_draft,
    expected_accepted,
    fed_token_ms,
    policy_length,
    sample_accepted,
    verify_step_ms,
)
from areal_graph.perfmodel.tune import search
from areal_graph.perfmodel.workflow_config import config_from_spec
from areal_graph.trace_analysis.trace_model import Timeline

REPO = Path(__file__).resolve().parents[2]
PREFILL = LinearFit(["1", "padded_k", "padded_x_width_m"], [1.0, 40.0, 20.0])


def _acceptance(positions: list[float], rate: float, proposals: int = 1000, draft: int = 4) -> Acceptance:
    """Every bucket 1..64 with the same counts: `rate` of the rows asked propose, position j
    accepted with positions[j] once reached."""
    reached, accepted = [], []
    left = float(proposals)
    for p in positions[:draft]:
        reached.append(round(left))
        accepted.append(round(left * p))
        left *= p
    one = {"tries": round(proposals / rate) if rate else 10 * proposals, "proposals": proposals if rate else 0}
    one |= {"reached": reached if rate else [0] * draft, "accepted_at": accepted if rate else [0] * draft}
    return Acceptance(draft, 16, {str(2**i): dict(one) for i in range(7)})


def _costs(speculation: Acceptance | None = None, prefill: LinearFit = PREFILL, length: int = 60) -> CostModel:
    groups = [[v, 20, [length, length // 2, length + 20, 10]] for v in range(40)]
    return CostModel(
        machine_cores=[0, 1],
        inference=SidePlacement(None, 1),
        training=SidePlacement(None, 1),
        decode_ms=LinearFit(["1", "rows"], [2.0, 0.05]),
        prefill_ms=prefill,
        model_calls={"train": LinearFit.constant(0.05)},
        sync_s=0.01,
        lengths=LengthModel(6, 128, groups),
        speculation=speculation,
    )


def _cfg(**kw) -> SimConfig:
    base = dict(steps=12, batch_size=8, group_size=4, max_staleness=1, max_concurrent=16, max_running=16)
    return SimConfig(**{**base, **kw})


# ------------------------------------------------------------------ the formulas
def test_a_fed_token_costs_the_prefill_fits_marginal_token_at_the_decode_window():
    # per padded token 40 ms / 1k, per padded token x window 20 ms / 1M: at a window of 200,
    # 0.040 + 0.004 ms a token; the fixed cost of a chunk is not a token's
    assert fed_token_ms(PREFILL, 200) == pytest.approx(0.044)
    assert fed_token_ms(PREFILL, 0) == pytest.approx(0.040)
    # a plain step of 3 ms over its rows, 10 proposed tokens besides each row's last one
    assert verify_step_ms(3.0, PREFILL, 10, 200) == pytest.approx(3.44)
    assert verify_step_ms(3.0, PREFILL, 0, 200) == 3.0  # nothing proposed: the plain step


def test_expected_accepted_is_the_sum_of_the_chances_of_reaching_each_position():
    positions = [0.5, 0.5, 1.0]
    assert expected_accepted(positions, 1) == pytest.approx(0.5)
    assert expected_accepted(positions, 2) == pytest.approx(0.5 + 0.25)
    assert expected_accepted(positions, 3) == pytest.approx(0.5 + 0.25 + 0.25)
    assert expected_accepted(positions, 6) == expected_accepted(positions, 3)  # not counted: never accepted
    rng = random.Random(3)
    draws = [sample_accepted(rng, positions, 3) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(1.0, rel=0.03)
    assert max(draws) == 3 and min(draws) == 0


def test_the_verdict_follows_the_engines_policy_to_its_steady_state():
    # the proposal length rule is the engine's own: a fresh request (acceptance 1/2, cost 1/4) proposes 2
    assert policy_length(0.5, PRIOR_COST, 4) == SpeculationPolicy(4).draft_length("fresh", 8) == 2
    assert policy_length(0.9, 0.5, 16) == 6 and policy_length(0.3, 0.5, 4) == 0
    sure = BucketAcceptance(1.0, [1.0, 1.0, 1.0, 1.0])
    # 4 rows, plain step 4 ms, a fed token 0.5 ms: every row proposes 4 (each token is surely used),
    # the step takes 4 + 16 x 0.5 = 12 ms for 4 x 5 tokens, and the cost the engine measures is 1/2
    cheap = best_draft(4, sure, 4.0, 0.5, 4)
    assert (cheap.draft, cheap.share) == (4, 1.0) and cheap.verify_rate == pytest.approx(20 / 12)
    assert cheap.plain_rate == 1.0 and cheap.cost == pytest.approx(0.5) and cheap.verifies
    # a fed token dearer than a plain step per row: measured so, nothing is worth proposing
    dear = best_draft(4, sure, 4.0, 4.0, 4)
    assert not dear.verifies and dear.draft == 0 and dear.cost == 4.0
    # what verifying costs whatever is fed counts in the cost the engine measures, and against it
    assert not best_draft(4, BucketAcceptance(1.0, [0.1] * 4), 4.0, 0.0, 4, fixed_ms=1.0).verifies
    nothing = best_draft(8, BucketAcceptance(0.5, [0.0] * 4), 4.0, 0.0, 4)
    assert not nothing.verifies  # free tokens that are never accepted do not pay either
    # the engine judges by accepted per tried token (here 2 of 3: positions 1, 2 always, 3 never) as
    # if acceptance were geometric, so it proposes past the position that is always rejected; what
    # comes out is priced by position (2 tokens accepted a row)
    cut = best_draft(4, BucketAcceptance(1.0, [1.0, 1.0, 0.0, 0.0]), 4.0, 0.1, 4)
    assert cut.draft >= 3 and cut.verify_rate == pytest.approx(4 * 3 / (4 + 4 * cut.draft * 0.1))


# ------------------------------------------------------------------ acceptance from the trace
def _shadow(process: str, ts: float, by_rows: dict[str, dict]) -> dict:
    return {"name": "speculation_shadow", "process": process, "ts": ts, "args": {"every": 16, "by_rows": by_rows}}


def test_acceptance_is_read_off_each_servers_latest_shadow_record_and_added_up():
    one = {"tries": 100, "proposals": 40, "reached": [40, 24, 12, 4], "accepted_at": [24, 12, 4, 2]}
    old = {"tries": 5, "proposals": 2, "reached": [2, 1, 0, 0], "accepted_at": [1, 0, 0, 0]}
    other = {"tries": 30, "proposals": 10, "reached": [10, 5, 2, 1], "accepted_at": [5, 2, 1, 0]}
    thin = {"tries": 9, "proposals": 3, "reached": [3, 1, 0, 0], "accepted_at": [1, 0, 0, 0]}
    tl = Timeline(
        spans=[],
        profiles=[
            _shadow("inference-0", 1.0, {"8": old}),
            _shadow("inference-0", 2.0, {"8": one, "64": one}),  # running counts: the latest holds the older
            _shadow("inference-1", 1.5, {"8": other, "1": thin}),
            {"name": "engine_steps", "process": "inference-0", "ts": 0.0, "args": {"steps": []}},
        ],
    )
    acc = shadow_acceptance(tl)
    assert acc is not None and acc.max_draft == 4 and acc.every == 16 and list(acc.buckets) == ["1", "8", "64"]
    assert acc.buckets["8"] == {
        "tries": 130,
        "proposals": 50,
        "reached": [50, 29, 14, 5],
        "accepted_at": [29, 14, 5, 2],
    }
    at8 = acc.at(8)
    assert at8.buckets == [8] and at8.proposals == 50 >= MIN_PROPOSALS
    assert at8.rate == pytest.approx(50 / 130)
    assert at8.positions == pytest.approx([29 / 50, 14 / 29, 5 / 14, 2 / 5])
    # a bucket with no counts takes the nearest one (by powers of two) that holds MIN_PROPOSALS
    at32 = acc.at(20)
    assert at32.buckets == [64] and at32.positions == pytest.approx([24 / 40, 12 / 24, 4 / 12, 2 / 4])
    # a thin bucket is pooled with its nearest neighbours until they hold MIN_PROPOSALS
    at1 = acc.at(1)
    assert at1.buckets == [1, 8] and at1.rate == pytest.approx(53 / 139)
    assert at1.positions == pytest.approx([30 / 53, 14 / 30, 5 / 14, 2 / 5])
    assert shadow_acceptance(Timeline(spans=[])) is None


def test_the_cost_model_round_trips_speculation_and_old_files_load_without_it():
    old = CostModel.from_json((REPO / "benchmarks" / "reference" / "costs-longtail-2core.json").read_text())
    assert old.speculation is None and old.verify_ms is None and old.verify_check == {}
    assert any("not priceable" in row[1] for row in describe_costs(old))
    costs = _costs(_acceptance([0.8, 0.7, 0.6, 0.5], 0.4))
    costs.verify_ms = LinearFit(["1", "rows", "extra_k", "extra_x_width_m"], [0.3, 0.01, 30.0, 100.0], n=12)
    again = CostModel.from_json(costs.to_json())
    assert again == costs and again.speculation is not None
    assert again.speculation.at(16) == costs.speculation.at(16)  # type: ignore[union-attr]
    assert any(row[0].startswith("speculation at 16 rows") for row in describe_costs(again))


def test_an_old_calibration_cannot_price_speculation_and_says_so():
    old = CostModel.from_json((REPO / "benchmarks" / "reference" / "costs-longtail-2core.json").read_text())
    cfg = _cfg(machine_cores=old.machine_cores, speculative=True)
    with pytest.raises(CannotPriceSpeculation, match="no shadow acceptance"):
        simulate(cfg, old, passes=1)
    assert simulate(dataclasses.replace(cfg, speculative=False), old, passes=1).steps_window_s > 0


# ------------------------------------------------------------------ the simulated engine
def test_speculating_on_nothing_accepted_is_never_faster():
    plain = simulate(_cfg(), _costs(_acceptance([0.0] * 4, 0.5)), passes=1)
    # nothing ever proposed: no verifying step, the same run to the tick
    silent = simulate(_cfg(speculative=True), _costs(_acceptance([0.0] * 4, 0.0)), passes=1)
    assert silent.steps_window_s == pytest.approx(plain.steps_window_s, rel=1e-12)
    assert silent.speculation["verifying_steps"] == 0
    # proposals that are never accepted: the policy tries them and explores them again now and then,
    # paying for their tokens, and decodes plainly otherwise
    wasted = simulate(_cfg(speculative=True), _costs(_acceptance([0.0] * 4, 0.5)), passes=1)
    assert wasted.steps_window_s >= plain.steps_window_s
    sp = wasted.speculation
    assert 0 < sp["verifying_steps"] and sp["verifying_share"] < 0.1 and sp["tokens_per_row_forward"] == 1.0
    assert wasted.requests == plain.requests


def test_speculating_on_much_accepted_with_cheap_fed_tokens_is_faster():
    cheap = LinearFit(["1", "padded_k", "padded_x_width_m"], [1.0, 2.0, 0.0])  # 0.002 ms a fed token
    costs = _costs(_acceptance([0.9, 0.9, 0.9, 0.9], 0.8), prefill=cheap)
    plain = simulate(_cfg(), costs, passes=1)
    fast = simulate(_cfg(speculative=True), costs, passes=1)
    assert fast.steps_window_s < 0.8 * plain.steps_window_s
    sp = fast.speculation
    assert sp["verifying_share"] > 0.9 and sp["tokens_per_row_forward"] > 2.5
    assert fast.tokens_per_s > plain.tokens_per_s
    # the same acceptance with fed tokens as dear as a plain step: the policy stays plain
    dear = _costs(_acceptance([0.9, 0.9, 0.9, 0.9], 0.8), prefill=LinearFit(["1", "padded_k"], [1.0, 2500.0]))
    slow = simulate(_cfg(speculative=True), dear, passes=1)
    assert slow.speculation["verifying_share"] < 0.1
    # max_rows: no speculation above it
    capped = simulate(_cfg(speculative=True, speculative_max_rows=1), costs, passes=1)
    assert capped.speculation["verifying_share"] < sp["verifying_share"]


def test_accepted_tokens_are_drawn_per_row_from_the_seed():
    costs = _costs(_acceptance([0.7, 0.6, 0.5, 0.4], 0.6), prefill=LinearFit(["1", "padded_k"], [1.0, 2.0]))
    a = simulate(_cfg(speculative=True, seed=5), costs, passes=1)
    b = simulate(_cfg(speculative=True, seed=5), costs, passes=1)
    c = simulate(_cfg(speculative=True, seed=6), costs, passes=1)
    assert a.steps_window_s == b.steps_window_s and a.speculation == b.speculation
    assert a.speculation != c.speculation


def test_the_workflows_speculative_settings_reach_the_simulator():
    wf = REPO / "workflows" / "ppo_async_longtail.yaml"
    costs = _costs()
    off = config_from_spec(load_workflow(wf, []), costs, machine_cores=[0, 1])
    on = config_from_spec(
        load_workflow(wf, ["inference.speculative.enabled=true", "inference.speculative.max_draft=6"]),
        costs,
        machine_cores=[0, 1],
    )
    assert not off.speculative and on.speculative and on.max_draft == 6 and on.speculative_max_rows is None


# ------------------------------------------------------------------ the search
def test_tune_searches_speculation_only_when_asked_and_the_calibration_measured_acceptance():
    base = _cfg(steps=8, max_staleness=0, max_concurrent=8, max_running=8)
    without = search(base, _costs(), max_staleness=1, top=3, seeds=1, search_speculative=True)
    assert not without.speculation_searched and "no shadow acceptance" in without.speculation_note
    assert all("inference.speculative" not in " ".join(c.overrides) for c in without.ranked)
    cheap = LinearFit(["1", "padded_k", "padded_x_width_m"], [1.0, 2.0, 0.0])
    costs = _costs(_acceptance([0.9, 0.9, 0.9, 0.9], 0.8), prefill=cheap)
    not_asked = search(base, costs, max_staleness=1, top=3, seeds=1)
    assert not not_asked.speculation_searched and "--search-speculative" in not_asked.speculation_note
    assert all("inference.speculative" not in " ".join(c.overrides) for c in not_asked.ranked)
    got = search(base, costs, max_staleness=1, top=3, seeds=1, search_speculative=True)
    assert got.speculation_searched and got.speculation_note == ""
    best = got.ranked[0]
    assert best.cfg.speculative and "inference.speculative.enabled=true" in best.overrides
    with pytest.raises(CannotPriceSpeculation):
        search(dataclasses.replace(base, speculative=True), _costs(), max_staleness=0, top=1, seeds=1)
