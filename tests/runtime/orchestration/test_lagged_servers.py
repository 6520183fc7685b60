"""A lagged model's servers (runtime/orchestration/lagged_servers.py) through the executor's
weight sync, without processes: which versions they load (every `refresh_every`, and a resume's
own), on a transport of their own whose files the policy's syncs never touch, so a restarted
lagged server replays its group's version; and where the servers are placed. The actor's host
publishes real tensors per version into shared memory; fake servers load what the file holds and
answer with its digest, so every load is checked as in a run. Real servers: tests/e2e/test_lagged_run.py."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import torch

from areal_graph.engines import shared_weights
from areal_graph.engines.inference.backends.base import WeightsReport
from areal_graph.engines.weights_digest import digest, sample_tensors
from areal_graph.graph.kind import RunInfo
from areal_graph.graph.loader import load_workflow_text
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.lagged_servers import LaggedGroup, lagged_server_names
from areal_graph.runtime.orchestration.placement import plan_placement, server_processes
from areal_graph.runtime.orchestration.process_executor import ProcessExecutor, _IOLoop
from areal_graph.runtime.orchestration.weight_sync import DiskSync, SharedMemorySync
from support.lagged import OPPONENT, lagged_selfplay_text


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"w": torch.randn(6, 4, generator=g)}


class Actor:
    """The actor's host as the executor calls it: publishes `weights(version)` where it is told."""

    def __init__(self) -> None:
        self.version, self.paths = 0, []

    def call(self, obj: str, method: str, /, **args: Any) -> Any:
        assert method == "publish_weights"
        self.paths.append(args["path"])
        return shared_weights.publish(args["path"], weights(self.version))


class Server:
    """One server's client: loads what the shared file holds, answers its version and digest."""

    def __init__(self, name: str) -> None:
        self.base_url, self.backend = f"http://{name}", "embedded"
        self.state: dict[str, torch.Tensor] = {}
        self.version, self.loads = 0, []

    async def update_weights_from_shared_memory(self, path: str, manifest: list[dict], version: int) -> None:
        self.state = {k: v.clone() for k, v in shared_weights.read(path, manifest).items()}
        self.version = version
        self.loads.append(version)

    async def weights_digest(self) -> WeightsReport:
        return WeightsReport(self.version, digest(sample_tensors(self.state), torch.float32), "float32")


class Pool:
    def __init__(self, clients: list[Server]) -> None:
        self.clients = clients

    async def update_weights_from_shared_memory(self, path: str, manifest: list[dict], version: int) -> None:
        for c in self.clients:
            await c.update_weights_from_shared_memory(path, manifest, version)


def executor(tmp_path: Path, refresh_every: int, *overrides: str) -> tuple[ProcessExecutor, Actor]:
    """The executor with its servers and the actor's host replaced by the fakes above."""
    spec = load_workflow_text(lagged_selfplay_text(refresh_every), [OPPONENT, "runtime.trace=false", *overrides])
    ex = ProcessExecutor(build_plan(spec), RunDir(tmp_path / "run", tensorboard=False))
    actor = Actor()
    ex.clients["model-actor"] = actor  # type: ignore[assignment]
    ex.servers = Pool([Server("inference-0")])
    [group] = ex.lagged
    group.pool = Pool([Server(name) for name in group.names])
    ex._io = _IOLoop()
    ex.launcher = object()  # type: ignore[assignment]  # nothing is launched here
    ex._info = RunInfo(model_paths={})
    ex._roles = {name: "inference" for name in ["inference-0", *group.names]}
    ex._ready = {name: threading.Event() for name in ex._roles}
    for event in ex._ready.values():
        event.set()
    return ex, actor


def sync(ex: ProcessExecutor, actor: Actor, version: int) -> dict[str, float]:
    actor.version = version
    return asyncio.run(ex.sync_weights(version))


def test_the_group_loads_every_nth_version_and_a_resume_loads_its_own(tmp_path):
    ex, actor = executor(tmp_path, 3)
    try:
        [group] = ex.lagged
        assert (group.model, group.every, group.names) == ("opponent", 3, ["lagged-opponent-0"])
        held = [sync(ex, actor, v)["lagged/opponent/version"] for v in range(1, 8)]
        assert held == [0, 0, 3, 3, 3, 6, 6]  # the servers start on the actor's path: version 0
        [lagged], [policy] = group.pool.clients, ex.servers.clients
        assert lagged.loads == [3, 6] and policy.loads == list(range(1, 8))
        assert torch.equal(lagged.state["w"], weights(6)["w"]) and torch.equal(policy.state["w"], weights(7)["w"])
        assert group.weights.checked == 2  # each load's digest compared with what was published
        # its own files: the policy's syncs never write where the lagged version lies
        lagged_files = {p for p in actor.paths if "-opponent-" in p}
        assert len(lagged_files) == 2 and not lagged_files & {p for p in actor.paths if "-opponent-" not in p}
        # a restarted lagged server gets its group's committed version 6, whole, though the policy is at 7
        restarted = Server("lagged-opponent-0")
        group.pool.clients[0] = restarted
        ex._restore_lagged("lagged-opponent-0")
        assert restarted.loads == [6] and torch.equal(restarted.state["w"], weights(6)["w"])
    finally:
        ex._io.stop()
        ex.weight_sync.cleanup()
        ex.lagged[0].transport.cleanup()


def test_the_cadence_across_a_resume():
    group = LaggedGroup("opponent", 4, ["lagged-opponent-0"], transport=None, weights=None)  # type: ignore[arg-type]
    # resumed at version 2: the servers' own (the actor's path) is version 0, the refresh it stands for
    assert not group.due(2) and not group.due(3) and group.due(4)
    group.loaded(4)
    assert (group.stands_for, group.version) == (4, 4) and not group.due(7) and group.due(8)
    resumed = LaggedGroup("opponent", 4, ["lagged-opponent-0"], transport=None, weights=None)  # type: ignore[arg-type]
    assert resumed.due(6)  # version 4's weights are gone with the stopped run: the nearest, 6, is loaded
    resumed.loaded(6)
    assert (resumed.stands_for, resumed.version) == (4, 6) and not resumed.due(7) and resumed.due(8)
    assert resumed.metrics() == {"lagged/opponent/version": 6.0}


def test_each_group_has_a_transport_of_its_own_and_on_disk_keeps_its_last_two_publishes(tmp_path):
    for setting, transport in (("disk", DiskSync), ("memory", SharedMemorySync)):
        spec = load_workflow_text(lagged_selfplay_text(2), [OPPONENT, f"runtime.weight_sync={setting}"])
        ex = ProcessExecutor(build_plan(spec), RunDir(tmp_path / setting, tensorboard=False))
        assert isinstance(ex.lagged[0].transport, transport) and isinstance(ex.weight_sync, transport)
        assert ex.lagged[0].transport is not ex.weight_sync
    run_dir, written = RunDir(tmp_path / "run", tensorboard=False), []

    def export(method: str, /, **args: Any) -> None:
        Path(args["path"]).mkdir(parents=True)
        written.append(args["path"])

    group = DiskSync(export, run_dir, "opponent", every=2)
    for v in (2, 4, 6):
        group.commit(group.publish(v))
    assert written == [str(run_dir.weights_dir(v, "opponent")) for v in (2, 4, 6)]
    assert [run_dir.weights_dir(v, "opponent").exists() for v in (2, 4, 6)] == [False, True, True]
    assert run_dir.weights_dir(6, "opponent") == run_dir.path / "weights" / "opponent" / "v000006"
    # resumed in the same directory: its first load is the resumed version, then the multiples of 2
    resumed = DiskSync(export, run_dir, "opponent", every=2)
    for v in (7, 8, 10):
        resumed.commit(resumed.publish(v))
    assert [run_dir.weights_dir(v, "opponent").exists() for v in (4, 6, 7, 8, 10)] == [False, False, False, True, True]


def test_lagged_servers_are_inference_side_processes_with_cores_of_their_own():
    spec = load_workflow_text(
        lagged_selfplay_text(2, servers=2),
        [OPPONENT, "resources.inference.cores=[0,1,2]", "resources.training.cores=[3]"],
    )
    assert lagged_server_names(spec) == {"opponent": ["lagged-opponent-0", "lagged-opponent-1"]}
    assert server_processes(spec) == ["inference-0", "lagged-opponent-0", "lagged-opponent-1"]
    place = plan_placement(spec, build_plan(spec), small_model=True)
    assert [place[n].cores for n in server_processes(spec)] == [(0,), (1,), (2,)]
    assert {place[n].side for n in server_processes(spec)} == {"inference"}
