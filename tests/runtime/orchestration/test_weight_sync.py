"""The weight-sync transports (runtime/orchestration/weight_sync.py), each against a fake actor
host and fake servers: what the trainer is asked to write, what the servers are told to load,
what a restarted server gets, what is deleted and when; and which transport a workflow picks.
The whole path through real processes runs in tests/e2e/test_run.py and the fault injection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from areal_graph.engines import shared_weights
from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.weights_digest import digest, sample_tensors
from areal_graph.graph.loader import load_workflow
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.weight_sync import (
    AdapterSync,
    DiskSync,
    InProcessWeightSync,
    SharedMemorySync,
    choose_weight_sync,
    resolve_weight_sync,
)
from support.paths import WORKFLOWS


class FakeActor:
    """The actor's host as `call_actor` reaches it: records calls, writes what a host would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, method: str, /, **args: Any) -> Any:
        self.calls.append((method, args))
        if method == "publish_weights":  # two tensors, the second a tied copy of the first
            return [
                {"name": "a", "dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16},
                {"name": "b", "dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16},
                {"name": "c", "dtype": "float32", "shape": [2], "offset": 64, "nbytes": 8},
            ]
        path = Path(args["path"])
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.safetensors").write_bytes(b"x" * 100)
        return str(path)


class FakeServers:
    """A ServerPool or one InferenceClient: records what it was told to load."""

    def __init__(self) -> None:
        self.loaded: list[tuple] = []

    async def update_weights_from_shared_memory(self, path: str, manifest: list[dict], version: int) -> None:
        self.loaded.append(("memory", path, len(manifest), version))

    async def update_weights_from_disk(self, path: str, version: int) -> None:
        self.loaded.append(("disk", path, version))

    async def load_adapter(self, path: str, version: int, unload: int | None = None) -> None:
        self.loaded.append(("adapter", path, version, unload))


def sync(transport: Any, servers: FakeServers, version: int, commit: bool = True) -> float:
    """One sync as the executor runs it: publish, every server loads, commit (unless the load failed)."""
    published = transport.publish(version)
    asyncio.run(transport.apply(servers, published))
    if commit:
        transport.commit(published)
    return published.nbytes


def test_shared_memory_writes_two_files_in_turn_never_the_committed_one(tmp_path):
    actor, servers, restarted = FakeActor(), FakeServers(), FakeServers()
    shm = tmp_path / "weights"
    a, b = f"{shm}-a", f"{shm}-b"
    t = SharedMemorySync(actor, str(shm))
    assert asyncio.run(t.restore(restarted)) is None
    assert restarted.loaded == []  # before the first sync the initial weights are the current ones
    assert sync(t, servers, 1) == 24.0  # the tied copy counted once
    sync(t, servers, 2)
    sync(t, servers, 3, commit=False)  # a server died during the load: version 2 stays committed
    sync(t, servers, 3)  # redone: the same free file again, never version 2's
    assert [args["path"] for _, args in actor.calls] == [a, b, a, a]
    assert servers.loaded == [("memory", a, 3, 1), ("memory", b, 3, 2), ("memory", a, 3, 3), ("memory", a, 3, 3)]
    assert asyncio.run(t.restore(restarted)).version == 3
    assert restarted.loaded == [("memory", a, 3, 3)]
    sync(t, servers, 4)
    assert actor.calls[-1][1]["path"] == b
    for path in (a, b):
        Path(path).write_bytes(b"")
    t.cleanup()
    assert not Path(a).exists() and not Path(b).exists()
    assert (t.mode, t.colocate, t.adapters, t.server_launch()) == ("memory", True, False, ([], {}))


def test_a_version_whose_load_failed_is_not_what_a_restarted_server_gets(tmp_path):
    """Until commit, restore replays the version before: the new one may not be whole on every server."""
    for t in (
        SharedMemorySync(FakeActor(), str(tmp_path / "w")),
        DiskSync(FakeActor(), RunDir(tmp_path / "run", tensorboard=False)),
    ):
        servers, restarted = FakeServers(), FakeServers()
        sync(t, servers, 1)
        sync(t, servers, 2, commit=False)
        assert asyncio.run(t.restore(restarted)).version == 1
        assert [entry[-1] for entry in restarted.loaded] == [1], t.mode


def test_disk_keeps_the_served_version_and_the_one_before(tmp_path):
    actor, servers, restarted = FakeActor(), FakeServers(), FakeServers()
    run_dir = RunDir(tmp_path / "run", tensorboard=False)
    t = DiskSync(actor, run_dir)
    for v in (1, 2):
        assert sync(t, servers, v) == 100.0
    sync(t, servers, 3, commit=False)
    assert run_dir.weights_dir(1).exists()  # nothing is deleted before every server holds the new one
    sync(t, servers, 3)
    assert [c[0] for c in actor.calls] == ["export_weights"] * 4
    assert servers.loaded == [("disk", str(run_dir.weights_dir(v)), v) for v in (1, 2, 3, 3)]
    assert not run_dir.weights_dir(1).exists() and run_dir.weights_dir(2).exists() and run_dir.weights_dir(3).exists()
    assert asyncio.run(t.restore(restarted)).version == 3
    assert restarted.loaded == [("disk", str(run_dir.weights_dir(3)), 3)]
    t.cleanup()
    assert run_dir.weights_dir(3).exists() and not t.colocate and not t.adapters


def test_adapter_unloads_and_deletes_the_one_kept_versions_back(tmp_path):
    actor, servers, restarted = FakeActor(), FakeServers(), FakeServers()
    run_dir = RunDir(tmp_path / "run", tensorboard=False)
    t = AdapterSync(actor, run_dir, get_backend("vllm"), rank=8, target_modules=["q_proj"], kept=2)
    for v in (0, 1, 2, 3):
        sync(t, servers, v)
    assert [c[0] for c in actor.calls] == ["export_adapter"] * 4
    assert [(v, unload) for _, _, v, unload in servers.loaded] == [(0, None), (1, None), (2, 0), (3, 1)]
    assert [run_dir.weights_dir(v).exists() for v in range(4)] == [False, False, True, True]
    assert asyncio.run(t.restore(restarted)).version == 3
    assert restarted.loaded == [("adapter", str(run_dir.weights_dir(3)), 3, None)]  # loaded, nothing unloaded
    flags, env = t.server_launch()
    assert (
        flags == get_backend("vllm").lora_launch_flags(8, ["q_proj"], 2)
        and env == get_backend("vllm").lora_environment()
    )
    assert t.adapters and t.mode == "adapter"


class WritingActor:
    """The actor's host writing real files: shared memory (engines/shared_weights.py) and safetensors."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def __call__(self, method: str, /, **args: Any) -> Any:
        if method == "publish_weights":
            return shared_weights.publish(args["path"], self.state)
        path = Path(args["path"])
        path.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in self.state.items()}, path / "model.safetensors")
        return str(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_what_each_transport_wrote_reads_back_as_the_trainers_weights(tmp_path, dtype):
    """The digest the executor checks servers against, read from the published file, is that of
    the trainer's tensors (as a server holding `dtype` has them); another version's is not."""
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(7, 5, generator=g), "b": torch.randn(3, generator=g), "s": torch.tensor(0.5)}
    actor = WritingActor(state)
    for t in (
        SharedMemorySync(actor, str(tmp_path / "w")),
        DiskSync(actor, RunDir(tmp_path / "run", tensorboard=False)),
    ):
        published = t.publish(1)
        assert digest(t.samples(published), dtype) == digest(sample_tensors(state), dtype), t.mode
        actor.state = {**state, "w": state["w"] + 1e-3}  # another version: one tensor moved a little
        assert digest(t.samples(t.publish(2)), dtype) != digest(sample_tensors(state), dtype), t.mode
        actor.state = state
        t.cleanup()


def test_in_process_hands_the_engine_the_trainers_own_tensors():
    class Trainer:
        def __init__(self) -> None:
            w = torch.ones(4)
            self.state = {"a": w, "tied": w, "b": torch.zeros(2, dtype=torch.float64)}

        def state_dict_for_sync(self, copy: bool = True) -> dict[str, torch.Tensor]:
            assert not copy
            return self.state

    class Engine:
        def __init__(self) -> None:
            self.got: list[tuple] = []

        def update_weights_from_state_dict(self, state: dict, version: int) -> None:
            self.got.append((state, version))

    trainer, engine = Trainer(), Engine()
    t = InProcessWeightSync(trainer)
    assert sync(t, engine, 5) == 16.0 + 16.0  # the tied tensor once
    assert engine.got == [(trainer.state, 5)] and engine.got[0][0]["a"] is trainer.state["a"]
    assert asyncio.run(t.restore(engine)) is None
    t.cleanup()
    assert len(engine.got) == 1 and t.colocate
    assert sorted(t.samples(t.publish(6))) == ["a", "b", "tied"]


@pytest.mark.parametrize(
    "backend,overrides,want",
    [
        ("embedded", [], (SharedMemorySync, True)),
        ("sglang", [], (DiskSync, False)),
        ("vllm", [], (SharedMemorySync, True)),
        ("embedded", ["runtime.weight_sync=disk"], (DiskSync, False)),
        ("embedded", ["models.actor.lora.r=4"], (SharedMemorySync, True)),  # the engine merges adapters itself
        ("vllm", ["models.actor.lora.r=4"], (AdapterSync, True)),  # auto on vLLM colocates, as it did
        ("sglang", ["models.actor.lora.r=4"], (AdapterSync, False)),
        ("vllm", ["models.actor.lora.r=4", "models.actor.lora.sync=merged"], (SharedMemorySync, True)),
    ],
)
def test_a_workflow_picks_its_transport_once(tmp_path, backend, overrides, want):
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml", [f"inference.backend={backend}", *overrides])
    t = choose_weight_sync(spec, "actor", get_backend(backend), RunDir(tmp_path, tensorboard=False), FakeActor())
    assert (type(t), t.colocate) == want
    assert resolve_weight_sync("auto", get_backend(backend)) == ("disk" if backend == "sglang" else "memory")
