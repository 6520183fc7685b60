"""Per-source means (runtime/observability/source_metrics.py) against sums written out by hand."""

from __future__ import annotations

import pytest

from areal_graph.runtime.observability.source_metrics import means_by_source, source_tag


def test_means_per_source_with_tags_that_stay_one_level_deep():
    got = means_by_source(
        "reward",
        "mean",
        [1.0, 0.0, 0.5, 1.0, 0.0],
        ["openai/gsm8k", "openai/gsm8k", "lighteval/MATH", "", "lighteval/MATH"],
    )
    assert got == {
        "reward/by_source/openai_gsm8k/mean": 0.5,
        "reward/by_source/lighteval_MATH/mean": 0.25,
        "reward/by_source/_none_/mean": 1.0,
    }
    assert source_tag("a b/c:d") == "a_b_c_d" and source_tag("gsm8k-v1.2") == "gsm8k-v1.2" and source_tag("") == "_"


def test_no_sources_no_keys_and_lengths_must_agree():
    assert means_by_source("eval", "accuracy", [1.0, 0.0], ["", ""]) == {}
    with pytest.raises(ValueError, match="2 values for 1 sources"):
        means_by_source("eval", "accuracy", [1.0, 0.0], ["a"])
