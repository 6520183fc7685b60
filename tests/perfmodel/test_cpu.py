"""perfmodel/cpu.py: the fluid CPU-sharing model, against cases worked out by hand and properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.perfmodel.cpu import Demand, core_loads, preemption, slowdown

CORES = [0, 1]


def test_alone_or_with_room_to_spare_nothing_slows():
    assert slowdown(Demand(1, frozenset({0})), [], CORES) == 1.0
    assert slowdown(Demand(1), [Demand(1)], CORES) == 1.0  # two unpinned threads, two cores
    assert slowdown(Demand(1, frozenset({0})), [Demand(1, frozenset({1}))], CORES) == 1.0


def test_sharing_a_core_halves_each_and_background_counts_by_its_size():
    assert slowdown(Demand(1, frozenset({0})), [Demand(1, frozenset({0}))], CORES) == 2.0
    assert slowdown(Demand(1, frozenset({0})), [Demand(0.5, frozenset({0}))], CORES) == 1.5
    # unpinned background goes to the free core first: the pinned job is not slowed
    assert slowdown(Demand(1, frozenset({0})), [Demand(0.5)], CORES) == 1.0
    # three unpinned threads on two cores: each runs at 2/3
    assert abs(slowdown(Demand(1), [Demand(1), Demand(1)], CORES) - 1.5) < 1e-12


def test_a_two_thread_job_on_one_core_takes_twice_as_long():
    assert slowdown(Demand(2, frozenset({0})), [], CORES) == 2.0


def test_unpinned_demand_is_poured_onto_the_least_loaded_cores():
    load = core_loads([Demand(1, frozenset({0})), Demand(1.5)], [0, 1, 2])
    assert load == {0: 1.0, 1: 1.0, 2: 1.0} or abs(sum(load.values()) - 2.5) < 1e-12
    assert abs(sum(load.values()) - 2.5) < 1e-12 and max(load.values()) - min(load.values()) <= 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.01, 3), st.sampled_from([None, (0,), (1,), (0, 1)])), max_size=6),
    st.floats(0.1, 2),
    st.sampled_from([None, (0,), (1,), (0, 1)]),
)
def test_slowdown_is_at_least_one_and_grows_with_more_demand(others, amount, where):
    job = Demand(amount, frozenset(where) if where else None)
    demands = [Demand(a, frozenset(w) if w else None) for a, w in others]
    s = slowdown(job, demands, CORES)
    assert s >= 1.0
    assert slowdown(job, demands + [Demand(1.0, job.where)], CORES) >= s - 1e-9
    loads = core_loads([job, *demands], CORES)
    assert abs(sum(loads.values()) - amount - sum(d.amount for d in demands)) < 1e-6


def test_light_load_preempts_the_job_by_the_share_that_lands_on_its_cores():
    """cpu.py `preemption`: bursty background work takes its share of the job's cores even where
    the fluid model has room (the run at 64 requests: 0.8 cores of it made decode steps ~1.6x)."""
    job = Demand(1)
    assert preemption(job, [], CORES) == 1.0
    assert abs(preemption(job, [Demand(0.8)], CORES) - 1 / (1 - 0.4)) < 1e-12  # spread: 0.4 per core
    pinned = Demand(1, frozenset({0}))
    assert preemption(pinned, [Demand(0.5, frozenset({1}))], CORES) == 1.0  # all of it on the other core
    assert abs(preemption(pinned, [Demand(0.5, frozenset({0}))], CORES) - 2.0) < 1e-12  # all of it on the job's
    assert preemption(job, [Demand(10.0)], CORES) == 1 / (1 - 0.8)  # capped: never infinite


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 2), st.sampled_from([None, (0,), (1,), (0, 1)])), max_size=5),
    st.sampled_from([None, (0,), (1,)]),
    st.floats(0.01, 1),
)
def test_preemption_is_at_least_one_bounded_and_grows_with_the_light_load(light, where, more):
    job = Demand(1, frozenset(where) if where else None)
    demands = [Demand(a, frozenset(w) if w else None) for a, w in light]
    p = preemption(job, demands, CORES)
    assert 1.0 <= p <= 5.0 + 1e-9
    assert preemption(job, demands + [Demand(more, job.where)], CORES) >= p - 1e-12
