"""nodes/filters.py: DAPO's dynamic sampling drops exactly the prompt groups whose rewards are
all equal (within `tol`) and returns only the ids of the kept sequences.

tests/runtime/orchestration/test_controller.py runs the filter inside a whole (in-process)
run; here it is a pure function on hand-built batches, with the kept ids worked out by hand."""

from __future__ import annotations

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.nodes.filters import drop_uniform_groups


def _batch(groups, rewards, key="rewards", lens=None) -> PackedBatch:
    lens = lens or [2 + i % 3 for i in range(len(groups))]
    return PackedBatch.from_sequences(
        {"input_ids": [[7] * n for n in lens], "loss_mask": [[0] + [1] * (n - 1) for n in lens]},
        seqs={
            "group_id": torch.tensor(groups, dtype=torch.int64),
            "sample_id": torch.tensor([100 + i for i in range(len(groups))], dtype=torch.int64),
            key: torch.tensor(rewards),
        },
        meta={"answer": [str(g) for g in groups]},
    )


def test_uniform_groups_are_dropped_and_mixed_ones_kept_whole():
    #          group: 0     0    1    1    2    2    2    3
    batch = _batch([0, 0, 1, 1, 2, 2, 2, 3], [1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.25, 0.0])
    out = drop_uniform_groups(batch)
    # group 0: all 1; group 3: one answer (nothing to compare); groups 1 and 2 differ inside
    assert out["group_id"].tolist() == [1, 1, 2, 2, 2]
    assert out["sample_id"].tolist() == [102, 103, 104, 105, 106]
    assert out.keys() == {"group_id", "sample_id"}  # a filter writes no keys of its own
    assert out.seqlens().tolist() == batch.seqlens()[2:7].tolist()  # the kept sequences, as they were


def test_groups_need_not_be_contiguous_or_sorted():
    batch = _batch([9, 4, 9, 4, 7, 7], [0.0, 2.0, 1.0, 2.0, 3.0, 3.0])
    out = drop_uniform_groups(batch)
    assert out["sample_id"].tolist() == [100, 102]  # only group 9 mixes rewards; order kept
    assert out["group_id"].tolist() == [9, 9]


@pytest.mark.parametrize("gap,kept", [(5e-7, False), (2e-6, True)])
def test_differences_within_tol_count_as_equal(gap, kept):
    batch = _batch([0, 0], [0.5, 0.5 + gap])
    assert drop_uniform_groups(batch).num_seqs == (2 if kept else 0)
    assert drop_uniform_groups(batch, tol=1e-9).num_seqs == 2
    assert drop_uniform_groups(batch, tol=0.1).num_seqs == 0


def test_another_key_and_boolean_values_can_decide():
    batch = _batch([0, 0, 1, 1], [True, False, True, True], key="correct")
    assert drop_uniform_groups(batch, key="correct")["group_id"].tolist() == [0, 0]
    with pytest.raises(KeyError, match="rewards"):
        drop_uniform_groups(batch)


def test_every_group_uniform_leaves_an_empty_batch_and_an_empty_batch_stays_empty():
    out = drop_uniform_groups(_batch([0, 0, 1, 1], [1.0, 1.0, 0.0, 0.0]))
    assert out.num_seqs == 0 and out["sample_id"].numel() == 0
    empty = PackedBatch.from_sequences(
        {"input_ids": []},
        seqs={
            "group_id": torch.zeros(0, dtype=torch.int64),
            "sample_id": torch.zeros(0, dtype=torch.int64),
            "rewards": torch.zeros(0),
        },
    )
    assert drop_uniform_groups(empty).num_seqs == 0


def test_a_batch_without_sample_ids_returns_the_group_ids_only():
    batch = _batch([0, 0, 1, 1], [1.0, 0.0, 1.0, 1.0])
    del batch.seqs["sample_id"]
    out = drop_uniform_groups(batch)
    assert out.keys() == {"group_id"} and out["group_id"].tolist() == [0, 0]
