"""runtime.launcher=ray: workers and servers start in Ray actors, deaths are reported and restarted.

One Ray instance per module (started here, like a cluster a run joins by address); the
end-to-end run joins it through RAY_ADDRESS, so its processes can be seen as children of
Ray's actor processes while it trains.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'areal-graph[ray]')")

from areal_graph.runtime.launchers import LAUNCHERS, ProcessDemand  # noqa: E402
from areal_graph.runtime.launchers.ray import RayLauncher, bundle_groups, bundle_of  # noqa: E402
from areal_graph.runtime.rpc.worker_client import WorkerClient  # noqa: E402
from support.e2e import SMALL, read_metrics, run_cli, write_workflow  # noqa: E402
from support.paths import REPO, TESTS  # noqa: E402

TOKEN_ENV = "AREAL_TEST_RAY_TOKEN"
WORKER_MODULES = ("areal_graph.runtime.rpc.worker_server", "areal_graph.engines.inference.server.http_server")


@pytest.fixture(scope="module")
def cluster():
    """A Ray instance for this module: its GCS address (what RAY_ADDRESS names)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=6,
        object_store_memory=128 << 20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_the_registry_names_what_the_spec_allows() -> None:
    import typing

    from areal_graph.graph.spec import RuntimeSpec

    assert set(typing.get_args(typing.get_type_hints(RuntimeSpec)["launcher"])) == set(LAUNCHERS) == {"local", "ray"}


def test_bundles_group_data_parallel_ranks_and_label_roles() -> None:
    demands = [
        ProcessDemand("inference-0", "inference", 2, 1),
        ProcessDemand("model-actor", "model", 1, 1, "m"),
        ProcessDemand("model-actor.rank1", "model", 1, 1, "m"),
        ProcessDemand("rollout", "rollout", 1),
    ]
    groups = bundle_groups(demands)
    assert [[d.name for d in g] for g in groups] == [["inference-0"], ["model-actor", "model-actor.rank1"], ["rollout"]]
    labelled = frozenset({"areal_inference", "areal_train"})
    assert [bundle_of(g, labelled) for g in groups] == [
        {"CPU": 2.0, "GPU": 1.0, "areal_inference": 1.0},
        {"CPU": 2.0, "GPU": 2.0, "areal_train": 2.0},
        {"CPU": 1.0},
    ]
    assert bundle_of(groups[1], frozenset()) == {"CPU": 2.0, "GPU": 2.0}  # a cluster without the labels


def test_a_run_the_cluster_cannot_hold_fails_at_once_naming_it(cluster, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"could not place.*model-actor: \{'CPU': 1.0, 'GPU': 1.0\}"):
        RayLauncher(tmp_path, None, [ProcessDemand("model-actor", "model", 1, gpus=1)], ready_timeout=2)
    assert time.monotonic() - t0 < 30


def test_kill_restart_and_actor_death_are_reported_by_name(cluster, tmp_path: Path) -> None:
    """A worker killed with -9 and a killed actor each give one ProcessDied; restart brings it back."""
    deaths = []
    env = {TOKEN_ENV: "s3cret"}
    launcher = RayLauncher(
        tmp_path,
        deaths.append,
        [ProcessDemand("rollout", "rollout", 1), ProcessDemand("srv", "inference", 1)],
        poll_interval=0.2,
    )
    try:
        address = launcher.start_worker("rollout", env=env, threads=1, token_env=TOKEN_ENV, role="rollout")
        launcher.start_process("srv", "inference", [sys.executable, "-c", "import time; time.sleep(300)"])
        launcher.wait_healthy(timeout=60)
        pid = launcher.procs["rollout"].pid
        assert psutil.Process(pid).parent().name() == "ray::ProcessActor"  # the worker runs under its actor
        assert address.split(":")[0] == launcher.procs["rollout"].where["ip"]  # bound to the node's address
        assert WorkerClient(address, token="s3cret", name="rollout").health(timeout=5)["ok"]

        os.kill(pid, signal.SIGKILL)
        died = launcher.deaths.get(timeout=20)
        assert (died.name, died.role, died.returncode, died.signal) == ("rollout", "rollout", -9, "SIGKILL")
        assert "listening on" in died.log_tail  # the worker's own log, read by its actor
        assert launcher.alive() == {"rollout": False, "srv": True}

        again = launcher.restart("rollout", timeout=60)
        assert again.restarts == 1 and again.pid != pid
        assert WorkerClient(again.address, token="s3cret", name="rollout").health(timeout=5)["ok"]

        ray.kill(again.actor)  # the actor itself dies (as when its node is lost): its process goes with it
        died = launcher.deaths.get(timeout=20)
        assert (died.name, died.returncode) == ("rollout", None) and "Ray actor" in died.log_tail
        assert _wait_gone([again.pid], 15) == []
        assert launcher.restart("rollout", timeout=60).restarts == 2
        assert launcher.deaths.empty() and [d.name for d in deaths] == ["rollout", "rollout"]
        pids = [p.pid for p in launcher.procs.values()]
    finally:
        launcher.shutdown()
    assert _wait_gone(pids, 15) == []
    assert launcher.deaths.empty(), "a deliberate shutdown is not a death"
    assert ray.is_initialized(), "a Ray this launcher did not start is left running"


def test_grpo_sync_trains_with_every_process_in_a_ray_actor(cluster, kit, tmp_path: Path) -> None:
    """`runtime.launcher=ray` through the CLI, joining the module's Ray by RAY_ADDRESS."""
    wf = write_workflow(kit, tmp_path, "grpo_sync.yaml")
    run_dir = tmp_path / "run"
    seen: dict[int, str] = {}  # pid of a worker or server of this run -> its parent's process name
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_parents, args=(str(kit), str(run_dir), seen, stop), daemon=True)
    sampler.start()
    os.environ["RAY_ADDRESS"] = cluster
    try:
        proc = run_cli(
            wf,
            run_dir,
            *[o for o in SMALL if not o.startswith("runtime.save_every")],
            "runtime.launcher=ray",
            timeout=300,
        )
    finally:
        del os.environ["RAY_ADDRESS"]
        stop.set()
        sampler.join(5)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir) if "time/step" in m]
    assert [m["version"] for m in steps] == [1, 2, 3]
    assert all(math.isfinite(m["train/loss"]) for m in steps), steps
    assert any("eval/accuracy" in m for m in read_metrics(run_dir))
    # the inference server and the three workers (model-actor, rollout, reward), each under an actor
    assert len(seen) >= 4 and all(name.startswith("ray::ProcessActor") for name in seen.values()), seen


def _sample_parents(kit: str, run_dir: str, seen: dict[int, str], stop: threading.Event) -> None:
    """Every 0.2 s: this run's workers (their port file is in the run dir) and inference servers
    (they serve the test kit's model), with the name of the process that started each."""
    while not stop.wait(0.2):
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if any(m in cmd for m in WORKER_MODULES) and (run_dir in cmd or kit in cmd) and p.pid not in seen:
                try:
                    seen[p.pid] = p.parent().name()
                except (psutil.NoSuchProcess, AttributeError):
                    pass


def _wait_gone(pids: list[int | None], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if p and psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _last_step(run_dir: Path) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return max([m["step"] for m in read_metrics(run_dir) if "time/step" in m], default=0)


@pytest.mark.slow
def test_a_killed_worker_and_a_killed_server_actor_are_restarted_mid_run(cluster, kit, tmp_path: Path) -> None:
    """Through the executor: SIGKILL the rollout worker, then ray.kill the inference server's
    actor; both come back (the server on the current weights) and the run finishes every step."""
    import json
    import subprocess

    wf = write_workflow(kit, tmp_path, "ppo_async.yaml")
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(wf),
        "--run-dir",
        str(run_dir),
        *[o for o in SMALL if not o.startswith(("runtime.save_every", "runtime.steps"))],
        "runtime.steps=10",
        "runtime.launcher=ray",
    ]
    env = {**os.environ, "RAY_ADDRESS": cluster, "PYTHONPATH": str(TESTS)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: _last_step(run_dir) >= 2, 240)
        rollout = next(
            p
            for p in psutil.process_iter(["cmdline"])
            if "--name rollout" in " ".join(p.info["cmdline"] or []) and str(run_dir) in " ".join(p.info["cmdline"])
        )
        rollout.kill()
        _wait_for(lambda: _last_step(run_dir) >= 5, 240)
        server = next(
            a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith("-inference-0-0")
        )
        ray.kill(ray.get_actor(server["name"], namespace=server["namespace"]))
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert [m["version"] for m in read_metrics(run_dir) if "time/step" in m] == list(range(1, 11))
    assert json.loads((run_dir / "end_state.json").read_text())["process_restarts"] == {"rollout": 1, "inference-0": 1}


@pytest.mark.slow
def test_roles_go_to_their_labelled_nodes_and_memory_sync_packs_one_node(tmp_path: Path) -> None:
    """Two Ray nodes on this machine (one advertises areal_train, one areal_inference): the
    inference server lands on the inference node, the model worker on the training node; with
    colocate (shared-memory weights) everything shares one node. In a subprocess: its own Ray."""
    import json
    import subprocess
    import textwrap

    script = textwrap.dedent(f"""
        import json, logging, ray
        from ray.cluster_utils import Cluster
        from areal_graph.runtime.launchers import ProcessDemand
        from areal_graph.runtime.launchers.ray import RayLauncher
        small = {{"object_store_memory": 128 << 20}}
        cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 3, "include_dashboard": False,
                          "resources": {{"areal_train": 1000}}, **small}})
        cluster.add_node(num_cpus=3, resources={{"areal_inference": 1000}}, **small)
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        cluster.wait_for_nodes()
        labels = {{n["NodeID"]: "train" if "areal_train" in n["Resources"] else "inference" for n in ray.nodes()}}
        demands = [ProcessDemand("inference-0", "inference", 1), ProcessDemand("model-actor", "model", 1),
                   ProcessDemand("rollout", "rollout", 0.5)]
        out = {{}}
        for colocate in (False, True):
            launcher = RayLauncher({str(tmp_path)!r}, None, demands, colocate=colocate)
            out[str(colocate)] = {{n: labels[p.where["node_id"]] for n, p in launcher.procs.items()}}
            launcher.shutdown()
        print(json.dumps(out))
        ray.shutdown()
        cluster.shutdown()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    placed = json.loads(done.stdout.strip().splitlines()[-1])
    assert placed["False"]["inference-0"] == "inference" and placed["False"]["model-actor"] == "train"
    assert len(set(placed["True"].values())) == 1  # STRICT_PACK: one node for all


def _wait_for(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_launcher_fields_are_validated_at_load() -> None:
    from areal_graph.graph.loader import WorkflowError, load_workflow

    wf = REPO / "workflows" / "grpo_sync.yaml"
    assert load_workflow(wf, overrides=["runtime.launcher=ray", "runtime.ray_address=auto"]).runtime.launcher == "ray"
    with pytest.raises(WorkflowError) as err:
        load_workflow(wf, overrides=["runtime.ray_address=auto"])
    assert "is used only with runtime.launcher 'ray'" in str(err.value.problems)
    with pytest.raises(WorkflowError) as err:
        load_workflow(wf, overrides=["runtime.launcher=ray", "models.actor.device=cuda:1"])
    assert "write 'cuda', not 'cuda:1'" in str(err.value.problems)
    with pytest.raises(WorkflowError) as err:
        load_workflow(wf, overrides=["runtime.launcher=slurm"])
    assert "launcher" in str(err.value.problems)


def test_the_environments_settings_reach_every_actor(monkeypatch) -> None:
    """A verifiers python and NLTK's data found on the driver are found in every Ray actor too;
    other variables stay the raylet's."""
    from areal_graph.runtime.launchers.ray import forwarded_env

    monkeypatch.setenv("AREAL_VERIFIERS_PYTHON", "/opt/vf/bin/python")
    monkeypatch.setenv("NLTK_DATA", "/data/nltk")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", "/c")
    monkeypatch.setenv("SOME_SECRET", "x")
    env = forwarded_env()
    assert env["AREAL_VERIFIERS_PYTHON"] == "/opt/vf/bin/python" and env["NLTK_DATA"] == "/data/nltk"
    assert env["AREAL_GRAPH_CACHE"] == "/c" and "SOME_SECRET" not in env
