"""runtime/hosts/rollout_host.py in process, without servers: `RolloutHost` builds its rollout
class (with the policy's tokenizer when the class asks for one), merges sampling overrides,
runs every prompt of a batch at once on its own event loop, and stamps group and sample ids
and answers on what comes back before packing it.

The rollout class is a stand-in registered as a module for the test, so nothing reaches the
inference servers (the clients are built, never used); the whole-run tests use real ones."""

from __future__ import annotations

import asyncio
import sys
import threading
import types

import pytest
import torch

from areal_graph.api.imports import ImportPathError
from areal_graph.api.rollout import Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.hosts.rollout_host import RolloutHost, load_rollout_class

MODULE = "rollout_host_test_classes"


class EchoRollout(Rollout):
    """Per prompt: `group_size` answers `[suffix + j]`; records what it was given."""

    def __init__(self, suffix: int = 50, tokenizer_path: str | None = None) -> None:
        self.suffix, self.tokenizer_path = suffix, tokenizer_path
        self.calls: list[dict] = []
        self.started = 0

    async def run(self, prompt, client, group_size, sampling):
        self.started += 1
        self.calls.append(
            {
                "id": prompt.id,
                "answer": prompt.answer,
                "ids": list(prompt.input_ids),
                "client": client,
                "group_size": group_size,
                "sampling": sampling,
                "thread": threading.current_thread().name,
            }
        )
        # every prompt of the batch is in flight before any finishes (they are gathered, not run in turn)
        await asyncio.wait_for(self._all_started(), timeout=10)
        return [
            Trajectory.from_generation(
                prompt.input_ids, [self.suffix + j], [-0.5], [3], "stop", group_id=99, sample_id=99
            )
            for j in range(group_size)
        ]

    async def _all_started(self):
        while self.started < self.expected:
            await asyncio.sleep(0.001)

    expected = 1


class NoTokenizer(Rollout):
    def __init__(self) -> None:
        pass

    async def run(self, prompt, client, group_size, sampling):
        return []


class NotARollout:
    pass


class WithServed(Rollout):
    """Takes the pools of the workflow's lagged models."""

    def __init__(self, served_models: dict | None = None) -> None:
        self.served_models = served_models

    async def run(self, prompt, client, group_size, sampling):
        return []


@pytest.fixture
def classes(monkeypatch):
    mod = types.ModuleType(MODULE)
    mod.EchoRollout, mod.NoTokenizer, mod.NotARollout = EchoRollout, NoTokenizer, NotARollout
    mod.WithServed = WithServed
    monkeypatch.setitem(sys.modules, MODULE, mod)
    return mod


@pytest.fixture
def host(classes, monkeypatch):
    monkeypatch.setenv("AREAL_RUN_TOKEN", "secret-token")
    h = RolloutHost(
        ["http://127.0.0.1:9/", "http://127.0.0.1:10"],
        "embedded",
        f"{MODULE}:EchoRollout",
        group_size=2,
        sampling={"max_new_tokens": 5, "temperature": 0.7, "not_a_sampling_field": 1},
        rollout_args={"suffix": 40},
        tokenizer_path="/models/tok",
        request_timeout_s=12.0,
    )
    yield h
    h.close()


def _prompts(group_ids, prompts) -> PackedBatch:
    return PackedBatch.from_sequences(
        {"input_ids": prompts},
        seqs={"group_id": torch.tensor(group_ids)},
        meta={"prompt_id": [f"p{g}" for g in group_ids], "answer": [f"ans{g}" for g in group_ids]},
    )


def test_construction_builds_the_rollout_and_one_client_per_server(host):
    assert isinstance(host.rollout, EchoRollout)
    assert host.rollout.suffix == 40 and host.rollout.tokenizer_path == "/models/tok"  # handed the tokenizer
    assert [c.base_url for c in host.pool.clients] == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    assert all(c.backend == "embedded" and c.timeout == 12.0 for c in host.pool.clients)
    # the run's secret goes with every request to the servers
    assert all(c._headers == {"Authorization": "Bearer secret-token"} for c in host.pool.clients)
    assert host.span_category == "rollout"


def test_a_tokenizer_path_in_rollout_args_wins_and_classes_without_the_parameter_get_none(classes):
    h = RolloutHost(
        ["http://x:1"],
        "embedded",
        f"{MODULE}:EchoRollout",
        2,
        {},
        rollout_args={"tokenizer_path": "/mine"},
        tokenizer_path="/models/tok",
    )
    assert h.rollout.tokenizer_path == "/mine"
    h.close()
    h = RolloutHost(["http://x:1"], "embedded", f"{MODULE}:NoTokenizer", 2, {}, tokenizer_path="/models/tok")
    assert isinstance(h.rollout, NoTokenizer)  # constructed with no arguments: it would raise otherwise
    h.close()


def test_a_class_that_takes_served_models_gets_a_pool_per_lagged_model_apart_from_the_policys(classes, monkeypatch):
    monkeypatch.setenv("AREAL_RUN_TOKEN", "secret-token")
    urls = {"opponent": ["http://127.0.0.1:11", "http://127.0.0.1:12/"], "old": ["http://127.0.0.1:13"]}
    h = RolloutHost(["http://127.0.0.1:9"], "embedded", f"{MODULE}:WithServed", 2, {}, served_urls=urls)
    served = h.rollout.served_models
    assert sorted(served) == ["old", "opponent"] and served["opponent"] is h.served["opponent"]
    assert [c.base_url for c in served["opponent"].clients] == ["http://127.0.0.1:11", "http://127.0.0.1:12"]
    assert all(c._headers == {"Authorization": "Bearer secret-token"} for c in served["old"].clients)
    assert not set(map(id, h.pool.clients)) & {id(c) for p in served.values() for c in p.clients}
    h.close()
    # a class without the parameter is built without it (validate says so when rollout_args name a model)
    h = RolloutHost(["http://x:1"], "embedded", f"{MODULE}:NoTokenizer", 2, {}, served_urls=urls)
    assert isinstance(h.rollout, NoTokenizer) and sorted(h.served) == ["old", "opponent"]
    h.close()


def test_run_stamps_group_and_sample_ids_and_answers_and_packs(host):
    host.rollout.expected = 2
    out = host.run(_prompts([7, 3], [[1, 2, 3], [4, 5]]))
    assert out.num_seqs == 4
    assert out["group_id"].tolist() == [7, 7, 3, 3]
    assert out["sample_id"].tolist() == [14, 15, 6, 7]  # group id * group size + index in the group
    assert out.meta["answer"] == ["ans7", "ans7", "ans3", "ans3"]
    assert [out.sequence(i, "input_ids").tolist() for i in range(4)] == [
        [1, 2, 3, 40],
        [1, 2, 3, 41],
        [4, 5, 40],
        [4, 5, 41],
    ]
    assert out["loss_mask"].tolist() == [0, 0, 0, 1] * 2 + [0, 0, 1] * 2
    calls = sorted(host.rollout.calls, key=lambda c: c["id"])
    assert [(c["id"], c["answer"], c["ids"], c["group_size"]) for c in calls] == [
        ("p3", "ans3", [4, 5], 2),
        ("p7", "ans7", [1, 2, 3], 2),
    ]
    assert all(c["client"] is host.pool and c["thread"] == "rollout-loop" for c in calls)
    # unknown sampling keys are dropped, the rest become SamplingParams
    assert all(c["sampling"] == SamplingParams(max_new_tokens=5, temperature=0.7) for c in calls)


def test_per_call_group_size_and_sampling_override_the_nodes(host):
    out = host.run(_prompts([5], [[9]]), group_size=3, sampling={"temperature": 0.0, "seed": 4, "bogus": True})
    assert out["sample_id"].tolist() == [15, 16, 17] and out["group_id"].tolist() == [5, 5, 5]
    [call] = host.rollout.calls
    assert call["group_size"] == 3
    assert call["sampling"] == SamplingParams(max_new_tokens=5, temperature=0.0, seed=4)
    assert host.sampling == {"max_new_tokens": 5, "temperature": 0.7, "not_a_sampling_field": 1}  # unchanged


def test_close_stops_the_loop_thread(classes):
    h = RolloutHost(["http://x:1"], "embedded", f"{MODULE}:EchoRollout", 1, {})
    assert h._thread.is_alive()
    h.close()
    h._thread.join(timeout=5)
    assert not h._thread.is_alive()


def test_load_rollout_class_accepts_only_rollout_subclasses(classes):
    assert load_rollout_class(f"{MODULE}:EchoRollout") is EchoRollout
    with pytest.raises(TypeError, match=f"{MODULE}:NotARollout is not a Rollout subclass"):
        load_rollout_class(f"{MODULE}:NotARollout")
    with pytest.raises(ImportPathError, match="rollout_class"):
        load_rollout_class(f"{MODULE}:Missing")
