"""Trajectory, pack_trajectories and SingleTurnMath (against a real served engine)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.api.rollout import Rollout, Trajectory
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.workflows.rollout.base import pack_trajectories


# --------------------------------------------------------------------------- Trajectory
def test_from_generation_aligns_per_packed_contract():
    t = Trajectory.from_generation([1, 2, 3], [7, 8], [-0.1, -0.2], [4, 5], "stop", answer="42", group_id=3)
    assert t.input_ids == [1, 2, 3, 7, 8]
    assert t.loss_mask == [0, 0, 0, 1, 1]
    assert t.behav_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2]
    assert t.versions == [-1, -1, -1, 4, 5]
    assert t.num_generated == 2 and not t.no_eos


def test_multi_turn_append():
    t = Trajectory.from_generation([1, 2], [5], [-1.0], [0], "stop")
    t.append([9, 9], generated=False)  # tool output: not trained on
    t.append([6], generated=True, logprobs=[-2.0], versions=[1])
    assert t.loss_mask == [0, 0, 1, 0, 0, 1]
    assert t.versions == [-1, -1, 0, -1, -1, 1]
    assert t.behav_logprobs == [0.0, 0.0, -1.0, 0.0, 0.0, -2.0]
    with pytest.raises(ValueError, match="one log-prob and one version"):
        t.append([1], generated=True)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(input_ids=[1, 2], loss_mask=[0], behav_logprobs=[0, 0], versions=[-1, -1]), "loss_mask has 1"),
        (dict(input_ids=[], loss_mask=[], behav_logprobs=[], versions=[]), "empty"),
        (dict(input_ids=[1], loss_mask=[1], behav_logprobs=[0], versions=[0]), "loss_mask\\[0\\]"),
        (dict(input_ids=[1], loss_mask=[0], behav_logprobs=[0], versions=[-1], finish_reason="eos"), "finish_reason"),
    ],
)
def test_trajectory_rejects_inconsistent_fields(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        Trajectory(**kwargs)


@st.composite
def trajectories(draw):
    p = draw(st.integers(1, 6))
    o = draw(st.integers(0, 6))
    prompt = draw(st.lists(st.integers(0, 1000), min_size=p, max_size=p))
    out = draw(st.lists(st.integers(0, 1000), min_size=o, max_size=o))
    lps = draw(st.lists(st.floats(-20, 0, width=32), min_size=o, max_size=o))
    vers = sorted(draw(st.lists(st.integers(0, 9), min_size=o, max_size=o)))
    reason = draw(st.sampled_from(["stop", "length", "abort"]))
    return Trajectory.from_generation(
        prompt,
        out,
        lps,
        vers,
        reason,
        answer=str(draw(st.integers(0, 99))),
        group_id=draw(st.integers(0, 5)),
        sample_id=draw(st.integers(0, 50)),
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(trajectories(), min_size=1, max_size=6))
def test_pack_trajectories_matches_a_plain_loop(trajs):
    batch = pack_trajectories(trajs)
    assert batch.num_seqs == len(trajs)
    offset = 0
    for i, t in enumerate(trajs):
        n = len(t.input_ids)
        assert int(batch.cu_seqlens[i]) == offset
        for key in ("input_ids", "loss_mask", "versions"):
            assert batch.sequence(i, key).tolist() == getattr(t, key)
        assert batch.sequence(i, "behav_logprobs").tolist() == pytest.approx(t.behav_logprobs)
        assert int(batch["group_id"][i]) == t.group_id and int(batch["sample_id"][i]) == t.sample_id
        assert bool(batch["seq_no_eos"][i]) == (t.finish_reason != "stop")
        assert batch["answer"][i] == t.answer
        offset += n
    assert batch.num_tokens == offset
    # the packed contract: versions are -1 exactly where loss_mask is 0
    assert torch.equal(batch["versions"] == -1, batch["loss_mask"] == 0)
    assert batch["input_ids"].dtype == torch.int64 and batch["behav_logprobs"].dtype == torch.float32


def test_pack_zero_trajectories_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        pack_trajectories([])


def test_rollout_workflow_is_abstract():
    with pytest.raises(TypeError):
        Rollout()


# --------------------------------------------------------------------------- SingleTurnMath, for real
@dataclass
class _Prompt:
    id: str
    text: str
    input_ids: list
    answer: str


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    from areal_graph.engines.inference.server.process import ServerProcess

    proc = ServerProcess(str(tiny_model_dir), extra_args=["--threads", "1", "--max-running", "16"])
    proc.start()
    yield proc.url
    proc.stop()


def test_single_turn_math_produces_a_group(server):
    from areal_graph.engines.inference.client import InferenceClient, ServerPool
    from areal_graph.workflows.rollout.single_turn_math import SingleTurnMath

    prompt = _Prompt("p7", "1+1=", [1, 30, 31, 32], "2")

    async def go():
        pool = ServerPool([InferenceClient(server)])
        try:
            return await SingleTurnMath().run(prompt, pool, 6, SamplingParams(max_new_tokens=24, temperature=1.0))
        finally:
            await pool.close()

    group = asyncio.run(go())
    assert len(group) == 6
    for j, t in enumerate(group):
        n_out = len(t.input_ids) - 4
        assert t.input_ids[:4] == prompt.input_ids
        assert 1 <= n_out <= 24
        assert t.loss_mask == [0] * 4 + [1] * n_out
        assert t.versions[:4] == [-1] * 4 and all(v >= 0 for v in t.versions[4:])
        assert all(lp == 0.0 for lp in t.behav_logprobs[:4]) and all(lp <= 0.0 for lp in t.behav_logprobs[4:])
        assert t.answer == "2" and t.sample_id == j
        assert t.finish_reason in ("stop", "length")
        assert (t.finish_reason == "length") == (n_out == 24) or t.input_ids[-1] == 2
    # sampling at temperature 1 over a 128-token vocabulary: answers differ
    assert len({tuple(t.input_ids) for t in group}) > 1
    batch = pack_trajectories(group)
    assert batch.num_seqs == 6 and int(batch["loss_mask"].sum()) == sum(t.num_generated for t in group)


def test_single_turn_math_rejects_bad_input(server):
    from areal_graph.engines.inference.client import InferenceClient
    from areal_graph.workflows.rollout.single_turn_math import SingleTurnMath

    async def go(prompt, g):
        client = InferenceClient(server)
        try:
            return await SingleTurnMath().run(prompt, client, g, SamplingParams(max_new_tokens=2))
        finally:
            await client.close()

    with pytest.raises(ValueError, match="group_size"):
        asyncio.run(go(_Prompt("a", "", [1], ""), 0))
    with pytest.raises(ValueError, match="no input_ids"):
        asyncio.run(go(_Prompt("b", "", [], ""), 2))
