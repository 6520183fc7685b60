"""SampleBuffer: whole groups, taken exactly as asked or not at all, full accounting."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.orchestration.sample_buffer import SampleBuffer


def group(gid: int, size: int, length: int = 3, sample_base: int = 0) -> PackedBatch:
    """A prompt group: `size` trajectories, a prompt token then generated tokens."""
    return PackedBatch.from_sequences(
        {
            "input_ids": [[gid] * length for _ in range(size)],
            "loss_mask": [[0] + [1] * (length - 1) for _ in range(size)],
        },
        seqs={"group_id": [gid] * size, "sample_id": [sample_base + i for i in range(size)]},
        meta={"answer": [str(gid)] * size},
    )


def test_groups_come_out_in_the_order_asked_not_the_order_put():
    buf = SampleBuffer()
    for gid in (3, 1, 2):
        buf.put(group(gid, 2, sample_base=10 * gid))
    out = buf.take_groups([2, 3])
    assert out["group_id"].tolist() == [2, 2, 3, 3] and out["sample_id"].tolist() == [20, 21, 30, 31]
    assert out["answer"] == ["2", "2", "3", "3"]
    assert buf.size() == 2 and len(buf) == 2


def test_missing_group_takes_nothing():
    buf = SampleBuffer()
    buf.put(group(1, 2))
    assert buf.take_groups([1, 7]) is None and buf.take_groups([]) is None
    assert buf.size() == 2  # group 1 is still there
    assert buf.take_groups([1])["group_id"].tolist() == [1, 1]
    assert buf.take_groups([1]) is None  # a group leaves once


def test_a_multi_group_put_is_split_into_whole_groups():
    buf = SampleBuffer()
    mixed = PackedBatch.concat([group(8, 2, sample_base=0), group(5, 3, sample_base=2)])
    buf.put(mixed)
    assert buf.stats().buffered_groups == 2
    assert buf.take_groups([5])["sample_id"].tolist() == [2, 3, 4]
    assert buf.take_groups([8])["sample_id"].tolist() == [0, 1]


def test_bad_puts_are_clear_errors():
    buf = SampleBuffer()
    buf.put(group(1, 2))
    with pytest.raises(ValueError, match="already buffered"):
        buf.put(group(1, 2))
    other = PackedBatch.from_sequences({"input_ids": [[1, 2]]}, seqs={"group_id": [9]})
    with pytest.raises(ValueError, match=r"different keys.*missing \['answer', 'loss_mask', 'sample_id'\]"):
        buf.put(other)
    with pytest.raises(ValueError, match="no per-sequence `group_id`"):
        buf.put(PackedBatch.from_sequences({"input_ids": [[1, 2]]}))
    assert buf.stats().put_groups == 1  # nothing of a refused batch went in


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), max_size=30), seed=st.integers(0, 2**16))
def test_accounting_against_a_plain_model(sizes, seed):
    """Random puts and takes (some asking for absent groups): every sample id leaves at most
    once, exactly with its group, and the counters always balance."""
    rnd = random.Random(seed)
    buf, present, next_sample, taken = SampleBuffer(), {}, 0, []
    for gid, size in enumerate(sizes):
        buf.put(group(gid, size, sample_base=next_sample))
        present[gid] = list(range(next_sample, next_sample + size))
        next_sample += size
        if rnd.random() < 0.5:
            want = rnd.sample(range(gid + 2), k=rnd.randint(1, 2))
            out = buf.take_groups(want)
            if all(g in present for g in want):
                assert out["sample_id"].tolist() == [s for g in want for s in present.pop(g)]
                taken += out["sample_id"].tolist()
            else:
                assert out is None
        s = buf.stats()
        assert s.balanced() and s.buffered_trajectories == sum(map(len, present.values())) == buf.size()
    assert sorted(taken + [s for ids in present.values() for s in ids]) == list(range(next_sample))


def test_concurrent_producers_and_consumer_lose_nothing():
    buf = SampleBuffer()
    got: list[int] = []

    def producer(base):
        for k in range(50):
            buf.put(group(base + k, 2, sample_base=(base + k) * 2))

    def consumer():
        wanted = [g for k in range(50) for g in (k, 1000 + k)]
        while wanted:
            out = buf.take_groups(wanted[:2])
            if out is not None:
                got.extend(out["sample_id"].tolist())
                wanted = wanted[2:]

    threads = [threading.Thread(target=producer, args=(b,)) for b in (0, 1000)] + [threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 200 and len(set(got)) == 200 and buf.size() == 0
    assert buf.stats() == buf.stats().__class__(200, 100, 200, 50, 0, 0)
