"""Generation-side node stats per step: counts add up over the calls, per-call means average."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_graph.runtime.orchestration.generation_stats import GenerationStats, is_mean


def test_counts_sum_and_means_average_then_start_over():
    acc = GenerationStats()
    acc.add({"rm_score/forwards": 2.0, "rm_score/mean": 0.2, "judge/failures": 1.0})
    acc.add({"rm_score/forwards": 3.0, "rm_score/mean": 0.6})
    acc.add({"rm_score/forwards": 1.0, "rm_score/mean": 0.7, "judge/failures": 0.0})
    assert acc.take() == pytest.approx({"rm_score/forwards": 6.0, "rm_score/mean": 0.5, "judge/failures": 1.0})
    assert acc.take() == {}


def test_which_keys_are_means():
    assert is_mean("rm/mean") and is_mean("x/len_mean") and is_mean("mean")
    assert not is_mean("judge/failures") and not is_mean("x/meaning") and not is_mean("mean/count")


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50))
def test_a_mean_of_scores_in_0_1_stays_in_0_1(values):
    acc = GenerationStats()
    for v in values:
        acc.add({"rm_score/mean": v})
    assert 0.0 <= acc.take()["rm_score/mean"] <= 1.0 + 1e-12
