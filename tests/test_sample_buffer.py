"""SampleBuffer: whole groups, oldest first, exact batch sizes, blocking, full accounting."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.orchestration.sample_buffer import SampleBuffer


def group(gid: int, size: int, version: int, length: int = 3, sample_base: int = 0) -> PackedBatch:
    """A prompt group: `size` trajectories, prompt token then generated tokens of `version`."""
    return PackedBatch.from_sequences(
        {
            "input_ids": [[gid] * length for _ in range(size)],
            "loss_mask": [[0] + [1] * (length - 1) for _ in range(size)],
            "versions": [[-1] + [version] * (length - 1) for _ in range(size)],
        },
        seqs={"group_id": [gid] * size, "sample_id": [sample_base + i for i in range(size)]},
        meta={"answer": [str(gid)] * size},
    )


def test_oldest_first_whole_groups_exact_size():
    buf = SampleBuffer()
    buf.put(group(1, 2, version=3))
    buf.put(group(2, 2, version=1))
    buf.put(group(3, 2, version=2))
    buf.put(group(4, 2, version=1))
    out = buf.get(4)
    assert out.num_seqs == 4
    assert out["group_id"].tolist() == [2, 2, 4, 4]  # version 1 twice, arrival order breaks the tie
    assert out["input_ids"].tolist() == [2] * 6 + [4] * 6
    assert buf.get(4)["group_id"].tolist() == [3, 3, 1, 1]
    assert buf.size() == 0


def test_group_that_would_overshoot_is_skipped_not_split():
    buf = SampleBuffer()
    buf.put(group(1, 3, version=0))
    buf.put(group(2, 2, version=1))
    buf.put(group(3, 1, version=2))
    out = buf.get(4)  # 3 (oldest) + 2 overshoots; 3 + 1 fits
    assert sorted(out["group_id"].tolist()) == [1, 1, 1, 3]
    assert buf.size() == 2


def test_a_multi_group_put_is_split_into_groups():
    buf = SampleBuffer()
    buf.put(PackedBatch.concat([group(7, 2, 5), group(8, 2, 0)]))
    assert buf.num_groups() == 2
    assert buf.get(2)["group_id"].tolist() == [8, 8]
    assert buf.oldest_version() == 5


def test_get_blocks_until_enough_and_times_out():
    buf = SampleBuffer()
    buf.put(group(1, 2, 0))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="not available within"):
        buf.get(4, timeout=0.1)
    assert time.monotonic() - t0 >= 0.09
    assert buf.size() == 2  # nothing taken on timeout

    def later():
        time.sleep(0.05)
        buf.put(group(2, 2, 1))

    threading.Thread(target=later).start()
    assert buf.get(4, timeout=5)["group_id"].tolist() == [1, 1, 2, 2]


def test_get_async_wakes_on_put_from_thread_and_cancel_takes_nothing():
    buf = SampleBuffer()

    async def main():
        waiter = asyncio.create_task(buf.get_async(4, group_size=2))
        await asyncio.sleep(0.02)
        threading.Thread(target=lambda: buf.put(group(1, 2, 0))).start()
        await asyncio.sleep(0.05)
        assert not waiter.done()
        threading.Thread(target=lambda: buf.put(group(2, 2, 0))).start()
        out = await asyncio.wait_for(waiter, 2)
        assert out.num_seqs == 4
        cancelled = asyncio.create_task(buf.get_async(2))
        await asyncio.sleep(0.02)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        buf.put(group(3, 2, 0))
        await asyncio.sleep(0.02)
        with pytest.raises(TimeoutError):
            await buf.get_async(4, timeout=0.05)

    asyncio.run(main())
    assert buf.size() == 2  # the cancelled get took nothing


def test_bad_requests_are_clear_errors():
    buf = SampleBuffer()
    buf.put(group(1, 4, 0))
    with pytest.raises(ValueError, match="more than the batch size 2"):
        buf.get(2)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        buf.get(6, group_size=4)
    other = PackedBatch.from_sequences({"input_ids": [[1, 2]]}, seqs={"group_id": [9]})
    with pytest.raises(ValueError, match="different keys"):
        buf.put(other)


def test_drain_and_stats():
    buf = SampleBuffer()
    assert buf.drain() is None
    buf.put(group(1, 2, 1))
    buf.put(group(2, 2, 0))
    buf.put(group(3, 2, 2))
    buf.get(2)
    rest = buf.drain()
    assert rest["group_id"].tolist() == [1, 1, 3, 3]
    s = buf.stats()
    assert (s.put_trajectories, s.taken_trajectories, s.drained_trajectories, s.buffered_trajectories) == (6, 2, 4, 0)
    assert s.balanced()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 4), st.integers(0, 5)), max_size=60),
       batch=st.integers(1, 8))
def test_accounting_and_content_model(ops, batch):
    """Against a plain-list model: every sample id leaves exactly once, each get is oldest-first."""
    buf = SampleBuffer()
    model: list[tuple[int, int, int, list[int]]] = []  # (version, arrival, gid, sample ids)
    next_sample = 0
    left: list[int] = []
    for gid, (is_put, size, version) in enumerate(ops):
        if is_put or size > batch:
            size = min(size, batch)
            buf.put(group(gid, size, version, sample_base=next_sample))
            model.append((version, gid, gid, list(range(next_sample, next_sample + size))))
            next_sample += size
            continue
        model.sort()
        picked, total = [], 0
        for entry in model:
            if total + len(entry[3]) <= batch:
                picked.append(entry)
                total += len(entry[3])
                if total == batch:
                    break
        if total < batch:
            with pytest.raises(TimeoutError):
                buf.get(batch, timeout=0)
            continue
        out = buf.get(batch, timeout=0)
        assert out["sample_id"].tolist() == [s for e in picked for s in e[3]]
        left += out["sample_id"].tolist()
        model = [e for e in model if e not in picked]
    drained = buf.drain()
    if drained is not None:
        left += drained["sample_id"].tolist()
    assert sorted(left) == list(range(next_sample))
    assert buf.stats().balanced()


def test_concurrent_producers_and_consumer_lose_nothing():
    buf = SampleBuffer()
    got: list[int] = []

    def producer(base):
        for k in range(50):
            buf.put(group(base + k, 2, k % 3, sample_base=(base + k) * 2))

    def consumer():
        for _ in range(50):
            got.extend(buf.get(4, timeout=10)["sample_id"].tolist())

    threads = [threading.Thread(target=producer, args=(b,)) for b in (0, 1000)] + [threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 200 and len(set(got)) == 200 and buf.size() == 0
    assert torch.tensor(got).unique().numel() == 200
