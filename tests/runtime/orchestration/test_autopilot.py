"""runtime/orchestration/autopilot.py: the concurrency rule on scripted steps (raise while the
trainer waits, lower while a batch is always buffered, undo a change that made it slower, stay
within the staleness bound and the servers' rows), and in the simulator on a workload where the
starting concurrency is too low."""

from __future__ import annotations

import dataclasses

from areal_graph.perfmodel.simulator import simulate
from areal_graph.runtime.orchestration.autopilot import ConcurrencyAutopilot
from areal_graph.runtime.orchestration.staleness import StalenessGate


def _pilot(start: int = 16, eta: int = 4, rows: int = 1 << 30) -> ConcurrencyAutopilot:
    return ConcurrencyAutopilot(batch_size=32, group_size=8, max_staleness=eta, start=start, engine_rows=rows)


def _window(p: ConcurrencyAutopilot, step0: int, wait: float, step: float, buffered: int = 0):
    out = None
    for k in range(p.window):
        got = p.observe(step0 + k, wait, step, 32, buffered)
        out = got if got is not None else out
    return out


def test_a_waiting_trainer_gets_one_group_more_up_to_the_bound():
    p = _pilot(start=16, eta=1)
    assert _window(p, 0, wait=0.5, step=0.5) == 24 and p.decisions[-1].why.startswith("the trainer waited 50%")
    assert _window(p, 5, wait=0.4, step=0.5) == 32
    for k in range(10, 60, 5):
        _window(p, k, wait=0.4, step=0.5)
    assert p.limit == p.ceiling == 64  # (eta + 1) B


def test_a_busy_trainer_with_a_full_buffer_gets_one_group_fewer_down_to_one_group():
    p = _pilot(start=32)
    assert _window(p, 0, wait=0.0, step=0.3, buffered=64) == 24
    for k in range(5, 60, 5):
        _window(p, k, wait=0.0, step=0.3, buffered=64)
    assert p.limit == p.floor == 8
    q = _pilot(start=32)
    assert _window(q, 0, wait=0.0, step=0.3, buffered=0) is None  # nothing piled up: leave it


def test_a_change_that_made_it_slower_is_undone_and_that_way_rests():
    p = _pilot(start=16)
    assert _window(p, 0, wait=0.5, step=0.5) == 24  # 32 trajectories / 1 s a step
    undone = _window(p, 5, wait=0.9, step=0.9)  # slower since: 32 per 1.8 s
    assert undone == 16 and "undone" in p.decisions[-1].why
    assert _window(p, 10, wait=0.5, step=0.5) is None  # raising rests for a few windows


def test_the_servers_rows_cap_it_and_the_gate_takes_a_new_limit():
    p = _pilot(start=16, eta=8, rows=40)
    assert p.ceiling == 40
    gate = StalenessGate(batch_size=32, max_staleness=4, max_concurrent=16)
    gate.on_submit(16)
    assert gate.capacity() == 0
    gate.set_max_concurrent(24)
    assert gate.capacity() == 8


def test_in_the_simulator_it_recovers_from_too_little_concurrency():
    from areal_graph.perfmodel.cost_model import CostModel, LengthModel, SidePlacement
    from areal_graph.perfmodel.fits import LinearFit
    from areal_graph.perfmodel.simulator import SimConfig

    groups = [[v, 20, [10, 12, 40, 90]] for v in range(60)]
    costs = CostModel(
        machine_cores=[0, 1],
        inference=SidePlacement(None, 1),
        training=SidePlacement(None, 1),
        decode_ms=LinearFit(["1", "rows"], [1.0, 0.02]),
        prefill_ms=LinearFit.constant(2.0),
        model_calls={"train": LinearFit.constant(0.02)},
        lengths=LengthModel(6, 128, groups),
    )
    cfg = SimConfig(steps=60, batch_size=16, group_size=4, max_staleness=4, max_concurrent=4, max_running=64)
    fixed = simulate(cfg, costs, passes=1)
    piloted = simulate(dataclasses.replace(cfg, autopilot=True), costs, passes=1)
    assert piloted.steps_window_s < 0.8 * fixed.steps_window_s
    assert any(n.startswith("autopilot at step") for n in piloted.notes) and piloted.staleness_max <= 4
