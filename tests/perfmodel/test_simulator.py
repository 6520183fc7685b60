"""perfmodel/simulator.py against a step computed by hand, and the controller's invariants
(the staleness bound, synchronous RL at eta 0, concurrency) over many settings; the simulator
admits and picks groups by the gate's own rule (runtime/orchestration/staleness_rule.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.perfmodel.cost_model import CostModel, LengthModel, SidePlacement
from areal_graph.perfmodel.fits import LinearFit
from areal_graph.perfmodel.simulator import ADMIT_WAIT_S, SimConfig, Simulation, simulate
from areal_graph.runtime.orchestration import staleness_rule
from areal_graph.runtime.orchestration.staleness import StalenessGate


def _costs(
    length: int = 10,
    prompt: int = 20,
    decode_ms: float = 2.0,
    prefill_ms: float = 5.0,
    train_s: float = 0.1,
    spread: bool = False,
) -> CostModel:
    groups = [[v, prompt, [length + (7 * j if spread and j == 3 else 0) for j in range(4)]] for v in range(40)]
    return CostModel(
        machine_cores=[0, 1],
        inference=SidePlacement(None, 1),
        training=SidePlacement(None, 1),
        decode_ms=LinearFit.constant(decode_ms),
        prefill_ms=LinearFit.constant(prefill_ms),
        model_calls={"train": LinearFit.constant(train_s)},
        sync_s=0.01,
        lengths=LengthModel(6, 64, groups),
    )


def _cfg(**kw) -> SimConfig:
    base = dict(steps=10, batch_size=4, group_size=4, max_staleness=0, max_concurrent=64, max_running=64)
    return SimConfig(**{**base, **kw})


def test_a_synchronous_step_adds_up_as_worked_out_by_hand():
    """One group of 4 answers of 10 tokens: the burst wait, one prefill (shared by the group)
    giving the first token and the first decode in the same step (2 tokens), then 8 more decode
    steps; then training and the weight sync; nothing else costs."""
    r = simulate(_cfg(), _costs(), passes=1)
    generation = ADMIT_WAIT_S + (5.0 + 2.0) / 1e3 + 8 * 2.0 / 1e3
    step = generation + 0.1 + 0.01
    assert r.step_s_median == pytest.approx(step, rel=1e-9)
    assert r.steps_window_s == pytest.approx(10 * step, rel=1e-9)
    assert r.staleness_mean == 0 and r.step_bound == {"generation": 10, "training": 0}


def test_the_engines_work_between_forwards_is_charged_per_step_row_prefill_and_request():
    """The same step by hand with the engine's work outside its forwards (costs.py
    `_engine_overheads`): each decode step pays its loop and its rows' bookkeeping, the prefill
    forward its sampling and cache join, each new request its own; with one request running at a
    time the group's four answers are four prefills, each paying it, and the last three wait for
    the admission right after a finish."""
    costs = dataclasses.replace(
        _costs(),
        engine_step_overhead_ms=0.2,
        engine_row_overhead_ms=0.05,
        engine_prefill_overhead_ms=1.5,
        engine_request_overhead_ms=0.3,
    )
    r = simulate(_cfg(), costs, passes=1)
    decode = 2.0 + 0.2 + 4 * 0.05
    generation = ADMIT_WAIT_S + (5.0 + 1.5 + 4 * 0.3 + decode) / 1e3 + 8 * decode / 1e3
    assert r.step_s_median == pytest.approx(generation + 0.1 + 0.01, rel=1e-9)
    one_at_a_time = simulate(_cfg(max_running=1), costs, passes=1).step_s_median
    without = simulate(_cfg(max_running=1), dataclasses.replace(costs, engine_prefill_overhead_ms=0.0), passes=1)
    assert one_at_a_time - without.step_s_median == pytest.approx(4 * 1.5 / 1e3, rel=1e-9)
    # the second to fourth answers are each admitted right after the one before finished
    waits = dataclasses.replace(costs, engine_admit_after_finish_ms=0.7)
    assert simulate(_cfg(max_running=1), waits, passes=1).step_s_median - one_at_a_time == pytest.approx(
        3 * 0.7 / 1e3, rel=1e-9
    )
    assert simulate(_cfg(), waits, passes=1).step_s_median == pytest.approx(r.step_s_median, rel=1e-12)


def test_asynchrony_hides_training_behind_generation():
    sync = simulate(_cfg(), _costs(), passes=1)
    async_ = simulate(_cfg(max_staleness=2), _costs(), passes=1)
    gen = ADMIT_WAIT_S + 7e-3 + 16e-3
    # generation (~25 ms a batch) is shorter than training (100 ms): async is bound by training
    assert async_.steps_window_s == pytest.approx(10 * 0.11, rel=0.1)
    assert sync.steps_window_s == pytest.approx(10 * (gen + 0.11), rel=1e-6)
    assert async_.step_bound["training"] >= 8 and 0 < async_.staleness_mean <= 2


def test_recomputing_the_kv_cache_at_each_update_costs_prefills_and_keeping_it_does_not():
    costs = _costs(length=60, train_s=0.02)
    recompute = simulate(_cfg(max_staleness=2, batch_size=8), costs, passes=1)
    keep = simulate(dataclasses.replace(_cfg(max_staleness=2, batch_size=8), kv_on_update="keep"), costs, passes=1)
    assert recompute.reprefill_tokens > 0 and keep.reprefill_tokens == 0
    assert keep.steps_window_s < recompute.steps_window_s


def test_waiting_for_requests_in_flight_at_an_update_reprefills_nothing_and_is_slower_than_keeping():
    """kv_on_update="wait": no request is interrupted (nothing re-prefilled), but the engine admits
    nothing while the longest request in flight finishes, so the run takes longer than "keep"."""
    costs = _costs(length=60, train_s=0.02)
    cfg = _cfg(max_staleness=2, batch_size=8)
    keep = simulate(dataclasses.replace(cfg, kv_on_update="keep"), costs, passes=1)
    wait = simulate(dataclasses.replace(cfg, kv_on_update="wait"), costs, passes=1)
    assert wait.reprefill_tokens == 0
    assert wait.steps_window_s > keep.steps_window_s


@settings(max_examples=60, deadline=None)
@given(
    eta=st.integers(0, 6),
    groups_per_step=st.integers(1, 4),
    concurrency=st.integers(1, 6),
    running=st.integers(1, 64),
    spread=st.booleans(),
    order=st.sampled_from(["submission", "completion"]),
)
def test_staleness_never_exceeds_eta_and_eta_zero_is_synchronous(
    eta, groups_per_step, concurrency, running, spread, order
):
    G = 4
    cfg = _cfg(
        steps=8,
        batch_size=G * groups_per_step,
        max_staleness=eta,
        max_concurrent=G * concurrency,
        max_running=running,
        batch_order=order,
    )
    r = simulate(cfg, _costs(spread=spread, train_s=0.01), passes=1)
    assert r.staleness_max <= eta
    if eta == 0:
        assert r.staleness_max == 0 and r.step_bound["generation"] == 8
    assert r.requests >= 8 * cfg.batch_size


def test_pinning_the_trainer_onto_the_engines_core_slows_both():
    costs = _costs(length=40, train_s=0.05)
    spread_out = _cfg(max_staleness=2, inference=SidePlacement([0], 1), training=SidePlacement([1], 1))
    crowded = _cfg(max_staleness=2, inference=SidePlacement([0], 1), training=SidePlacement([0], 1))
    a, b = simulate(spread_out, costs, passes=1), simulate(crowded, costs, passes=1)
    assert b.steps_window_s > a.steps_window_s * 1.2


def _capacities(cfg: SimConfig) -> list[tuple[int, int]]:
    """(the gate's capacity, the simulation's) in every state the gate can reach: at versions
    0-2, with accepted and running trajectories in whole groups, as far as the gate admits them."""
    sim = Simulation(cfg, _costs())
    G, out = cfg.group_size, []
    for version in range(3):
        for accepted in range(0, 4 * cfg.batch_size, G):
            for running in range(0, cfg.max_concurrent + G, G):
                gate = StalenessGate(cfg.batch_size, cfg.max_staleness, cfg.max_concurrent)
                gate.restore(version, accepted)
                if accepted + running > gate.bound():
                    continue  # on_submit would refuse it: not a state of the run
                gate.on_submit(running)
                sim.version, sim.accepted, sim.running = version, accepted, running
                out.append((gate.capacity(), sim.capacity()))
    return out


RULES = {
    "as shipped": {},
    "a bound without eta": {"staleness_bound": lambda eta, version, batch: (version + 1) * batch},
    "one group fewer": {
        "admissible": lambda mc, running, accepted, bound: max(min(mc - running, bound - (accepted + running)) - 4, 0)
    },
}


@pytest.mark.parametrize("rule", RULES)
def test_the_simulator_admits_exactly_what_the_gate_admits_whatever_the_rule(monkeypatch, rule):
    """The gate and the simulator share one rule: change it (here, swapped in staleness_rule) and
    both follow, state by state. A simulator that re-typed the formula would keep the old one."""
    cfg = _cfg(batch_size=8, max_staleness=1, max_concurrent=12)
    shipped = _capacities(cfg)
    for name, fn in RULES[rule].items():
        monkeypatch.setattr(staleness_rule, name, fn)
    caps = _capacities(cfg)
    assert len(caps) > 10 and all(gate == sim for gate, sim in caps), caps
    assert (caps == shipped) == (rule == "as shipped")  # each swapped rule changes what is admitted


def test_a_rule_without_eta_makes_the_simulated_run_synchronous(monkeypatch):
    """The swapped bound reaches the whole simulated run: eta 2 trains nothing stale."""
    stale = simulate(_cfg(max_staleness=2), _costs(), passes=1)
    monkeypatch.setattr(staleness_rule, "staleness_bound", RULES["a bound without eta"]["staleness_bound"])
    assert StalenessGate(4, 2, 64).bound() == 4
    sync = simulate(_cfg(max_staleness=2), _costs(), passes=1)
    assert stale.staleness_max > 0 and sync.staleness_max == 0
    assert sync.step_bound == {"generation": 10, "training": 0}


def test_the_simulated_trainer_picks_its_groups_by_the_controllers_rule(monkeypatch):
    """`_next_batch` (submission order) is `staleness_rule.due_groups`, as the controller's is
    (tests/runtime/orchestration/test_controller.py checks that side)."""
    calls = []
    due_groups = staleness_rule.due_groups

    def recording(untrained, wanted):
        calls.append(([g.gid for g in untrained], wanted))
        return due_groups(untrained, wanted)

    monkeypatch.setattr(staleness_rule, "due_groups", recording)
    simulate(_cfg(batch_size=8, max_staleness=1), _costs(), passes=1)
    assert len(calls) >= 10 and {wanted for _, wanted in calls} == {2}
    assert all(gids == sorted(gids) for gids, _ in calls)  # submission order


def test_background_bursts_on_the_engines_cores_slow_its_steps_and_pinning_them_away_does_not():
    """cpu.py `preemption` in the simulator: 0.8 cores of light load spread over 2 cores takes 0.4
    of the engine's core (each step 1/0.6 as long), where the fluid model alone saw room to spare;
    the same load pinned to the other core leaves the engine pinned to its own alone."""
    import dataclasses

    from areal_graph.perfmodel.cost_model import CostModel, LengthModel, SidePlacement
    from areal_graph.perfmodel.fits import LinearFit
    from areal_graph.perfmodel.simulator import SimConfig, simulate

    base = CostModel(
        decode_ms=LinearFit(["1", "rows"], [1.0, 0.05]),
        prefill_ms=LinearFit.constant(2.0),
        machine_cores=[0, 1],
        lengths=LengthModel(groups=[[0, 20, [30] * 8]] * 8, max_new_tokens=64),
    )
    bursty = dataclasses.replace(base, background_cpu={"rollout": {"rate_cores": 0.8, "side": "other"}})
    cfg = SimConfig(steps=10, max_staleness=0, machine_cores=[0, 1])
    quiet, slowed = simulate(cfg, base).steps_window_s, simulate(cfg, bursty).steps_window_s
    assert 1.2 < slowed / quiet < 1 / 0.6 + 1e-9  # the decode steps x1.67; the training side is not preempted
    apart = dataclasses.replace(
        cfg, inference=SidePlacement(cores=[0]), training=SidePlacement(cores=[1]), other=SidePlacement(cores=[1])
    )
    assert simulate(apart, bursty).steps_window_s == pytest.approx(simulate(apart, base).steps_window_s)
