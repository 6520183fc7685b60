"""SGLang-native request bodies checked into the engine's terms, called directly (no server).

tests/engines/inference/server/test_http_server.py sends bad bodies through a real server and checks
the 400s; these check the parser's own contract: the values it produces (SGLang's
`temperature: 0` is greedy, `sampling_seed` is the seed, a lone stop string is a list), the
exact boundaries (top_k, top_p, the context), booleans refused where integers are due, and
that every body the sglang/embedded backends send parses back to the sampling they meant.
"""

from __future__ import annotations

import math
import re

import pytest

from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.inference.server.native_requests import (
    ABORT_FIELDS,
    GENERATE_FIELDS,
    PAUSE_MODES,
    SAMPLING_FIELDS,
    UPDATE_FIELDS,
    BadRequest,
    finish_reason_json,
    is_int,
    is_number,
    parse_generate_request,
    parse_sampling_params,
)


def test_bad_request_is_a_value_error():
    assert issubclass(BadRequest, ValueError)


def test_int_and_number_exclude_booleans():
    assert is_int(3) and is_int(-1) and not is_int(True) and not is_int(2.0) and not is_int("3")
    assert is_number(3) and is_number(0.5) and not is_number(False) and not is_number("0.5") and not is_number(None)


def test_absent_or_empty_sampling_params_are_the_defaults():
    assert parse_sampling_params(None, 3, None) == SamplingParams()
    assert parse_sampling_params({}, 3, 1000) == SamplingParams()


def test_values_map_onto_sampling_params():
    raw = {
        "max_new_tokens": 9,
        "temperature": 0.7,
        "top_p": 0.5,
        "top_k": 4,
        "stop": "\n\n",
        "stop_token_ids": [2, 7],
        "ignore_eos": True,
        "sampling_seed": 11,
    }
    assert parse_sampling_params(raw, 3, None) == SamplingParams(
        max_new_tokens=9,
        temperature=0.7,
        top_p=0.5,
        top_k=4,
        stop=["\n\n"],
        stop_token_ids=[2, 7],
        ignore_eos=True,
        seed=11,
    )
    assert parse_sampling_params({"seed": 4}, 1, None).seed == 4
    assert parse_sampling_params({"stop": None, "stop_token_ids": None, "seed": None}, 1, None) == SamplingParams()
    # SGLang-only output switches are accepted (they change no sampling)
    assert parse_sampling_params({"skip_special_tokens": False, "no_stop_trim": True}, 1, None) == SamplingParams()


def test_temperature_zero_is_greedy_and_greedy_is_an_or():
    zero = parse_sampling_params({"temperature": 0}, 1, None)
    assert zero.greedy and zero.is_greedy and zero.temperature == 1.0
    assert parse_sampling_params({"temperature": 0.0, "greedy": False}, 1, None).greedy is True
    assert parse_sampling_params({"greedy": True, "temperature": 0.8}, 1, None).greedy is True
    assert parse_sampling_params({"temperature": 2}, 1, None).temperature == 2.0


@pytest.mark.parametrize(
    "raw, field",
    [
        ([("max_new_tokens", 3)], "sampling_params must be an object"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": None}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
        ({"stop_token_ids": 2}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop": ["a", 1]}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"greedy": "yes"}, "greedy"),
        ({"sampling_seed": 1.5}, "sampling_seed"),
        ({"seed": False}, "seed"),
        ({"min_p": 0.1}, "min_p"),
        ({"frequency_penalty": "x"}, "frequency_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
    ],
)
def test_a_bad_field_is_named(raw, field):
    with pytest.raises(BadRequest, match=re.escape(field)):
        parse_sampling_params(raw, 1, None)


def test_unknown_sampling_fields_list_what_is_supported():
    with pytest.raises(BadRequest) as err:
        parse_sampling_params({"topp": 0.5, "min_p": 0.1}, 1, None)
    assert "['min_p', 'topp']" in str(err.value) and str(sorted(SAMPLING_FIELDS)) in str(err.value)


def test_top_k_minus_one_and_one_and_top_p_one_are_allowed():
    assert parse_sampling_params({"top_k": -1, "top_p": 1}, 1, None).top_k == -1
    assert parse_sampling_params({"top_k": 1}, 1, None).top_k == 1


def test_values_the_engine_rejects_are_refused_here_too():
    """`problems()` of SamplingParams applies on top of the field checks (an empty stop string)."""
    with pytest.raises(BadRequest, match="sampling_params: "):
        parse_sampling_params({"stop": [""]}, 1, None)
    with pytest.raises(BadRequest, match="sampling_params"):
        parse_sampling_params({"stop_token_ids": [-3]}, 1, None)


def test_context_limit_is_inclusive_and_unchecked_without_one():
    assert parse_sampling_params({"max_new_tokens": 6}, 4, 10).max_new_tokens == 6
    with pytest.raises(
        BadRequest,
        match=r"prompt \(4 tokens\) \+ sampling_params.max_new_tokens \(7\) exceeds the "
        r"model context of 10 tokens",
    ):
        parse_sampling_params({"max_new_tokens": 7}, 4, 10)
    with pytest.raises(BadRequest, match="context"):  # the default 128 applies when none is given
        parse_sampling_params({}, 4, 100)
    assert parse_sampling_params({"max_new_tokens": 10**6}, 4, None).max_new_tokens == 10**6


def test_generate_request_returns_ids_params_logprob_flag_and_rid():
    ids, params, ret_lp, rid = parse_generate_request(
        {
            "input_ids": [5, 6],
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True,
            "rid": "abc",
            "stream": False,
            "logprob_start_len": -1,
        },
        max_context=64,
    )
    assert ids == [5, 6] and params == SamplingParams(max_new_tokens=2, greedy=True) and ret_lp and rid == "abc"


def test_a_missing_rid_gets_a_fresh_one_and_logprobs_default_off():
    _, _, ret_lp, rid1 = parse_generate_request({"input_ids": [1]}, None)
    _, _, _, rid2 = parse_generate_request({"input_ids": [1]}, None)
    assert ret_lp is False
    assert re.fullmatch(r"[0-9a-f]{32}", rid1) and rid1 != rid2


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("[1, 2]", "JSON object"),
        ({"text": "hi", "input_ids": [1]}, "send 'input_ids' instead of 'text'"),
        ({"input_ids": [1], "image_data": "x"}, "unknown field(s) ['image_data']"),
        ({}, "missing 'input_ids'"),
        ({"input_ids": None}, "missing 'input_ids'"),
        ({"input_ids": [1, True]}, "flat list of integers"),
        ({"input_ids": (1, 2)}, "flat list of integers"),
        ({"input_ids": []}, "'input_ids' is empty"),
        ({"input_ids": [1], "stream": "yes"}, "'stream' must be a boolean"),
        ({"input_ids": [1], "return_logprob": 1}, "'return_logprob' must be a boolean"),
        ({"input_ids": [1], "rid": ""}, "'rid' must be a non-empty string"),
        ({"input_ids": [1], "rid": 7}, "'rid' must be a non-empty string"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 200}}, "model context of 100"),
    ],
)
def test_bad_generate_bodies_name_what_is_wrong(body, fragment):
    with pytest.raises(BadRequest) as err:
        parse_generate_request(body, max_context=100)
    assert fragment in str(err.value)


@pytest.mark.parametrize("backend", ["embedded", "sglang"])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=20, seed=3, stop_token_ids=[2], stop=["\n"]),
        SamplingParams(max_new_tokens=0, greedy=True, ignore_eos=True),
        SamplingParams(),
    ],
)
def test_what_the_backends_send_parses_back_to_the_same_sampling(backend, sampling):
    call = get_backend(backend).generate_call([4, 5, 6], sampling, "rid-1")
    ids, params, ret_lp, rid = parse_generate_request(call.payload, max_context=512)
    assert (ids, ret_lp, rid) == ([4, 5, 6], True, "rid-1")
    assert params.is_greedy == sampling.is_greedy
    if not sampling.is_greedy:
        assert params.temperature == sampling.temperature
    for name in ("max_new_tokens", "top_p", "top_k", "stop_token_ids", "stop", "seed", "ignore_eos"):
        assert getattr(params, name) == getattr(sampling, name), name


def test_finish_reasons_in_sglangs_shape():
    assert finish_reason_json("stop", 3, 2) == {"type": "stop", "matched": 2}
    assert finish_reason_json("length", 16, 9) == {"type": "length", "length": 16}
    assert finish_reason_json("abort", 1, 4) == {"type": "abort", "message": "request aborted"}
    assert finish_reason_json("anything-else", 0, None)["type"] == "abort"


def test_control_field_sets_match_sglangs_request_types():
    assert GENERATE_FIELDS >= {"input_ids", "sampling_params", "return_logprob", "rid", "stream"}
    assert ABORT_FIELDS == {"rid", "abort_all"}
    assert {"model_path", "weight_version"} <= UPDATE_FIELDS
    assert PAUSE_MODES == ("abort", "retract", "in_place")
    # every field the sglang backend's control calls send is one the server accepts
    sglang = get_backend("sglang")
    assert set(sglang.abort_call("r", False).payload) <= ABORT_FIELDS
    assert set(sglang.disk_update_calls("/w", 1)[0].payload) <= UPDATE_FIELDS
    assert sglang.pause_call().payload["mode"] in PAUSE_MODES
    assert get_backend("embedded").pause_call().payload["mode"] in PAUSE_MODES
