"""A request's state inside the embedded engine and the checks a new request must pass, called directly.

`Request.next_uniform` is what makes a seeded request's tokens independent of its batch:
draw i must be the i-th uniform of the request's own generator, however the blocks fall
and whenever it is asked for. `result()` is what the caller receives, so it must be a copy
with the engine's defaults applied. `validate_request` runs before a request is queued;
tests/engines/inference/test_engine.py checks its messages through `submit`, these check its
return value and its boundaries.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import torch

from areal_graph.engines.inference.engine_errors import InvalidRequestError, QueueFullError
from areal_graph.engines.inference.requests import Request, validate_request
from areal_graph.engines.inference.sampling import GenerationResult, SamplingParams


def make_request(seed: int = 0, **kw) -> Request:
    gen = torch.Generator().manual_seed(seed)
    return Request(
        "r1", [3, 4, 5], SamplingParams(max_new_tokens=8), concurrent.futures.Future(), gen, frozenset({2}), **kw
    )


def test_error_types():
    assert issubclass(InvalidRequestError, ValueError) and issubclass(QueueFullError, RuntimeError)


def test_next_uniform_is_draw_i_of_the_requests_generator_across_blocks():
    req = make_request(seed=7)
    ref = torch.Generator().manual_seed(7)
    expected = torch.rand(64, dtype=torch.float64, generator=ref).tolist()
    expected += torch.rand(64, dtype=torch.float64, generator=ref).tolist()
    got = []
    for i in range(70):  # past the first block of 64
        u = req.next_uniform()
        assert req.next_uniform() == u  # asking again for the same token gives the same draw
        got.append(u)
        req.output_ids.append(i)
    assert got == expected[:70]
    assert len(req.uniforms) == 128 and all(0.0 <= u < 1.0 for u in got)


def test_next_uniform_catches_up_when_tokens_came_without_draws():
    """Draw i belongs to output token i even if earlier tokens were not sampled (greedy, forced)."""
    req = make_request(seed=3)
    req.output_ids = list(range(100))
    ref = torch.Generator().manual_seed(3)
    expected = torch.cat([torch.rand(64, dtype=torch.float64, generator=ref) for _ in range(2)]).tolist()
    assert req.next_uniform() == expected[100]


def test_different_seeds_give_different_draws():
    assert make_request(seed=1).next_uniform() != make_request(seed=2).next_uniform()


def test_result_copies_the_state_with_defaults():
    req = make_request()
    req.output_ids += [9, 10]
    req.logprobs += [-0.5, -1.5]
    req.versions += [0, 1]
    res = req.result()
    assert res == GenerationResult(
        rid="r1",
        output_ids=[9, 10],
        output_logprobs=[-0.5, -1.5],
        output_versions=[0, 1],
        finish_reason="abort",
        prompt_len=3,
        output_top_logprobs=None,
    )
    req.output_ids.append(11)
    req.logprobs.append(-2.0)
    assert res.output_ids == [9, 10] and res.output_logprobs == [-0.5, -1.5]  # a copy, not a view
    req.finish_reason = "length"
    assert req.result().finish_reason == "length"


def test_result_reports_top_logprobs_only_when_asked():
    req = make_request(top_logprobs=2)
    req.output_ids.append(9)
    req.top.append([(9, -0.1), (4, -2.5)])
    assert req.result().output_top_logprobs == [[(9, -0.1), (4, -2.5)]]
    assert make_request().result().output_top_logprobs is None


def test_all_tokens_is_prompt_then_output_and_lists_are_per_request():
    a, b = make_request(), make_request()
    a.output_ids.append(8)
    assert a.all_tokens() == [3, 4, 5, 8] and b.all_tokens() == [3, 4, 5]
    assert a.all_tokens() is not a.prompt and a.timeline is None and a.top_logprobs == 0


def test_validate_returns_plain_ints():
    ids = validate_request(np.array([1, 2, 3]), SamplingParams(max_new_tokens=2), 10, 16, False)
    assert ids == [1, 2, 3] and all(type(t) is int for t in ids)
    assert validate_request(torch.tensor([4, 9]), SamplingParams(max_new_tokens=1), 10, 16, False) == [4, 9]
    assert validate_request((0, 9), SamplingParams(max_new_tokens=1), 10, 16, False) == [0, 9]


def test_validate_boundaries_vocabulary_and_context():
    sp = SamplingParams(max_new_tokens=4)
    assert validate_request([9], sp, vocab_size=10, max_context=5, has_tokenizer=False) == [9]
    with pytest.raises(InvalidRequestError, match=r"outside the vocabulary \[0, 10\): \[10, -1\]"):
        validate_request([1, 10, -1], sp, 10, 64, False)
    with pytest.raises(
        InvalidRequestError,
        match=r"prompt \(2 tokens\) \+ max_new_tokens \(4\) exceeds the context "
        r"of 5 tokens",
    ):
        validate_request([1, 2], sp, 10, 5, False)


def test_validate_lists_at_most_five_bad_ids():
    with pytest.raises(InvalidRequestError) as err:
        validate_request(list(range(20, 30)), SamplingParams(), 10, 1000, False)
    assert str(err.value).endswith("[20, 21, 22, 23, 24]")


def test_validate_rejects_other_params_and_non_integer_ids():
    with pytest.raises(InvalidRequestError, match="params must be SamplingParams, got dict"):
        validate_request([1], {"max_new_tokens": 1}, 10, 16, False)
    with pytest.raises(InvalidRequestError, match="input_ids must be a list of integers"):
        validate_request([1, None], SamplingParams(), 10, 1000, False)
    with pytest.raises(InvalidRequestError, match="input_ids must be a list of integers"):
        validate_request(5, SamplingParams(), 10, 1000, False)


def test_validate_bad_sampling_values_are_listed():
    with pytest.raises(InvalidRequestError, match="bad sampling params: .*top_p"):
        validate_request([1], SamplingParams(top_p=1.5), 10, 1000, False)


def test_stop_strings_need_a_tokenizer():
    sp = SamplingParams(max_new_tokens=1, stop=["\n"])
    with pytest.raises(InvalidRequestError, match="stop strings need a tokenizer"):
        validate_request([1], sp, 10, 16, has_tokenizer=False)
    assert validate_request([1], sp, 10, 16, has_tokenizer=True) == [1]
    assert validate_request([1], SamplingParams(max_new_tokens=1, stop_token_ids=[3]), 10, 16, False) == [1]
