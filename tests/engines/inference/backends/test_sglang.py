"""The SGLang backend's launch line and wire format, checked against SGLang's documented API.

SGLang needs a GPU, so nothing here starts it: these pin the pure mapping the backend does
between our terms and SGLang's (`GenerateReqInput`, the `/generate` response's `meta_info`,
`AbortReq`, `PauseGenerationReqInput`, `UpdateWeightFromDiskReqInput`), which is what the
client trusts when it builds a rollout's tokens, log-probs and policy versions. The client
driving these calls against a fake SGLang server is tests/engines/inference/test_client_sglang.py.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.backends.base import HttpCall, InferenceBackend, ServerLaunch
from areal_graph.engines.inference.backends.sglang import SGLangBackend, sampling_to_json
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.graph.spec import InferenceSpec

SGLANG = SGLangBackend()


def sglang_response(pairs, finish, output_ids=None, **meta):
    """A /generate body as SGLang answers it (text, output_ids, meta_info)."""
    body = {
        "text": "",
        "output_ids": [p[1] for p in pairs] if output_ids is None else output_ids,
        "meta_info": {
            "id": "r",
            "finish_reason": finish,
            "prompt_tokens": 4,
            "completion_tokens": len(pairs),
            "cached_tokens": 0,
            "output_token_logprobs": [list(p) + [None] for p in pairs],
            **meta,
        },
    }
    return body


def test_registered_under_its_name_with_sglangs_traits():
    assert isinstance(get_backend("sglang"), SGLangBackend) and isinstance(SGLANG, InferenceBackend)
    assert SGLANG.name == "sglang" and SGLANG.startup_timeout_s == 900.0
    assert SGLANG.pause_around_update and SGLANG.pause_mode == "abort"
    assert not SGLANG.shared_memory_weights and not SGLANG.server_spans
    with pytest.raises(NotImplementedError, match="sglang backend cannot load weights from shared memory"):
        SGLANG.shared_memory_update_calls("/dev/shm/w", [], 1)


def test_unavailable_without_the_package_unless_an_interpreter_is_named():
    assert SGLANG.unavailable("/venvs/sglang/bin/python") is None
    reason = SGLANG.unavailable(None)
    if importlib.util.find_spec("sglang") is None:
        assert "pip install 'areal-graph[sglang]'" in reason and "inference.python" in reason
    else:
        assert reason is None


def test_launch_line_passes_the_key_and_the_args_as_sglang_flags():
    spec = InferenceSpec(
        backend="sglang",
        max_running_requests=48,
        args={"tp_size": 2, "mem_fraction_static": 0.7, "enable_torch_compile": True},
    )
    cmd = SGLANG.command(
        ServerLaunch(spec, "/models/q", 30001, threads=8, seed=11, name="inference-1", api_key="k3y", host="0.0.0.0")
    )
    assert cmd == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/q",
        "--host",
        "0.0.0.0",
        "--port",
        "30001",
        "--random-seed",
        "11",
        "--max-running-requests",
        "48",
        "--api-key",
        "k3y",
        "--tp-size",
        "2",
        "--mem-fraction-static",
        "0.7",
        "--enable-torch-compile",
    ]
    no_key = SGLANG.command(ServerLaunch(spec, "/models/q", 30001, 8, 11, "inference-1", None, "127.0.0.1"))
    assert "--api-key" not in no_key and SGLANG.environment("k3y") == {}


def test_resources_gpus_from_tensor_and_data_parallel_sizes_and_one_cpu():
    assert SGLANG.gpus(InferenceSpec(backend="sglang")) == 1
    assert SGLANG.gpus(InferenceSpec(backend="sglang", args={"tp_size": 4})) == 4
    assert SGLANG.gpus(InferenceSpec(backend="sglang", args={"tp": "2"})) == 2
    assert SGLANG.gpus(InferenceSpec(backend="sglang", args={"tp_size": 2, "dp_size": 2})) == 4
    assert SGLANG.cpus(16) == 1 and SGLANG.thread_cap(16) == 16


def test_sampling_json_temperature_and_optional_fields():
    sp = sampling_to_json(SamplingParams(max_new_tokens=5, temperature=0.6, top_p=0.95))
    assert sp == {"max_new_tokens": 5, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "ignore_eos": False}
    assert all(type(sp[k]) is float for k in ("temperature", "top_p"))
    # temperature 0 is SGLang's greedy; the engine's greedy flag maps onto it whatever the temperature
    assert sampling_to_json(SamplingParams(temperature=0.0))["temperature"] == 0.0
    assert sampling_to_json(SamplingParams(temperature=0.9, greedy=True))["temperature"] == 0.0
    assert sampling_to_json(SamplingParams(seed=0))["sampling_seed"] == 0  # seed 0 is a seed, not "none"


def test_generate_call_is_a_non_streamed_token_id_request_with_logprobs():
    call = SGLANG.generate_call((3, 4, 5), SamplingParams(max_new_tokens=2, ignore_eos=True), "rid-9")
    assert (call.method, call.path) == ("POST", "/generate")
    assert call.payload == {
        "input_ids": [3, 4, 5],
        "return_logprob": True,
        "rid": "rid-9",
        "stream": False,
        "sampling_params": {"max_new_tokens": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "ignore_eos": True},
    }
    assert "logprob_start_len" not in call.payload  # see the module docstring of sglang.py


def test_parse_generate_reads_tokens_logprobs_version_and_finish():
    body = sglang_response([(-0.5, 7), (None, 8), (-1.25, 9)], {"type": "length", "length": 3}, weight_version="4")
    parsed = SGLANG.parse_generate(body)
    assert parsed.output_ids == [7, 8, 9] and parsed.output_logprobs[0::2] == [-0.5, -1.25]
    assert math.isnan(parsed.output_logprobs[1])
    assert parsed.versions is None and parsed.response_version == 4  # no per-token versions in SGLang
    assert (parsed.finish_reason, parsed.prompt_len) == ("length", 4)


def test_parse_generate_initial_weights_and_a_matched_stop():
    parsed = SGLANG.parse_generate(
        sglang_response([(-0.1, 2)], {"type": "stop", "matched": 2}, weight_version="default")
    )
    assert parsed.response_version is None and parsed.finish_reason == "stop"


def test_parse_generate_takes_the_first_of_a_batched_answer():
    first = sglang_response([(-0.3, 5)], {"type": "abort", "message": "Abort in waiting queue"})
    second = sglang_response([(-0.3, 6), (-0.4, 7)], {"type": "length", "length": 2})
    parsed = SGLANG.parse_generate([first, second])
    assert parsed.output_ids == [5] and parsed.finish_reason == "abort"


def test_parse_generate_without_logprobs_falls_back_to_output_ids():
    parsed = SGLANG.parse_generate({"output_ids": [4, 5], "meta_info": {"finish_reason": None}})
    assert parsed.output_ids == [4, 5] and all(math.isnan(x) for x in parsed.output_logprobs)
    assert parsed.finish_reason == "abort" and parsed.prompt_len is None and parsed.response_version is None
    empty = SGLANG.parse_generate({})
    assert empty.output_ids == [] and empty.output_logprobs == [] and empty.finish_reason == "abort"


def test_parse_generate_rejects_output_ids_that_disagree_with_the_logprobs():
    body = sglang_response([(-0.5, 7), (-0.5, 8)], {"type": "length", "length": 2}, output_ids=[7])
    with pytest.raises(ValueError, match="disagree in length"):
        SGLANG.parse_generate(body)


def test_per_token_versions_are_used_only_when_one_per_token():
    body = sglang_response(
        [(-0.5, 7), (-0.5, 8)], {"type": "length", "length": 2}, output_token_versions=["3", 4], weight_version="4"
    )
    assert SGLANG.parse_generate(body).versions == [3, 4]
    body["meta_info"]["output_token_versions"] = [4]
    assert SGLANG.parse_generate(body).versions is None


def test_control_calls_follow_sglangs_endpoints():
    assert SGLANG.abort_call("r1", False) == HttpCall("POST", "/abort_request", {"rid": "r1", "abort_all": False})
    assert SGLANG.abort_call(None, True) == HttpCall("POST", "/abort_request", {"rid": "", "abort_all": True})
    assert SGLANG.pause_call() == HttpCall("POST", "/pause_generation", {"mode": "abort"})
    assert SGLANG.resume_call() == HttpCall("POST", "/continue_generation", {})
    assert SGLANG.model_info_call() == HttpCall("GET", "/get_model_info")
    [update] = SGLANG.disk_update_calls("/ckpt/v5", 5)
    assert update == HttpCall("POST", "/update_weights_from_disk", {"model_path": "/ckpt/v5", "weight_version": "5"})
    # the version label travels as a string (SGLang's weight_version is a str) and reads back as the int
    assert SGLANG.parse_model_info_version({"model_path": "/ckpt/v5", "weight_version": "5"}) == 5
