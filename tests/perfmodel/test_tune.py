"""perfmodel/tune.py: the placements and concurrencies it tries, and a search that ranks them
(never above the staleness it is given) on a workload where the answer is known."""

from __future__ import annotations

from areal_graph.perfmodel.cost_model import CostModel, LengthModel, SidePlacement
from areal_graph.perfmodel.fits import LinearFit
from areal_graph.perfmodel.simulator import SimConfig
from areal_graph.perfmodel.tune import concurrency_options, placements, search


def test_placements_on_two_cores_and_on_sixteen():
    two = placements([0, 1])
    assert [label for label, *_ in two][0] == "shared" and len(two) == 4
    assert two[1][1] == ["resources.inference.cores=[0]", "resources.training.cores=[1]", "resources.other.cores=[0]"]
    sixteen = placements(list(range(16)))
    assert len(sixteen) == 1 + 3 * 3 and all(len(ov) >= 2 for _, ov, _ in sixteen[1:])
    assert placements([0]) == [("shared", [], {})]


def test_concurrency_in_whole_groups_up_to_what_eta_allows():
    cfg = SimConfig(batch_size=32, group_size=8, max_concurrent=64)
    assert concurrency_options(cfg, 0) == [16, 32]
    assert concurrency_options(cfg, 4) == [16, 32, 48, 64, 96, 128, 160]
    assert all(c % 8 == 0 for c in concurrency_options(cfg, 2))


def test_the_search_finds_asynchrony_where_training_hides_behind_generation():
    groups = [[v, 20, [10, 12, 30, 60]] for v in range(40)]
    costs = CostModel(
        machine_cores=[0, 1],
        inference=SidePlacement(None, 1),
        training=SidePlacement(None, 1),
        decode_ms=LinearFit(["1", "rows"], [1.0, 0.02]),
        prefill_ms=LinearFit.constant(2.0),
        model_calls={"train": LinearFit.constant(0.05)},
        lengths=LengthModel(6, 64, groups),
    )
    base = SimConfig(steps=20, batch_size=16, group_size=4, max_staleness=0, max_concurrent=16, max_running=64)
    sync_only = search(base, costs, max_staleness=0, top=3, seeds=1)
    assert all("runtime.max_staleness" not in " ".join(c.overrides) for c in sync_only.ranked)
    result = search(base, costs, max_staleness=3, top=3, seeds=1)
    best = result.ranked[0]
    assert best.window_s < 0.85 * result.given.window_s and best.cfg.max_staleness > 0
    assert best.staleness <= best.cfg.max_staleness <= 3
    assert [c.window_s for c in result.ranked] == sorted(c.window_s for c in result.ranked)
