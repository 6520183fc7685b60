"""StalenessGate: the (eta + v + 1) * B bound under random interleavings, eta = 0 is synchronous;
the rule's pure functions (staleness_rule.py) by hand."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.runtime.orchestration import staleness_rule
from areal_graph.runtime.orchestration.staleness import StalenessGate, version_range


def simulate(B, eta, max_conc, choices, in_order=False, reject_every=0):
    """Drive a gate with a generator and a FIFO trainer; `choices` picks the next action.

    Returns (staleness of every trained trajectory, per-step flags 'nothing was running').
    Checks the bound after every action.
    """
    gate = StalenessGate(B, eta, max_conc)
    running: list[int] = []  # submit versions, in submit order
    buffer: deque[int] = deque()
    v = 0
    accepted = finished = 0
    trained: list[int] = []
    idle_at_train: list[bool] = []
    for c in choices:
        action = c % 3
        if action == 0:
            if gate.capacity() >= 1:
                gate.on_submit(1)
                running.append(v)
        elif action == 1 and running:
            pick = 0 if in_order else (c // 3) % len(running)
            sv = running.pop(pick)
            finished += 1
            if reject_every and finished % reject_every == 0:
                gate.on_reject(1)
            else:
                gate.on_accept(1)
                accepted += 1
                buffer.append(sv)
        elif action == 2 and len(buffer) >= B:
            idle_at_train.append(not running)
            for _ in range(B):
                trained.append(v - buffer.popleft())
            v += 1
            gate.set_version(v)
        assert gate.running == len(running) and gate.accepted == accepted and gate.version == v
        assert gate.accepted + gate.running <= (eta + v + 1) * B == gate.bound(), "staleness bound exceeded"
        assert gate.running <= max_conc
        assert gate.capacity() == max(0, min(max_conc - len(running), (eta + v + 1) * B - accepted - len(running)))
    return trained, idle_at_train


choices_st = st.lists(st.integers(0, 10_000), min_size=1, max_size=400)


@settings(max_examples=200, deadline=None)
@given(
    B=st.integers(1, 6),
    eta=st.integers(0, 4),
    conc=st.integers(1, 30),
    choices=choices_st,
    reject_every=st.sampled_from([0, 3, 7]),
)
def test_bound_never_exceeded(B, eta, conc, choices, reject_every):
    simulate(B, eta, conc, choices, reject_every=reject_every)


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 6), conc=st.integers(1, 30), choices=choices_st, reject_every=st.sampled_from([0, 4]))
def test_eta_zero_is_synchronous(B, conc, choices, reject_every):
    """eta = 0, any completion order: each training step starts only when no generation is
    running, and trains only trajectories started at the current version (staleness 0)."""
    trained, idle = simulate(B, 0, conc, choices, reject_every=reject_every)
    assert all(s == 0 for s in trained)
    assert all(idle)


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 6), eta=st.integers(0, 4), conc=st.integers(1, 30), choices=choices_st)
def test_in_order_completion_keeps_staleness_within_eta(B, eta, conc, choices):
    trained, _ = simulate(B, eta, conc, choices, in_order=True)
    assert all(0 <= s <= eta for s in trained)


def test_capacity_formula_by_hand():
    g = StalenessGate(batch_size=4, max_staleness=1, max_concurrent=6)
    assert g.capacity() == 6  # min(6 - 0, 2*4 - 0)
    g.on_submit(6)
    assert g.capacity() == 0
    g.on_accept(5)
    assert g.capacity() == 2 - 0  # min(6 - 1, 8 - 6) = 2
    g.on_reject(1)  # dropped: slot back
    assert g.capacity() == 3  # min(6, 8 - 5)
    g.set_version(1)
    assert g.capacity() == 6  # min(6, 12 - 5) = 6
    with pytest.raises(RuntimeError, match="staleness bound exceeded"):
        g.on_submit(8)
    with pytest.raises(RuntimeError, match="only 0 were running"):
        g.on_accept(1)


def test_the_rule_by_hand():
    """The functions the gate and perfmodel/simulator.py share: the bound, what may be admitted
    (never negative), and which groups a step takes (the first in submission order, or none)."""
    assert staleness_rule.staleness_bound(max_staleness=1, version=2, batch_size=4) == 16  # (1 + 2 + 1) * 4
    assert staleness_rule.admissible(max_concurrent=6, running=1, accepted=5, bound=8) == 2  # min(5, 2)
    assert staleness_rule.admissible(max_concurrent=6, running=4, accepted=8, bound=8) == 0  # not -4
    assert staleness_rule.due_groups([3, 5, 6], 2) == [3, 5]
    assert staleness_rule.due_groups([3], 2) is None


def test_resume_like_the_controller():
    g = StalenessGate(8, 0, 4)
    g.set_version(3)
    g.on_submit(24)  # trajectories already trained: may exceed max_concurrent
    g.on_accept(24)
    assert g.capacity() == 4
    g2 = StalenessGate(8, 0, 4)
    g2.restore(version=3, accepted=24)
    assert (g2.version, g2.running, g2.accepted, g2.capacity()) == (g.version, g.running, g.accepted, 4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        StalenessGate(0, 1, 1)
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessGate(1, -1, 1)
    g = StalenessGate(2, 0, 8)
    with pytest.raises(ValueError, match="never succeed"):
        asyncio.run(g.wait_for_capacity(3))
    with pytest.raises(ValueError, match="backwards"):
        g.set_version(-1)


def test_async_wait_is_woken_from_another_thread():
    g = StalenessGate(2, 0, 2)
    g.on_submit(2)

    async def main():
        waiter = asyncio.create_task(g.wait_for_capacity(2))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        t = threading.Thread(target=lambda: (g.on_accept(2), g.set_version(1)))
        t.start()
        await asyncio.wait_for(waiter, 2.0)
        t.join()

    asyncio.run(main())
    assert g.capacity() == 2


def test_concurrent_submits_never_pass_the_bound():
    """on_submit checks the bound and counts under one lock: threads racing past a stale
    capacity() reading get RuntimeError, never an admission past (eta + v + 1) * B."""
    g = StalenessGate(5, 2, 1000)
    refused = []

    def worker():
        for _ in range(200):
            try:
                g.on_submit(1)
            except RuntimeError:
                refused.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert g.running == 15 and len(refused) == 800 - 15  # (2 + 0 + 1) * 5: reached, not passed
    g.on_accept(15)
    g.set_version(1)
    assert g.capacity() == 5


def test_version_range_against_a_loop():
    torch.manual_seed(0)
    cu = torch.tensor([0, 3, 8, 9, 13])
    versions = torch.randint(0, 6, (13,))
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1])
    versions[mask == 0] = -1
    vmin, vmax = version_range(versions, mask, cu)
    for i in range(4):
        vs = [int(versions[t]) for t in range(int(cu[i]), int(cu[i + 1])) if mask[t]]
        assert (int(vmin[i]), int(vmax[i])) == ((min(vs), max(vs)) if vs else (-1, -1))
    assert vmin.tolist()[2] == -1  # the third sequence generated nothing
    with pytest.raises(ValueError, match="cu_seqlens"):
        version_range(versions[:5], mask[:5], cu)
