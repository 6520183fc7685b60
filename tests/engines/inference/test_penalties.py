"""Frequency, presence and repetition penalties against plain-loop references (vLLM's definitions).

The batched function against a token-by-token Python loop; the embedded engine against full
float64 forwards with the reference penalties applied at every step, so the reported
behaviour log-prob is checked to be that of the penalised distribution the token came from.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.penalties import apply_penalties
from support.tiny_models import build_spiky_qwen2

VOCAB = 128


def _double(model):
    return copy.deepcopy(model).double().eval()


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, VOCAB, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def reference_penalised(logits: list[float], params: SamplingParams, prompt: list[int], out: list[int]) -> list[float]:
    """One row, one token at a time: repetition over prompt + answer, frequency and presence over the answer."""
    got = list(logits)
    seen = set(prompt) | set(out)
    for t in range(len(got)):
        x = got[t]
        if t in seen and params.repetition_penalty != 1:
            x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
        n = out.count(t)
        x -= params.frequency_penalty * n + (params.presence_penalty if n else 0.0)
        got[t] = x
    return got


@pytest.mark.parametrize("seed", range(6))
def test_the_batched_penalties_equal_a_plain_loop(seed):
    rng = random.Random(seed)
    b, v = 5, 40
    logits = torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3
    logits[0, 3] = float("-inf")  # a masked token stays masked
    params = [
        SamplingParams(
            frequency_penalty=rng.uniform(-2, 2),
            presence_penalty=rng.uniform(-2, 2),
            repetition_penalty=rng.choice([1.0, rng.uniform(0.5, 2.0)]),
        )
        for _ in range(b - 1)
    ]
    params.append(SamplingParams())  # a row without penalties is untouched
    prompts_ = [[rng.randrange(v) for _ in range(rng.randint(0, 8))] for _ in range(b)]
    outs = [[rng.randrange(v) for _ in range(rng.randint(0, 12))] for _ in range(b)]
    got = apply_penalties(logits, params, prompts_, outs)
    for i in range(b):
        ref = reference_penalised(logits[i].tolist(), params[i], prompts_[i], outs[i])
        for a, r in zip(got[i].tolist(), ref):
            assert (a == r == float("-inf")) or math.isclose(a, r, rel_tol=1e-5, abs_tol=1e-5)
    assert torch.equal(got[-1], logits[-1])
    assert apply_penalties(logits, [SamplingParams()] * b, prompts_, outs) is logits  # nothing to do: no copy


def _reference_run(model, prompt: list[int], out: list[int], params: SamplingParams, temperature: float):
    """Log-probs of `out` under the penalised, temperature-scaled distribution, from full float64
    forwards (no cache), and the greedy choice at every step."""
    m = model
    lps, argmaxes = [], []
    with torch.no_grad():
        for k in range(len(out)):
            raw = m(torch.tensor([prompt + out[:k]])).logits[0, -1].tolist()
            pen = torch.tensor(reference_penalised(raw, params, prompt, out[:k]), dtype=torch.float64)
            lps.append(float(torch.log_softmax(pen / temperature, -1)[out[k]]))
            argmaxes.append(int(pen.argmax()))
    return lps, argmaxes


@pytest.fixture(scope="module")
def model():
    return build_spiky_qwen2(0, vocab_size=VOCAB)


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_the_engine_samples_from_the_penalised_distribution_and_reports_its_logprob(model, kind):
    eng = EmbeddedEngine(None, model=model, max_running=8)
    eng.start()
    try:
        penalties = [
            dict(repetition_penalty=1.3),
            dict(frequency_penalty=0.8),
            dict(presence_penalty=1.5),
            dict(frequency_penalty=-0.5, presence_penalty=0.7, repetition_penalty=0.8),
        ]
        ps = prompts(len(penalties), seed=7)
        temperature = 1.0 if kind == "greedy" else 0.8
        params = [
            SamplingParams(
                max_new_tokens=16, ignore_eos=True, greedy=kind == "greedy", temperature=temperature, seed=i, **pen
            )
            for i, pen in enumerate(penalties)
        ]
        futs = [eng.submit(p, sp) for p, sp in zip(ps, params)]  # one batch: rows with different penalties
        reference = _double(model)
        plain = eng.submit(
            ps[0],
            SamplingParams(
                max_new_tokens=16, ignore_eos=True, greedy=kind == "greedy", temperature=temperature, seed=0
            ),
        ).result(timeout=60)
        for p, sp, f in zip(ps, params, futs):
            res = f.result(timeout=60)
            ref_lp, ref_greedy = _reference_run(reference, p, res.output_ids, sp, temperature)
            assert max(abs(a - b) for a, b in zip(res.output_logprobs, ref_lp)) <= 1e-4
            if kind == "greedy":
                assert res.output_ids == ref_greedy
        assert futs[0].result().output_ids != plain.output_ids  # the penalty changed what was generated
    finally:
        eng.stop()


def test_penalties_out_of_range_are_named():
    assert any("frequency_penalty" in p for p in SamplingParams(frequency_penalty=2.5).problems())
    assert any("presence_penalty" in p for p in SamplingParams(presence_penalty=-3).problems())
    assert any("repetition_penalty" in p for p in SamplingParams(repetition_penalty=0).problems())
    assert not SamplingParams(frequency_penalty=-2, presence_penalty=2, repetition_penalty=0.1).problems()
