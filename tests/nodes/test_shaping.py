"""nodes/shaping.py: the reward-shaping function nodes, on hand-built batches with the expected
values worked out by hand.

`overlong_penalty` counts generated tokens (loss_mask 1, tool output excluded) and ramps from
0 at `max_tokens - buffer_tokens` to `-penalty` at `max_tokens`; `weighted_sum` adds weighted
per-sequence keys. Each returns one key, `out_key`, on the same sequences."""

from __future__ import annotations

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.nodes.shaping import overlong_penalty, weighted_sum


def _batch(masks, **seqs) -> PackedBatch:
    return PackedBatch.from_sequences(
        {"input_ids": [[5] * len(m) for m in masks], "loss_mask": masks},
        seqs={k: torch.tensor(v) for k, v in seqs.items()},
    )


def _generated(n, prompt=2, tool_gap=0):
    """A prompt, then n generated tokens with `tool_gap` tool tokens (loss_mask 0) in the middle."""
    half = n // 2
    return [0] * prompt + [1] * half + [0] * tool_gap + [1] * (n - half)


def test_overlong_penalty_ramps_linearly_over_the_buffer():
    # max 10, buffer 4: free up to 6 generated tokens, -penalty from 10 on
    lengths = [0, 3, 6, 7, 8, 10, 12]
    batch = _batch([_generated(n) for n in lengths])
    out = overlong_penalty(batch, "shaped", max_tokens=10, buffer_tokens=4)
    assert out["shaped"].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    doubled = overlong_penalty(batch, "shaped", max_tokens=10, buffer_tokens=4, penalty=2.0)
    assert doubled["shaped"].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.5, -1.0, -2.0, -2.0])
    assert out.keys() == {"shaped"} and torch.equal(out.cu_seqlens, batch.cu_seqlens)
    assert out["shaped"].dtype == torch.float32


def test_overlong_penalty_counts_generated_tokens_not_prompt_or_tool_output():
    plain = _batch([_generated(8, prompt=2)])
    long_prompt_and_tool = _batch([_generated(8, prompt=30, tool_gap=50)])
    for b in (plain, long_prompt_and_tool):
        assert overlong_penalty(b, "r", max_tokens=10, buffer_tokens=4)["r"].tolist() == pytest.approx([-0.5])


def test_a_buffer_as_long_as_the_limit_penalises_from_the_first_token():
    out = overlong_penalty(_batch([_generated(n) for n in (0, 1, 2, 4)]), "r", max_tokens=4, buffer_tokens=4)
    assert out["r"].tolist() == pytest.approx([0.0, -0.25, -0.5, -1.0])


@pytest.mark.parametrize("max_tokens,buffer_tokens", [(10, 0), (10, 11), (10, -1)])
def test_overlong_penalty_refuses_a_buffer_outside_the_limit(max_tokens, buffer_tokens):
    with pytest.raises(ValueError, match=f"need 0 < buffer_tokens <= max_tokens, got {buffer_tokens}, {max_tokens}"):
        overlong_penalty(_batch([_generated(3)]), "r", max_tokens=max_tokens, buffer_tokens=buffer_tokens)


def test_weighted_sum_adds_weighted_keys_as_floats():
    batch = _batch([_generated(2)] * 3, correct=[1, 0, 1], overlong=[0.0, -0.5, -1.0], fmt=[True, True, False])
    out = weighted_sum(batch, "rewards", {"correct": 1.0, "overlong": 0.5, "fmt": -2})
    # 1 + 0 - 2 = -1; 0 - 0.25 - 2 = -2.25; 1 - 0.5 - 0 = 0.5
    assert out["rewards"].tolist() == pytest.approx([-1.0, -2.25, 0.5])
    assert out.keys() == {"rewards"} and torch.equal(out.cu_seqlens, batch.cu_seqlens)
    assert weighted_sum(batch, "r", {"correct": 3})["r"].tolist() == pytest.approx([3.0, 0.0, 3.0])
    assert batch["correct"].tolist() == [1, 0, 1]  # the inputs are not changed


def test_weighted_sum_names_what_it_cannot_use():
    batch = _batch([_generated(2)], correct=[1.0])
    with pytest.raises(ValueError, match="at least one key"):
        weighted_sum(batch, "r", {})
    with pytest.raises(KeyError, match="'loss_mask' is not a per-sequence key"):
        weighted_sum(batch, "r", {"loss_mask": 1.0})  # per-token keys do not count
    with pytest.raises(KeyError, match="'corect' is not a per-sequence key of the batch"):
        weighted_sum(batch, "r", {"corect": 1.0})
