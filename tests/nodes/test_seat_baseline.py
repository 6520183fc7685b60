"""`baseline: seat` of the advantage node (nodes/advantages.py): each seat of a prompt group gets
its own baseline, checked against a per-seat mean written out by hand, on random batches."""

from __future__ import annotations

import json
import random

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kinds.functions import AdvantageParams
from areal_graph.nodes.advantages import compute_advantages, seat_group_ids


def seated_batch(seed: int, n: int = 24) -> PackedBatch:
    rng = random.Random(seed)
    lens = [rng.randint(3, 9) for _ in range(n)]
    toks = [[rng.randint(0, 50) for _ in range(k)] for k in lens]
    mask = [[0, 0] + [1] * (k - 2) for k in lens]
    gids = [rng.randint(0, 3) for _ in range(n)]
    seats = [rng.randint(0, 1) for _ in range(n)]
    # a zero-sum game: seat 0 wins more often than seat 1
    rewards = [float(rng.choice((1, 1, 0, -1)) if s == 0 else rng.choice((1, 0, -1, -1))) for s in seats]
    return PackedBatch.from_sequences(
        {"input_ids": toks, "loss_mask": mask},
        seqs={"group_id": gids, "rewards": rewards},
        meta={"info": [json.dumps({"seat": s, "reward": r}) for s, r in zip(seats, rewards)]},
    )


def per_sequence(batch: PackedBatch, adv: torch.Tensor) -> list[float]:
    """The advantage of each sequence (the same on each of its generated tokens)."""
    out = []
    for i in range(batch.num_seqs):
        vals = adv[batch.cu_seqlens[i] : batch.cu_seqlens[i + 1]][batch.sequence(i, "loss_mask").bool()]
        assert torch.allclose(vals, vals[0].expand_as(vals))
        out.append(float(vals[0]))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_each_seat_of_a_group_has_its_own_baseline(seed, estimator):
    b = seated_batch(seed)
    seats = [json.loads(x)["seat"] for x in b.meta["info"]]
    gids, rewards = b["group_id"].tolist(), b["rewards"].tolist()
    got = per_sequence(
        b,
        compute_advantages(AdvantageParams(estimator=estimator, baseline="seat", normalize=False, group_std=False), b)[
            "advantages"
        ],
    )
    for i in range(b.num_seqs):
        peers = [rewards[k] for k in range(b.num_seqs) if gids[k] == gids[i] and seats[k] == seats[i]]
        if estimator == "grpo":
            expected = rewards[i] - sum(peers) / len(peers)
        else:  # leave-one-out mean of the same seat's peers; alone in its seat: no baseline to take
            expected = rewards[i] - (sum(peers) - rewards[i]) / (len(peers) - 1) if len(peers) > 1 else 0.0
        assert got[i] == pytest.approx(expected, abs=1e-6), (i, peers)


def test_with_one_seat_per_group_it_is_the_group_baseline():
    b = seated_batch(0)
    gids = b["group_id"].tolist()
    one_seat = [json.dumps({"seat": 0}) for _ in gids]
    b = PackedBatch(b.cu_seqlens, b.tokens, b.seqs, {"info": one_seat})
    a = compute_advantages(AdvantageParams(baseline="seat"), b)["advantages"]
    c = compute_advantages(AdvantageParams(baseline="group"), b)["advantages"]
    assert torch.allclose(a, c)


def test_seat_group_ids_separate_exactly_the_pairs():
    gids = torch.tensor([5, 5, 5, 7, 7, -1])
    ids = seat_group_ids(gids, [0, 1, 0, 1, 1, 0]).tolist()
    assert ids[0] == ids[2] and len({ids[0], ids[1], ids[3], ids[5]}) == 4 and ids[3] == ids[4]


def test_a_trajectory_without_a_seat_is_an_error_naming_what_writes_it():
    b = seated_batch(1)
    infos = list(b.meta["info"])
    infos[3] = json.dumps({"reward": 1.0})
    b = PackedBatch(b.cu_seqlens, b.tokens, b.seqs, {"info": infos})
    with pytest.raises(ValueError, match=r"sequence 3 has None \(TextArenaSelfPlay writes it"):
        compute_advantages(AdvantageParams(baseline="seat"), b)
