"""Packed batches for engine tests: random sequences, and GRPO-shaped groups (shared answer
starts, duplicates, masked tool spans, the pad token inside a sequence)."""

from __future__ import annotations

import random

from areal_graph.data.packed import PackedBatch


def random_batch(n=10, seed=0, vocab=128) -> PackedBatch:
    rng = random.Random(seed)
    toks, mask = [], []
    for _ in range(n):
        p, r = rng.randint(2, 8), rng.randint(1, 30)
        toks.append([rng.randint(3, vocab - 1) for _ in range(p + r)])
        mask.append([0] * p + [1] * r)
    return PackedBatch.from_sequences({"input_ids": toks, "loss_mask": mask})


def grpo_batch(groups=3, answers=4, seed=0, vocab=128) -> PackedBatch:
    """`groups` prompts x `answers` answers; answers of a group share a random-length start,
    one answer is duplicated, and some answers have a masked "tool output" span."""
    rng = random.Random(seed)
    toks, mask = [], []
    for _ in range(groups):
        prompt = [rng.randint(1, vocab - 1) for _ in range(rng.randint(3, 9))]
        common = [rng.randint(1, vocab - 1) for _ in range(rng.randint(0, 6))]
        group = []
        for a in range(answers):
            own = [rng.randint(1, vocab - 1) for _ in range(rng.randint(1, 20))]
            if a == 1:
                own[0] = 0  # the pad token inside a sequence
            resp = common[: rng.randint(0, len(common))] + own
            m = [1] * len(resp)
            if a % 3 == 2 and len(resp) > 4:
                m[1:3] = [0, 0]  # tool output inside the answer: not trained on
            group.append((prompt + resp, [0] * len(prompt) + m))
        group.append(group[0])  # an exact duplicate: fully shared
        for t, m in group:
            toks.append(t)
            mask.append(m)
    toks.append([5])  # a one-token sequence: nothing to predict
    mask.append([0])
    return PackedBatch.from_sequences({"input_ids": toks, "loss_mask": mask})
