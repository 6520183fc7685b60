"""The verifying forward (speculative decoding) and the ragged KV cache it leaves behind
(kv_cache.py: rows that kept fewer of the columns they were fed end before `end`).

Every logit of every fed position, and of every plain decode step in between, is checked
against the model run from scratch on that row's tokens so far, while rows keep random
numbers of their fed columns, leave (the rows that end at `end` among them), join, the cache
repacks and realigns; on the eager lean step and on the static step the CUDA graphs replay
(run eagerly here, `capture=False`)."""

from __future__ import annotations

import random

import pytest
import torch

from areal_graph.engines.inference.cuda_graphs import GraphedDecode
from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.model_runner import ModelRunner
from support.tiny_models import build_random_qwen2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_random_qwen2().eval()


def reference(model, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0].double()


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
@torch.inference_mode()
def test_verify_and_decode_on_ragged_rows_match_a_full_forward(model, graphs, seed):
    rng = random.Random(seed)
    v = model.config.vocab_size
    runner = ModelRunner(model, torch.device("cpu"), lean=True, cuda_graphs=False)
    if graphs:
        runner.graphs = GraphedDecode(runner.lean, 8, 4096, capture=False)
    cache = BatchedKVCache(row_capacity=8)
    seqs = [[rng.randrange(v) for _ in range(rng.randint(3, 12))] for _ in range(5)]
    _, keys, values, lens = runner.prefill([s[:-1] for s in seqs], 0)
    cache.append(keys, values, lens)
    done = [s[:-1] for s in seqs]  # each row's tokens in the cache
    last = [s[-1] for s in seqs]  # each row's next token to feed
    worst, ragged_seen = 0.0, False
    for step in range(120):
        if step % 3 == 2:
            logits = runner.decode(last, cache)
            for r in range(len(done)):
                done[r].append(last[r])
                worst = max(worst, float((logits[r].double() - reference(model, done[r])[-1]).abs().max()))
                last[r] = rng.randrange(v)
        else:
            same = rng.randint(1, 4) if step % 5 == 0 else None  # every row fed as many: the unpadded path
            fed = [
                [last[r]] + [rng.randrange(v) for _ in range(same if same else rng.randint(0, 4))]
                for r in range(len(done))
            ]
            logits = runner.verify(fed, cache)
            kept = [rng.randint(1, len(f)) for f in fed]
            assert logits.shape[0] == sum(len(f) for f in fed)  # packed: only real tokens
            at = 0
            for r, f in enumerate(fed):
                ref = reference(model, done[r] + f)[len(done[r]) :]
                worst = max(worst, float((logits[at : at + len(f)].double() - ref).abs().max()))
                at += len(f)
                done[r] += f[: kept[r]]
                last[r] = rng.randrange(v)
            cache.advance_rows(kept)
            ragged_seen |= cache.ragged
        assert cache.lens == [len(d) for d in done]
        if step in (40, 80):  # the rows that end at `end` leave: the others all lag
            gone = [r for r, lag in enumerate(cache.lags) if lag == 0][:1] or [0]
            order = cache.remove(gone)
            done, last = [done[i] for i in order], [last[i] for i in order]
        if step == 60:  # a row joins the ragged batch
            new = [rng.randrange(v) for _ in range(rng.randint(3, 20))]
            _, keys, values, lens = runner.prefill([new[:-1]], 0)
            cache.append(keys, values, lens)
            done.append(new[:-1])
            last.append(new[-1])
    assert ragged_seen and cache.repacks >= 1
    assert worst < 1e-5, worst


def test_advance_rows_tracks_ends_and_realign_closes_the_gaps():
    cache = BatchedKVCache(row_capacity=4)
    k = torch.randn(3, 2, 5, 4)
    cache.append([k], [k.clone()], [5, 3, 4])
    end = cache.end
    cache.advance_rows([3, 1, 2])  # rows fed 3 columns each, kept 3, 1 and 2
    assert cache.end == end + 3 and cache.lags == [0, 2, 1] and cache.lens == [8, 4, 6]
    assert cache.write_columns() == [end + 3, end + 1, end + 2]
    assert cache.width == 8 and cache.ragged
    mask = cache.query_mask(2)  # [B, 1, 2, width + 2]
    first_real = [0, 8 - 2 - 4, 8 - 1 - 6]
    for r in range(3):
        for q in range(2):
            seen = mask[r, 0, q].nonzero().flatten().tolist()
            assert seen == list(range(first_real[r], 8 - cache.lags[r] + q + 1))
    row1 = cache.keys[0][1, :, end - 3 : end + 1].clone()  # row 1's real columns before realigning
    cache.realign()
    assert not cache.ragged and cache.lens == [8, 4, 6]
    assert torch.equal(cache.keys[0][1, :, cache.end - 4 : cache.end], row1)
    with pytest.raises(ValueError, match="one count >= 1 per row"):
        cache.advance_rows([1, 0, 1])
