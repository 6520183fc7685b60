"""The inference backends' wire formats and launch lines, without a server.

The vLLM side is run for real by tests/engines/inference/backends/test_vllm_backend.py (`make test-vllm`); these pin the
parts that must hold wherever it runs: payloads, the parsing of vLLM's weight-version spans,
the order of a weight update's calls, the key kept out of argv, and the worker extension.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import typing
from types import SimpleNamespace

import pytest
import torch

from areal_graph.engines.inference.backends import BACKEND_NAMES, ServerLaunch, get_backend
from areal_graph.engines.inference.backends.vllm import WORKER_EXTENSION_DIR, sampling_to_vllm, span_versions
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.graph.spec import InferenceSpec

VLLM = get_backend("vllm")


def test_the_schema_names_exactly_the_registered_backends():
    hints = typing.get_type_hints(InferenceSpec)
    assert typing.get_args(hints["backend"]) == BACKEND_NAMES


def test_vllm_sampling_and_generate_payload():
    sp = SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=5, seed=3, stop_token_ids=(2,))
    call = VLLM.generate_call([1, 2, 3], sp, "rid-1")
    assert (call.method, call.path) == ("POST", "/inference/v1/generate")
    assert call.payload["token_ids"] == [1, 2, 3] and call.payload["request_id"] == "rid-1"
    assert call.payload["sampling_params"] == {
        "max_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "ignore_eos": False,
        "logprobs": 0,
        "stop_token_ids": [2],
        "detokenize": False,
        "seed": 3,
    }
    greedy = sampling_to_vllm(SamplingParams(max_new_tokens=4, greedy=True, stop=("\n",)))
    assert greedy["temperature"] == 0.0 and greedy["stop"] == ["\n"] and "detokenize" not in greedy


def test_vllm_response_with_a_version_switch_inside_it():
    body = {
        "usage": {"prompt_tokens": 3},
        "choices": [
            {
                "finish_reason": "length",
                "token_ids": [5, 6, 7, 8],
                "logprobs": {"content": [{"token_id": t, "logprob": -0.1 * t} for t in (5, 6, 7, 8)]},
                "weight_versions": [
                    {"version": "default", "start": 0, "end": 1},
                    {"version": "4", "start": 1, "end": 2},
                    {"version": "5", "start": 2, "end": 4},
                ],
            }
        ],
    }
    parsed = VLLM.parse_generate(body)
    assert parsed.output_ids == [5, 6, 7, 8] and parsed.output_logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    assert parsed.versions == [None, 4, 5, 5] and parsed.finish_reason == "length" and parsed.prompt_len == 3
    body["choices"][0]["logprobs"]["content"][1]["token_id"] = 9
    with pytest.raises(ValueError, match="disagree"):
        VLLM.parse_generate(body)


def test_vllm_response_without_logprobs_or_spans():
    parsed = VLLM.parse_generate({"choices": [{"finish_reason": "abort", "token_ids": [3]}]})
    assert math.isnan(parsed.output_logprobs[0]) and parsed.versions is None and parsed.finish_reason == "abort"
    assert span_versions([], 3) is None
    with pytest.raises(ValueError, match="without choices"):
        VLLM.parse_generate({"error": "x"})


def test_the_client_labels_unlabelled_tokens_with_the_version_at_submit():
    from areal_graph.engines.inference.client import InferenceClient

    client = InferenceClient("http://x", backend="vllm", version=2)
    body = {
        "choices": [
            {
                "finish_reason": "stop",
                "token_ids": [5, 6, 7],
                "logprobs": {"content": [{"token_id": t, "logprob": -1.0} for t in (5, 6, 7)]},
                "weight_versions": [
                    {"version": "default", "start": 0, "end": 2},
                    {"version": "3", "start": 2, "end": 3},
                ],
            }
        ]
    }
    result = client._result(body, "r", prompt_len=4, version_at_submit=2)
    assert result.output_versions == [2, 2, 3] and result.prompt_len == 4 and client.version == 3


def test_vllm_abort_and_weight_update_calls():
    assert VLLM.abort_call("abc", False).payload == {"request_ids": ["generate-tokens-abc"]}
    assert VLLM.abort_call(None, True).payload == {}
    assert VLLM.pause_around_update and VLLM.pause_call().path == "/pause?mode=keep"
    calls = VLLM.disk_update_calls("/w/v3", 3)
    assert [c.path for c in calls] == [
        "/collective_rpc",
        "/reset_prefix_cache?reset_running_requests=true",
        "/update_weight_version",
    ]
    assert calls[0].payload == {"method": "reload_weights_tied", "kwargs": {"weights_path": "/w/v3"}}
    assert calls[2].payload == {"new_version": "3"}
    shm = VLLM.shared_memory_update_calls("/dev/shm/w", [{"name": "a"}], 4)
    assert shm[0].payload == {
        "method": "load_weights_from_shared_memory",
        "kwargs": {"path": "/dev/shm/w", "manifest": [{"name": "a"}]},
    }
    assert [c.path for c in shm[1:]] == [c.path for c in calls[1:]] and shm[2].payload == {"new_version": "4"}


def test_vllm_launch_line_keeps_the_key_out_of_argv(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    spec = InferenceSpec(backend="vllm", python=str(python), max_running_requests=12, args={"dtype": "float32"})
    from areal_graph.runtime.orchestration.placement import inference_server_command

    launch = ServerLaunch(spec, "/m", 8001, threads=2, seed=4, name="inference-0", api_key="s3cret")
    cmd = inference_server_command(VLLM, launch)
    assert cmd[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert "s3cret" not in " ".join(cmd)
    opts = {k: v for k, v in zip(cmd, cmd[1:]) if k.startswith("--")}
    assert (opts["--model"], opts["--port"], opts["--seed"], opts["--max-num-seqs"]) == ("/m", "8001", "4", "12")
    assert opts["--logprobs-mode"] == "processed_logprobs" and opts["--dtype"] == "float32"
    assert "--enable-scale-out" in cmd
    env = VLLM.environment("s3cret")
    assert env["VLLM_API_KEY"] == "s3cret" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert str(WORKER_EXTENSION_DIR) in env["PYTHONPATH"].split(":")
    assert VLLM.thread_cap(8) == 1


def test_vllm_without_vllm_or_an_interpreter_is_a_clear_error():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    from areal_graph.runtime.orchestration.placement import inference_server_command

    with pytest.raises(RuntimeError, match="make install-vllm"):
        inference_server_command(VLLM, ServerLaunch(InferenceSpec(backend="vllm"), "/m", 1, 1, 0))
    with pytest.raises(RuntimeError, match="not an executable"):
        spec = InferenceSpec(backend="vllm", python="/nonexistent/python")
        inference_server_command(VLLM, ServerLaunch(spec, "/m", 1, 1, 0))


def test_weight_sync_auto_and_server_spans_follow_the_backend():
    from areal_graph.runtime.orchestration.weight_sync import resolve_weight_sync

    assert [resolve_weight_sync("auto", get_backend(b)) for b in BACKEND_NAMES] == ["memory", "disk", "memory"]
    assert [get_backend(b).server_spans for b in BACKEND_NAMES] == [True, False, False]


def test_only_the_embedded_server_reports_a_digest_of_its_weights():
    from areal_graph.engines.inference.backends import HttpCall
    from areal_graph.engines.inference.backends.base import WeightsReport

    assert [get_backend(b).weights_digest_call() for b in BACKEND_NAMES] == [
        HttpCall("GET", "/get_weights_digest"),
        None,
        None,
    ]
    embedded = get_backend("embedded")
    body = {"weight_version": "7", "digest": "ab12", "dtype": "bfloat16"}
    assert embedded.parse_weights_digest(body) == WeightsReport(7, "ab12", "bfloat16")
    with pytest.raises(ValueError, match="needs weight_version, digest and dtype"):
        embedded.parse_weights_digest({"weight_version": "7", "dtype": "float32"})


def _extension_module():
    """The worker extension as vLLM's interpreter imports it: a top-level module from its own directory."""
    sys.path.insert(0, str(WORKER_EXTENSION_DIR))
    try:
        return importlib.import_module("areal_vllm_worker")
    finally:
        sys.path.remove(str(WORKER_EXTENSION_DIR))


def test_the_worker_extension_imports_nothing_of_ours():
    source = (WORKER_EXTENSION_DIR / "areal_vllm_worker.py").read_text()
    assert "areal_graph" not in source.replace("areal-graph", "")


class _Processed:
    """Stands in for vLLM's quant method: the post-load step snapshots the weight (as CPU packing does)."""

    def process_weights_after_loading(self, layer):
        layer.packed = layer.weight.detach().clone()


def test_retie_points_the_head_at_the_reloaded_embedding_and_redoes_its_packing():
    ext = _extension_module()
    embed = torch.nn.Embedding(6, 4)
    head = torch.nn.Module()
    head.weight = embed.weight
    head.quant_method = _Processed()
    head.quant_method.process_weights_after_loading(head)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = embed
    model.lm_head = head
    model.config = SimpleNamespace(tie_word_embeddings=True)
    embed.weight = torch.nn.Parameter(torch.randn(6, 4))  # what vLLM's layerwise reload does
    assert head.weight is not embed.weight
    assert ext.retie_output_head(model) is True
    assert head.weight is embed.weight and torch.equal(head.packed, embed.weight)
    model.config = SimpleNamespace(tie_word_embeddings=False)
    assert ext.retie_output_head(model) is False


def test_the_worker_extension_reads_what_the_trainer_publishes(tmp_path):
    """The extension's reader is its own (vLLM's interpreter has no areal-graph): it must read
    engines/shared_weights.py's layout, tied weights and bf16 included."""
    from areal_graph.engines import shared_weights

    ext = _extension_module()
    embed = torch.randn(7, 3)
    state = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,
        "norm.weight": torch.randn(3),
        "half.weight": torch.randn(2, 5).to(torch.bfloat16),
    }
    path = str(tmp_path / "weights")
    manifest = shared_weights.publish(path, state)
    got = dict(ext.read_shared_weights(path, manifest))
    assert list(got) == list(state)
    for name, t in state.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    with pytest.raises(ValueError, match="unknown dtype"):
        ext.read_shared_weights(path, [{**manifest[0], "dtype": "complex_thing"}])
