"""Decode steps through `GraphedDecode` against the engine's eager decode.

On the CPU the static step runs eagerly (`capture=False`): that checks what a graph replays
(padding to a bucket, whole-buffer masks, the write column as a tensor, dropping the graphs
when the KV buffers move). The `gpu` test captures real CUDA graphs.
"""

from __future__ import annotations

import copy

import pytest
import torch

from areal_graph.engines.inference.cuda_graphs import GraphedDecode, buckets_for
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from support.tiny_models import build_spiky_qwen2

VOCAB = 128


def spiky_model(seed: int):
    return build_spiky_qwen2(seed, vocab_size=VOCAB)


def workload(n: int, seed: int) -> list[tuple[list[int], int]]:
    """Prompts of 3-60 tokens and 1-150 new tokens: rows join and leave at most steps, and the
    longest outgrow the KV buffers' first allocation (a non-in-place repack)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = torch.randint(3, VOCAB, (int(torch.randint(3, 60, (1,), generator=g)),), generator=g).tolist()
        out.append((p, int(torch.randint(1, 150, (1,), generator=g))))
    return out


def run(engine: EmbeddedEngine, reqs, swap_to=None) -> list:
    """Serve `reqs`; with `swap_to`, load those weights and serve them again (a swap between
    batches, so both engines see it at the same point)."""
    engine.start()
    try:
        out = []
        for weights in (None, swap_to) if swap_to is not None else (None,):
            if weights is not None:
                engine.update_weights_from_state_dict(weights.state_dict(), version=1)
            futs = [engine.submit(p, SamplingParams(max_new_tokens=n, greedy=True, ignore_eos=True)) for p, n in reqs]
            out += [f.result(timeout=120) for f in futs]
        return out
    finally:
        engine.stop()


def test_buckets_cover_every_batch_with_at_most_a_third_padding():
    for rows in (1, 7, 64, 256, 1000):
        b = buckets_for(rows)
        assert b == sorted(set(b)) and b[0] == 1 and b[-1] == rows
        for n in range(1, rows + 1):
            bucket = next(x for x in b if x >= n)
            assert bucket - n <= max(bucket // 3, 1) or bucket == rows or n <= 32
    assert buckets_for(256) == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]


@pytest.mark.parametrize("rows", [8, 64])
def test_static_steps_give_the_eager_tokens_through_joins_leaves_growth_and_a_weight_swap(rows):
    model, other = spiky_model(0), spiky_model(1)
    reqs = workload(24, seed=rows)
    eager = run(EmbeddedEngine(model=copy.deepcopy(model), max_running=rows), reqs, swap_to=other)
    graphed = EmbeddedEngine(model=copy.deepcopy(model), max_running=rows)
    runner = graphed._runner
    assert runner.graphs is None  # a CPU engine never captures
    runner.graphs = GraphedDecode(runner.lean, rows, graphed.max_context + 1, capture=False)
    seen_keys = []
    decode = runner.graphs.decode

    def spy(tokens, cache):
        out = decode(tokens, cache)
        seen_keys.append(runner.graphs._key)
        return out

    runner.graphs.decode = spy
    results = run(graphed, reqs, swap_to=other)
    for a, b in zip(eager, results):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs)) <= 1e-5
        assert a.output_versions == b.output_versions
    assert len(set(seen_keys)) >= 2  # the buffers grew at least once: the steps were rebuilt
    assert set(runner.graphs._steps) <= set(buckets_for(rows))


def test_weights_and_kv_buffers_keep_their_storage_across_a_swap():
    """What keeps graphs valid in an RL run: a weight swap copies in place and clears the cache
    without freeing its buffers, so the next steps replay the same graphs."""
    eng = EmbeddedEngine(model=spiky_model(0), max_running=8)
    runner = eng._runner
    runner.graphs = GraphedDecode(runner.lean, 8, eng.max_context + 1, capture=False)
    reqs = [(p, 20) for p, _ in workload(6, seed=5)]
    run(eng, reqs)
    key = runner.graphs._key
    eng.update_weights_from_state_dict(spiky_model(1).state_dict(), version=1)
    run(eng, reqs)
    assert runner.graphs._key == key


@pytest.mark.gpu
def test_captured_graphs_decode_the_eager_tokens_on_cuda():
    torch.backends.cuda.matmul.allow_tf32 = False
    model, other = spiky_model(0), spiky_model(1)
    reqs = workload(40, seed=7)
    eager = run(
        EmbeddedEngine(model=copy.deepcopy(model), device="cuda", max_running=32, cuda_graphs=False),
        reqs,
        swap_to=other,
    )
    eng = EmbeddedEngine(model=copy.deepcopy(model), device="cuda", max_running=32)
    results = run(eng, reqs, swap_to=other)
    assert eng._runner.graphs is not None and eng._runner.graphs.captures > 0
    for a, b in zip(eager, results):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs)) <= 1e-4
