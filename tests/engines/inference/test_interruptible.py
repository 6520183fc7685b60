"""Interruptible generation: the resubmission loop (against a scripted server), then for real.

The real tests serve a random tiny Qwen2 in a subprocess, change its weights while requests
are in flight (both the embedded engine's own pause-and-resume and SGLang-style
abort-and-resubmit), and check every token against an independent greedy reference: tokens
before the switch are the old model's greedy continuation, tokens after it the new model's
greedy continuation of that exact prefix, each with its version and log-prob.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.engines.inference.interruptible import ChunkedGeneration, TooManyInterruptions, generate_interruptible
from areal_graph.engines.inference.sampling import SamplingParams


# --------------------------------------------------------------------------- scripted server
def _next_token(prefix: list[int], version: int) -> int:
    """A deterministic 'model': depends on the whole prefix and on the weights' version."""
    return (sum((i + 1) * t for i, t in enumerate(prefix)) * 31 + 7 * version + len(prefix)) % 97 + 3


@dataclasses.dataclass
class _Result:
    rid: str
    output_ids: list
    output_logprobs: list
    output_versions: list
    finish_reason: str
    prompt_len: int


class ScriptedClient:
    """Behaves like SGLang in pause-by-abort mode: at scheduled global token counts the
    weights change; the request in flight returns 'abort' with the tokens it made so far."""

    def __init__(self, switch_at: list[int], eos: int | None = None) -> None:
        self.switch_at = sorted(switch_at)  # absolute output positions where version bumps
        self.version = 0
        self.eos = eos
        self.calls: list[tuple[int, int]] = []  # (input length, max_new_tokens)
        self.user_aborted: set[str] = set()
        self.epoch = 0

    async def generate(self, input_ids, sampling, rid=None):
        self.calls.append((len(input_ids), sampling.max_new_tokens))
        ids = list(input_ids)
        out, lps, vers = [], [], []
        produced_before = len(ids) - self.prompt_len
        for _ in range(sampling.max_new_tokens):
            pos = produced_before + len(out)
            if self.switch_at and pos >= self.switch_at[0] and self.version < self._version_for(pos):
                self.version = self._version_for(pos)
                return _Result(rid, out, lps, vers, "abort", len(input_ids))
            tok = _next_token(ids + out, self.version)
            out.append(tok)
            lps.append(-tok / 100.0 - self.version)
            vers.append(self.version)
            if self.eos is not None and tok == self.eos:
                return _Result(rid, out, lps, vers, "stop", len(input_ids))
        return _Result(rid, out, lps, vers, "length", len(input_ids))

    def _version_for(self, pos: int) -> int:
        return sum(1 for s in self.switch_at if pos >= s)

    def abort_epoch(self) -> int:
        return self.epoch

    def was_aborted_by_user(self, rid, epoch=None) -> bool:
        return rid in self.user_aborted

    async def wait_weights_ready(self, timeout=None) -> None:
        return None


def _reference(prompt: list[int], n: int, switch_at: list[int], eos: int | None):
    out, lps, vers = [], [], []
    for pos in range(n):
        v = sum(1 for s in switch_at if pos >= s)
        tok = _next_token(prompt + out, v)
        out.append(tok)
        lps.append(-tok / 100.0 - v)
        vers.append(v)
        if eos is not None and tok == eos:
            return out, lps, vers, "stop"
    return out, lps, vers, "length"


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 99), min_size=1, max_size=8),
    n=st.integers(0, 40),
    switch_at=st.lists(st.integers(0, 45), max_size=4),
    eos=st.one_of(st.none(), st.integers(3, 99)),
)
def test_chunks_concatenate_to_the_uninterrupted_generation(prompt, n, switch_at, eos):
    client = ScriptedClient(switch_at, eos)
    client.prompt_len = len(prompt)
    gen = asyncio.run(generate_interruptible(client, prompt, SamplingParams(max_new_tokens=n), rid="r"))
    ref_out, ref_lps, ref_vers, ref_reason = _reference(prompt, n, client.switch_at, eos)
    assert gen.output_ids == ref_out
    assert gen.output_logprobs == ref_lps
    assert gen.output_versions == ref_vers
    assert gen.finish_reason == ref_reason
    assert gen.input_ids == prompt + ref_out
    # every resubmission carries prompt + tokens so far, with the budget reduced by them
    done = 0
    for (in_len, budget), chunk in zip(client.calls, gen.chunks):
        assert in_len == len(prompt) + done
        assert budget == n - done
        done += len(chunk.output_ids)
    assert gen.num_interruptions == sum(c.finish_reason == "abort" for c in gen.chunks) - (gen.finish_reason == "abort")
    assert gen.output_versions == sorted(gen.output_versions)


def test_user_abort_is_not_resubmitted():
    client = ScriptedClient(switch_at=[3])
    client.prompt_len = 2
    client.user_aborted.add("mine")
    gen = asyncio.run(generate_interruptible(client, [5, 6], SamplingParams(max_new_tokens=10), rid="mine"))
    assert gen.finish_reason == "abort"
    assert len(gen.output_ids) == 3 and len(client.calls) == 1


def test_endless_interruptions_raise():
    class AlwaysAbort(ScriptedClient):
        async def generate(self, input_ids, sampling, rid=None):
            return _Result(rid, [], [], [], "abort", len(input_ids))

    client = AlwaysAbort([])
    with pytest.raises(TooManyInterruptions, match="interrupted 4 times"):
        asyncio.run(generate_interruptible(client, [1], SamplingParams(max_new_tokens=5), max_interruptions=3))


def test_chunk_length_mismatch_is_rejected():
    from areal_graph.engines.inference.interruptible import Chunk

    gen = ChunkedGeneration(rid="x", prompt_ids=[1])
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        gen.add(Chunk("x", [1, 2], [0.0], [0, 0], "stop"))


# --------------------------------------------------------------------------- the real thing
PROMPTS = [[1, 5, 9, 13], [1, 7, 7, 3, 11, 4], [1, 100, 3, 60, 61, 62, 63]]
NEW_TOKENS = 200


@pytest.fixture(scope="module")
def two_models(tiny_model_dir, tmp_path_factory):
    """Version 0 = the served model; version 1 = different random weights saved to disk."""
    from support.tiny_models import build_random_qwen2

    v1_dir = tmp_path_factory.mktemp("tiny_qwen2_v1")
    build_random_qwen2(seed=1).save_pretrained(v1_dir)
    from transformers import AutoModelForCausalLM

    m0 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    m1 = AutoModelForCausalLM.from_pretrained(v1_dir, dtype=torch.float64).eval()
    return {"v1_dir": v1_dir, 0: m0, 1: m1}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    from areal_graph.engines.inference.server.process import ServerProcess

    proc = ServerProcess(
        str(tiny_model_dir),
        extra_args=["--threads", "1", "--max-running", "16", "--device", os.environ.get("AREAL_TEST_DEVICE", "cpu")],
    )
    proc.start()
    yield proc.url
    proc.stop()


@torch.no_grad()
def check_against_reference(models: dict, prompt: list[int], gen: ChunkedGeneration) -> None:
    """Check every token against the float64 model of the version it claims.

    Causal attention makes one teacher-forced forward of the whole sequence give each
    model's prediction for every prefix, exactly what a fresh re-prefill after a weight
    switch computes. A token must be the argmax of its version's model given the exact
    prefix, and its log-prob that model's log-softmax. A near tie (top-2 gap < 1e-4) ends
    the comparison, since float32 may break it either way and the rest then diverges.
    """
    seq = torch.tensor([list(prompt) + gen.output_ids])
    logits = {v: models[v](seq).logits[0] for v in set(gen.output_versions)}
    p = len(prompt)
    for t, (tok, lp, v) in enumerate(zip(gen.output_ids, gen.output_logprobs, gen.output_versions)):
        row = logits[v][p + t - 1]
        top2 = torch.topk(row, 2).values
        if float(top2[0] - top2[1]) < 1e-4:
            return
        assert tok == int(row.argmax()), f"token {t} (version {v}) is not that version's greedy choice"
        assert lp == pytest.approx(float(torch.log_softmax(row, -1)[tok]), abs=1e-3), f"log-prob of token {t}"


async def _tokens_generated(client) -> int:
    info = await client._request("GET", "/get_server_info")
    return int(info["internal_states"][0]["tokens_generated"])


async def _run_with_update(url: str, models: dict, sglang_style: bool) -> list[ChunkedGeneration]:
    from areal_graph.engines.inference.client import InferenceClient

    roll = InferenceClient(url, backend="embedded")
    ctrl = InferenceClient(url, backend="embedded")  # another process's view, in effect
    info = await ctrl.model_info()
    v0 = int(info["weight_version"])
    params = SamplingParams(max_new_tokens=NEW_TOKENS, greedy=True, ignore_eos=True)
    start = await _tokens_generated(ctrl)
    tasks = [asyncio.create_task(generate_interruptible(roll, p, params, rid=f"r{i}")) for i, p in enumerate(PROMPTS)]
    # update once about a fifth of the tokens exist: mid-flight however fast the machine is
    while await _tokens_generated(ctrl) - start < len(PROMPTS) * NEW_TOKENS // 5:
        await asyncio.sleep(0.005)
    assert not all(t.done() for t in tasks), "requests finished before the update: make them longer"
    if sglang_style:
        # The client's SGLang path against our server: pause {"mode": "abort"} returns the
        # in-flight requests as aborted, update, continue. The rollout client did not abort
        # them, so it resubmits prompt + tokens so far.
        sgl = InferenceClient(url, backend="sglang")
        await sgl.update_weights_from_disk(str(models["v1_dir"]), v0 + 1)
        await sgl.close()
    else:
        await ctrl.update_weights_from_disk(str(models["v1_dir"]), v0 + 1)
    gens = await asyncio.gather(*tasks)
    await roll.close()
    await ctrl.close()
    return gens


@pytest.mark.parametrize("sglang_style", [False, True], ids=["engine-resumes", "abort-and-resubmit"])
def test_weight_update_mid_generation(server, two_models, tiny_model_dir, sglang_style):
    from areal_graph.engines.inference.client import InferenceClient

    async def go():
        # every test starts from the original weights (version numbering just keeps growing)
        c = InferenceClient(server)
        v = int((await c.model_info())["weight_version"])
        if v != 0:
            await c.update_weights_from_disk(str(tiny_model_dir), v + 1)
        await c.close()
        gens = await _run_with_update(
            server, {0: two_models[0], 1: two_models[1], "v1_dir": two_models["v1_dir"]}, sglang_style
        )
        return v, gens

    v_start, gens = asyncio.run(go())
    base = v_start + 1 if v_start != 0 else 0
    switched = 0
    for prompt, gen in zip(PROMPTS, gens):
        assert gen.finish_reason == "length"
        assert len(gen.output_ids) == NEW_TOKENS, "tokens lost or duplicated"
        assert len(gen.output_logprobs) == len(gen.output_versions) == NEW_TOKENS
        assert set(gen.output_versions) <= {base, base + 1}
        # versions only move forward, once
        assert gen.output_versions == sorted(gen.output_versions)
        switched += len(set(gen.output_versions)) == 2
        models = {base: two_models[0], base + 1: two_models[1]}
        check_against_reference(models, prompt, gen)
        if len(set(gen.output_versions)) == 2:
            if sglang_style:  # one aborted chunk of old tokens, then one chunk of new ones
                assert gen.num_interruptions == 1 and len(gen.chunks) == 2
                assert gen.chunks[0].finish_reason == "abort"
                assert set(gen.chunks[0].output_versions) == {base}
                assert set(gen.chunks[1].output_versions) == {base + 1}
            else:  # the engine re-prefilled by itself: one response spanning both versions
                assert gen.num_interruptions == 0 and len(gen.chunks) == 1
    assert switched >= 1, "no trajectory spans the weight update"
