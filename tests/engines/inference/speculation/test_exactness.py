"""Speculative decoding changes nothing but speed (issue 46): the same tokens, log-probs and
versions as plain decoding, on the shipped kits' test prompts and on a random model, greedy and
sampled, with penalties, stop strings, top log-probs and max tokens; the acceptance rule samples
exactly the target distribution (chi-square); and the behaviour log-probs equal a float64
forward's."""

from __future__ import annotations

import random

import pytest
import torch

from areal_graph.data.datasets import load_prompts
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.requests import Request
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings
from areal_graph.engines.inference.token_intake import take_verified
from areal_graph.modelkit.kit_cache import ensure_kit
from areal_graph.modelkit.recipes import BUILTIN_KITS
from support.tiny_models import build_random_qwen2

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ON = SpeculativeSettings(enabled=True)
SHIPPED = ["tiny-arith", "tiny-arith-long", "tiny-arith-ladder"]


def generate(engine_args: dict, requests: list[tuple[list[int], SamplingParams]], spec: bool, top: int = 0):
    with EmbeddedEngine(**engine_args, speculative=ON if spec else None) as eng:
        futs = [eng.submit(ids, p, top_logprobs=top) for ids, p in requests]
        results = [f.result(timeout=600) for f in futs]
        return results, eng.stats()


@pytest.fixture(scope="module", params=SHIPPED)
def shipped_kit(request, tmp_path_factory):
    kit = ensure_kit(BUILTIN_KITS[request.param], root=tmp_path_factory.mktemp("cache"))
    engine = EmbeddedEngine(str(kit.path / "model"))
    prompts, _ = load_prompts(kit.path / "data" / "test.jsonl", engine.tokenizer)
    return request.param, str(kit.path / "model"), [p.input_ids for p in prompts[:500]]


def test_greedy_answers_to_500_test_prompts_are_token_identical(shipped_kit):
    name, model, prompts = shipped_kit
    assert len(prompts) == 500
    greedy = SamplingParams(max_new_tokens=96, temperature=0.0)
    plain, _ = generate({"model_path": model, "max_running": 64}, [(p, greedy) for p in prompts], spec=False)
    spec, stats = generate({"model_path": model, "max_running": 64}, [(p, greedy) for p in prompts], spec=True)
    differ = [i for i, (a, b) in enumerate(zip(plain, spec)) if a.output_ids != b.output_ids]
    assert not differ, f"{name}: {len(differ)} answers differ, first {differ[:5]}"
    worst = max(abs(x - y) for a, b in zip(plain, spec) for x, y in zip(a.output_logprobs, b.output_logprobs))
    assert worst < 1e-4, worst
    s = stats["speculative"]
    assert s["steps"] > 0 and sum(s["accepted"].values()) > 0, s  # it did speculate, and some proposals held


def test_sampled_groups_are_token_identical_for_the_same_seeds(shipped_kit):
    """Eight seeded answers per prompt (a group drafts for its members): the same tokens, since each
    position is sampled with the request's own uniform for that output index."""
    name, model, prompts = shipped_kit
    reqs = [
        (p, SamplingParams(max_new_tokens=96, temperature=1.0, seed=1000 * i + a))
        for i, p in enumerate(prompts[:48])
        for a in range(8)
    ]
    plain, _ = generate({"model_path": model, "max_running": 64}, reqs, spec=False)
    spec, stats = generate({"model_path": model, "max_running": 64}, reqs, spec=True)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain], name
    assert [r.output_versions for r in spec] == [r.output_versions for r in plain]
    assert stats["speculative"]["accepted"]["group"] > 0, stats["speculative"]


@pytest.fixture(scope="module")
def random_model():
    torch.manual_seed(0)
    return build_random_qwen2().eval()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_feature_that_combines_gives_the_same_output(random_model, seed):
    """Penalties, stop tokens, top log-probs, max tokens, greedy and sampled rows in one batch,
    prompts repeated so that groups draft for each other, on a model whose greedy answers loop
    (proposals from the answer itself hold for long stretches)."""
    rng = random.Random(seed)
    v = random_model.config.vocab_size
    prompts = [[rng.randrange(v) for _ in range(rng.randint(3, 16))] for _ in range(6)]
    reqs = []
    for i, p in enumerate(prompts):
        for a in range(4):
            reqs.append(
                (
                    p,
                    SamplingParams(
                        max_new_tokens=rng.choice([1, 2, 7, 40, 80]),
                        greedy=a % 2 == 0,
                        temperature=rng.choice([0.7, 1.0, 1.3]),
                        top_k=rng.choice([-1, 20]),
                        top_p=rng.choice([1.0, 0.9]),
                        seed=100 * i + a,
                        stop_token_ids=[rng.randrange(v)] if a == 3 else [],
                        frequency_penalty=0.4 if i % 3 == 0 else 0.0,
                        repetition_penalty=1.2 if i % 3 == 1 else 1.0,
                    ),
                )
            )
    args = {"model": random_model, "max_running": 16, "seed": seed}
    plain, _ = generate(args, reqs, spec=False, top=2)
    spec, stats = generate(args, reqs, spec=True, top=2)
    for a, b in zip(plain, spec):
        assert b.output_ids == a.output_ids and b.finish_reason == a.finish_reason
        assert b.output_versions == a.output_versions
        assert [t for t, _ in sum(b.output_top_logprobs, [])] == [t for t, _ in sum(a.output_top_logprobs, [])]
        assert max((abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs)), default=0.0) < 1e-5
    assert stats["speculative"]["tokens_per_forward"] > 1.0, stats["speculative"]


CHI2_5DF_P001 = 20.515  # the chi-square distribution with 5 degrees of freedom exceeds this with probability 0.001


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def test_the_acceptance_rule_samples_the_target_distribution():
    """Chi-square over a 6-token vocabulary: with a fixed proposal x at the first position, the
    first emitted token follows p (and x is kept with probability p(x)); the second position,
    read only when x was kept, follows its own distribution."""
    p0 = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])
    p1 = torch.tensor([0.3, 0.1, 0.2, 0.1, 0.2, 0.1])
    logits = torch.stack([p0.log(), p1.log()])
    proposal = 1
    n = 20000
    first, second = torch.zeros(6), torch.zeros(6)
    gen = torch.Generator().manual_seed(7)
    for _ in range(n):
        r = Request("r", [0], SamplingParams(max_new_tokens=8, temperature=1.0), None, gen, frozenset())
        r.output_ids = [2]
        kept, _, _ = take_verified([r], [[2, proposal]], logits.clone(), 0, None)  # packed [2 fed, V]
        first[r.output_ids[1]] += 1
        if kept[0] == 2:
            second[r.output_ids[2]] += 1
    assert chi_square(first, p0 * n) < CHI2_5DF_P001
    accepted = int(first[proposal])
    assert abs(accepted / n - float(p0[proposal])) < 0.02
    assert chi_square(second, p1 * accepted) < CHI2_5DF_P001
    # the check can fail: the proposal always kept (a wrong rule) is far off
    wrong = torch.zeros(6)
    wrong[proposal] = n
    assert chi_square(wrong, p0 * n) > CHI2_5DF_P001


def test_behaviour_logprobs_equal_a_float64_forward(random_model):
    """Every emitted token's log-prob (temperature-scaled, as sampling.py defines it) against the
    model run again in float64 on prompt + answer."""
    rng = random.Random(3)
    v = random_model.config.vocab_size
    prompt = [rng.randrange(v) for _ in range(10)]
    temp = 0.8
    reqs = [(prompt, SamplingParams(max_new_tokens=48, temperature=temp, seed=s)) for s in range(8)]
    spec, stats = generate({"model": random_model, "max_running": 8}, reqs, spec=True)
    assert stats["speculative"]["steps"] > 0
    model64 = build_random_qwen2().eval()
    model64.load_state_dict(random_model.state_dict())
    model64 = model64.double()
    worst = 0.0
    for r in spec:
        ids = torch.tensor([prompt + r.output_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model64(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temp, dim=-1)
        ref = logp.gather(1, torch.tensor(r.output_ids).view(-1, 1)).squeeze(1)
        worst = max(worst, float((ref - torch.tensor(r.output_logprobs, dtype=torch.float64)).abs().max()))
    assert worst < 1e-5, worst


def test_constrained_requests_decode_plainly_beside_speculating_ones(tmp_path_factory):
    """A JSON-schema request cannot propose (its grammar state cannot be rolled back): in a batch
    where the others speculate, every answer is the same as without speculation."""
    kit = ensure_kit(BUILTIN_KITS["tiny-arith"], root=tmp_path_factory.mktemp("cache"))
    model = str(kit.path / "model")
    prompts, _ = load_prompts(kit.path / "data" / "test.jsonl", EmbeddedEngine(model).tokenizer)
    schema = '{"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}'
    reqs = [
        (p.input_ids, SamplingParams(max_new_tokens=40, temperature=0.0, json_schema=schema if i % 2 else None))
        for i, p in enumerate(prompts[:16])
    ]
    plain, _ = generate({"model_path": model}, reqs, spec=False)
    spec, stats = generate({"model_path": model}, reqs, spec=True)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    assert [r.output_forced for r in spec] == [r.output_forced for r in plain]
    assert all(r.output_forced is not None for r in spec[1::2])
    assert stats["speculative"]["steps"] > 0


def test_speculation_asked_of_a_model_that_cannot_verify_says_why(random_model):
    """The HF forward verifies nothing: the engine decodes plainly, and says so (eval prints it)."""
    with EmbeddedEngine(model=random_model, lean_forward=False, speculative=ON) as eng:
        assert eng.speculation_unavailable == "it needs the lean forward, and the lean forward is turned off"
        res = eng.submit([1, 2, 3], SamplingParams(max_new_tokens=5, greedy=True)).result(timeout=60)
        assert len(res.output_ids) == 5 and "speculative" not in eng.stats()
    with EmbeddedEngine(model=random_model, speculative=ON) as eng:
        assert eng.speculation_unavailable is None
