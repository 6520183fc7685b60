"""Start a run's processes as Ray actors: on this machine, or across a Ray cluster.

Why actors that start processes (instead of running workers as actors): a worker or an
inference server keeps exactly the gRPC and HTTP interfaces it has under the local launcher,
so the controller, the protocol and the node code do not know Ray is there. Each process has
its own `ProcessActor`, which owns it through a `LocalLauncher` of its own (same entry
points, environment, thread caps, log file and parent-death arming: when the actor dies, its
process dies with it). The actor binds the process to its node's address, so the controller
reaches it from any node; the run's secret token guards it (as it does on loopback).

Gang scheduling: every process's CPUs and GPUs (`ProcessDemand`, from the workflow's threads
and model devices) are one bundle of one placement group, reserved before anything starts,
so a run starts whole or fails at once with what it asked and what the cluster has.
STRICT_PACK when weights go through shared memory (one machine), PACK otherwise. Nodes that
advertise the role resources (`areal_inference`, `areal_train`; the SLURM script starts its
nodes with them) get inference servers and model workers respectively.

Deaths: a watchdog thread polls every actor. A process that exits is `ProcessDied` with its
exit code and log tail; an actor that dies (killed, its node lost) is `ProcessDied` with no
exit code and the reason. `restart` starts the process again in a fresh actor in the same
bundle (the same node), as it was first started. Whether a death is restarted at all is decided
by the executor, the same way for every launcher (runtime/launchers/restart_budget.py: at most
`runtime.max_restarts` within any `runtime.restart_window_s`); Ray itself never restarts an actor
(`max_restarts=0` below), so no second count runs beside it.

Joining: `runtime.ray_address` or RAY_ADDRESS (e.g. "auto" on a node of a cluster started
with `ray start`); else a Ray instance is started here with the machine's cores (the
demands fit them: see runtime/orchestration/placement.py:process_demands) and stopped again at shutdown. An
already initialised Ray (a notebook, a test) is used as it is and left running.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from areal_graph.runtime.launchers.base import LaunchRequest, ProcessDemand, ProcessDied, report_death, signal_name
from areal_graph.runtime.launchers.local import (
    LocalLauncher,
    endpoint_healthy,
    free_port,
    tail,
    wait_until_healthy,
)

log = logging.getLogger(__name__)

# Ray's object store lives in /dev/shm, where shared-memory weight sync also writes: the
# launcher passes only small messages through it, so keep it at Ray's floor, not 30% of RAM.
OBJECT_STORE_BYTES = 128 << 20
# On a cluster joined by address an actor's environment is its raylet's, not the driver's:
# these reach every process, so caches, hub settings, test modules and the environments' own
# settings (verifiers' python: data/verifiers_venv.py; NLTK's data for TextArena games) resolve
# the same way.
FORWARDED_ENV_PREFIXES = ("AREAL_GRAPH_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
FORWARDED_ENV_KEYS = ("PYTHONPATH", "AREAL_VERIFIERS_PYTHON", "NLTK_DATA")
CALL_TIMEOUT_S = 30.0  # a short actor call (poll, tail, stop) that takes longer counts as lost


class ProcessActor:
    """Inside a Ray actor: starts and owns one process with the local launcher's entry points.

    The working directory is the driver's where it exists on this node (a shared file
    system), so relative run and model paths mean what they mean to the controller.
    """

    def __init__(self, log_dir: str, cwd: str) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.ip = ray.util.get_node_ip_address()
        self.launcher = LocalLauncher(log_dir)
        self.name: str | None = None

    def where(self) -> dict[str, Any]:
        return {"ip": self.ip, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def endpoint(self) -> tuple[str, int]:
        """This node's address and a port free on it now, for a server to bind."""
        return self.ip, free_port(self.ip)

    def start_worker(
        self,
        name: str,
        env: dict[str, str],
        threads: int | None,
        token_env: str | None,
        role: str,
        startup_timeout: float,
        max_concurrent_calls: int | None,
    ) -> tuple[str, int]:
        self.name = name
        address = self.launcher.start_worker(
            name,
            env,
            threads,
            host=self.ip,
            token_env=token_env,
            role=role,
            startup_timeout=startup_timeout,
            max_concurrent_calls=max_concurrent_calls,
        )
        return address, self.launcher.procs[name].popen.pid

    def start_process(
        self, name: str, role: str, cmd: Sequence[str], env: dict[str, str], threads: int | None, cwd: str | None
    ) -> int:
        self.name = name
        return self.launcher.start_process(name, role, cmd, env=env, threads=threads, cwd=cwd)

    def poll(self) -> int | None:
        """The process's exit code; None while it runs (or before it started)."""
        return None if self.name is None else self.launcher.procs[self.name].popen.poll()

    def log_tail(self) -> str:
        return "" if self.name is None else tail(self.launcher.procs[self.name].log_path)

    def stop(self) -> None:
        self.launcher.shutdown()


RemoteProcessActor = ray.remote(max_restarts=0)(ProcessActor)


@dataclass
class RayProcess:
    """The driver's view of one process: its demand, bundle, actor and endpoint."""

    demand: ProcessDemand
    bundle: int | None  # index in the run's placement group; None: placed outside it
    log_path: Path
    actor: Any = None
    where: dict[str, Any] = field(default_factory=dict)
    address: str | None = None  # "host:port" of a gRPC worker
    health_url: str | None = None
    token: str | None = None
    pid: int | None = None
    start: Callable[[], None] | None = None  # starts it (again) in `actor`, as first started
    reported: bool = False
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.demand.name

    @property
    def role(self) -> str:
        return self.demand.role


class RayLauncher:
    """The `Launcher` of `runtime.launcher: ray` (see module docstring)."""

    def __init__(
        self,
        log_dir: Path | str,
        on_death: Callable[[ProcessDied], None] | None,
        demands: Sequence[ProcessDemand],
        address: str | None = None,
        colocate: bool = False,
        poll_interval: float = 0.5,
        ready_timeout: float = 120.0,
    ) -> None:
        self.log_dir = Path(log_dir).resolve()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.on_death = on_death
        self.deaths: queue.Queue[ProcessDied] = queue.Queue()
        self.poll_interval = poll_interval
        self.run_id = uuid.uuid4().hex[:8]
        self.procs: dict[str, RayProcess] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._env_before = {k: v for k, v in os.environ.items() if _set_by_ray_init(k)}
        self._owns_ray = connect(address, demands)
        self.pg: PlacementGroup | None = None
        self._labelled: frozenset[str] = frozenset()  # role resources the cluster has (see _reserve)
        try:
            groups = bundle_groups(demands)
            self.pg, self._labelled = self._reserve(groups, colocate, ready_timeout)
            for i, members in enumerate(groups):
                for demand in members:
                    self.procs[demand.name] = RayProcess(demand, i, self.log_dir / f"{demand.name}.log")
                    self.procs[demand.name].actor = self._new_actor(self.procs[demand.name], self._labelled)
            self._locate(list(self.procs.values()))  # every actor starts at once; waits for all
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def for_run(cls, request: LaunchRequest) -> RayLauncher:
        return cls(
            request.log_dir,
            request.on_death,
            request.demands,
            address=request.runtime.ray_address,
            colocate=request.colocate,
        )

    # ------------------------------------------------------------------ placement
    def _reserve(
        self, groups: list[list[ProcessDemand]], colocate: bool, timeout: float
    ) -> tuple[PlacementGroup, frozenset[str]]:
        """One bundle per process group, reserved together; raise naming the shortfall if it cannot be."""
        cluster = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        labelled = (
            frozenset()
            if colocate
            else frozenset(g[0].node_resource for g in groups if g[0].node_resource and g[0].node_resource in cluster)
        )
        if colocate and nodes > 1:
            log.warning(
                "runtime.weight_sync is 'memory' (shared memory, one machine): every process of the run "
                "is packed on one of the %d Ray nodes; set runtime.weight_sync=disk (run_dir on a shared "
                "file system) to spread them",
                nodes,
            )
        bundles = [bundle_of(g, labelled) for g in groups]
        strategy = "STRICT_PACK" if colocate else "PACK"
        pg = placement_group(bundles, strategy=strategy, name=f"areal-{self.run_id}")
        try:
            ray.get(pg.ready(), timeout=timeout)
        except GetTimeoutError:
            remove_placement_group(pg)
            asked = "; ".join(f"{'+'.join(d.name for d in g)}: {b}" for g, b in zip(groups, bundles))
            raise RuntimeError(
                f"Ray could not place the run's processes within {timeout:.0f} s ({strategy}): "
                f"they ask {asked}; the cluster ({nodes} node(s)) has "
                f"{ {k: v for k, v in sorted(cluster.items()) if '_group_' not in k} }"
            ) from None
        log.info(
            "Ray placement group %s ready: %d processes on %d node(s), %s",
            pg.id.hex()[:8],
            len(bundles),
            nodes,
            strategy,
        )
        return pg, labelled

    def _new_actor(self, proc: RayProcess, labelled: frozenset[str]) -> Any:
        d = proc.demand
        options: dict[str, Any] = {
            "num_cpus": d.cpus,
            "num_gpus": d.gpus,
            "max_concurrency": 1,
            "name": f"areal-{self.run_id}-{d.name}-{proc.restarts}",
        }
        if d.node_resource in labelled:
            options["resources"] = {d.node_resource: 1}
        if proc.bundle is not None and self.pg is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=proc.bundle
            )
        return RemoteProcessActor.options(**options).remote(str(self.log_dir), os.getcwd())

    def _locate(self, procs: list[RayProcess]) -> None:
        wheres = ray.get([p.actor.where.remote() for p in procs], timeout=300)
        for p, where in zip(procs, wheres):
            p.where = where
            log.info("%s (%s): Ray actor pid %d on node %s", p.name, p.role, where["pid"], where["ip"])

    def _proc(self, name: str, role: str, threads: int | None) -> RayProcess:
        """The process `name` was declared as; one nobody declared gets an actor outside the group."""
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the launcher is shut down")
            proc = self.procs.get(name)
            if proc is None:
                log.warning(
                    "%s was not among the run's declared processes: it is placed outside the placement group (%s CPU)",
                    name,
                    threads or 1,
                )
                proc = self.procs[name] = RayProcess(
                    ProcessDemand(name, role, float(threads or 1)), None, self.log_dir / f"{name}.log"
                )
                proc.actor = self._new_actor(proc, self._labelled)
                self._locate([proc])
            elif proc.start is not None:
                raise ValueError(f"a process named {name!r} was already started")
            return proc

    # ------------------------------------------------------------------ start
    def server_endpoint(self, name: str) -> tuple[str, int]:
        """The node address and a free port there, for server `name` to bind."""
        proc = self._proc(name, "inference", None)
        return tuple(ray.get(proc.actor.endpoint.remote(), timeout=CALL_TIMEOUT_S))

    def start_process(
        self,
        name: str,
        role: str,
        cmd: Sequence[str],
        env: dict[str, str] | None = None,
        threads: int | None = None,
        health_url: str | None = None,
        cwd: str | Path | None = None,
    ) -> int:
        """Start a server process in its actor; `health_url` is what `wait_healthy` polls."""
        proc = self._proc(name, role, threads)
        full_env = {**forwarded_env(), **(env or {})}

        def start() -> None:
            proc.pid = ray.get(
                proc.actor.start_process.remote(
                    name, role, list(cmd), full_env, threads, None if cwd is None else str(cwd)
                ),
                timeout=120,
            )

        proc.health_url, proc.start = health_url, start
        start()
        self._ensure_watchdog()
        assert proc.pid is not None  # start() set it
        return proc.pid

    def start_worker(
        self,
        name: str,
        env: dict[str, str] | None = None,
        threads: int | None = None,
        host: str | None = None,
        token_env: str | None = None,
        role: str = "worker",
        startup_timeout: float = 60.0,
        max_concurrent_calls: int | None = None,
    ) -> str:
        """Start a gRPC worker in its actor, bound to the actor's node address (`host` is not
        used: only that address is reachable from the controller's node); returns "host:port"."""
        proc = self._proc(name, role, threads)
        full_env = {**forwarded_env(), **(env or {})}

        def start() -> None:
            proc.address, proc.pid = ray.get(
                proc.actor.start_worker.remote(
                    name, full_env, threads, token_env, role, startup_timeout, max_concurrent_calls
                ),
                timeout=startup_timeout + 60,
            )

        if token_env:
            proc.token = (env or {}).get(token_env) or os.environ.get(token_env)
        proc.start = start
        start()
        self._ensure_watchdog()
        return str(proc.address)

    # ------------------------------------------------------------------ health
    def _exit_code(self, proc: RayProcess) -> int | None:
        """The process's exit code (None: running); raise naming it when its actor is gone."""
        try:
            return ray.get(proc.actor.poll.remote(), timeout=CALL_TIMEOUT_S)
        except RayActorError as err:
            raise RuntimeError(
                f"the Ray actor of {proc.role} {proc.name!r} died: {first_line(err)}; "
                f"log {proc.log_path}:\n{tail(proc.log_path)}"
            ) from None

    def wait_healthy(self, timeout: float = 120.0, names: Sequence[str] | None = None) -> None:
        """Block until every (named, started) process answers its health check; raise naming the laggards."""
        pending = set(names) if names is not None else {n for n, p in self.procs.items() if p.start is not None}
        wait_until_healthy(
            pending,
            timeout,
            exit_code=lambda n: self._exit_code(self.procs[n]),
            healthy=lambda n: (
                endpoint_healthy(n, self.procs[n].address, self.procs[n].token, self.procs[n].health_url) is not False
            ),
            role=lambda n: self.procs[n].role,
            log_path=lambda n: self.procs[n].log_path,
            log_tail=lambda n: self._log_tail(self.procs[n]),
        )

    def _log_tail(self, proc: RayProcess) -> str:
        """The end of its log, read by its actor (its node's disk), else from here."""
        try:
            return ray.get(proc.actor.log_tail.remote(), timeout=CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the actor is gone: the log may still be on a shared disk
            return tail(proc.log_path)

    def alive(self) -> dict[str, bool]:
        out = {}
        for name, proc in list(self.procs.items()):
            try:
                out[name] = proc.pid is not None and self._exit_code(proc) is None
            except RuntimeError:
                out[name] = False
        return out

    def address(self, name: str) -> str:
        addr = self.procs[name].address
        if addr is None:
            raise KeyError(f"{name!r} is not a gRPC worker")
        return addr

    # ------------------------------------------------------------------ watchdog
    def _ensure_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="ray-launcher-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        polls: dict[str, tuple[Any, Any]] = {}  # name -> (actor, its poll in flight): a hung actor is asked once
        while not self._stopping.wait(self.poll_interval):
            with self._lock:
                procs = [p for p in self.procs.values() if p.pid is not None and not p.reported]
                for p in procs:
                    if p.name not in polls or polls[p.name][0] is not p.actor:  # new, or restarted meanwhile
                        polls[p.name] = (p.actor, p.actor.poll.remote())
            if not polls:
                continue
            ready, _ = ray.wait([ref for _, ref in polls.values()], num_returns=len(polls), timeout=0)
            done = set(ready)
            answered = [n for n, (_, ref) in polls.items() if ref in done]
            with self._lock:  # an answer from an actor that a restart replaced meanwhile says nothing
                deaths = [d for d in (self._death_of(self.procs[n], *polls.pop(n)) for n in answered) if d is not None]
            if deaths:
                polls.clear()  # a restart replaces actors: ask every one again next round
            for died in deaths:
                if self._stopping.is_set():
                    return
                self._report(died)

    def _death_of(self, proc: RayProcess, actor: Any, ref: Any) -> ProcessDied | None:
        if actor is not proc.actor or proc.reported:
            return None
        try:
            code = ray.get(ref)
        except RayActorError as err:
            return ProcessDied(
                proc.name,
                proc.role,
                None,
                None,
                tail(proc.log_path) + f"\n[the Ray actor that hosted it died: {first_line(err)}]",
            )
        if code is None:
            return None
        sig = signal_name(code)
        return ProcessDied(proc.name, proc.role, code, sig, self._log_tail(proc))

    def _report(self, died: ProcessDied) -> None:
        self.procs[died.name].reported = True
        report_death(died, self.deaths, self.on_death, log)

    def restart(self, name: str, timeout: float = 180.0) -> RayProcess:
        """Start a process that died again, as it was first started, in a fresh actor in the same
        bundle (the same node; a worker binds a new port: see `address`), and wait until healthy."""
        with self._lock:
            proc = self.procs.get(name)
            if proc is None or proc.start is None:
                raise KeyError(f"no process {name!r} to restart")
            try:
                running = proc.pid is not None and self._exit_code(proc) is None
            except RuntimeError:  # its actor is gone, and the process with it
                running = False
            if running:
                raise RuntimeError(f"{name!r} is still running")
            ray.kill(proc.actor, no_restart=True)
            proc.restarts += 1
            proc.actor = self._new_actor(proc, self._labelled)
            self._locate([proc])
            proc.pid = None
            proc.start()
            proc.reported = False
        self.wait_healthy(timeout=timeout, names=[name])
        log.warning(
            "restarted %s %r (restart %d), pid %d on node %s",
            proc.role,
            name,
            proc.restarts,
            proc.pid,
            proc.where.get("ip"),
        )
        return proc

    # ------------------------------------------------------------------ stop
    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every process (each actor stops its own, descendants included), the actors,
        the placement group, and Ray itself when this launcher started it."""
        if self._stopping.is_set() and self.pg is None and not self._owns_ray:
            return  # already shut down
        self._stopping.set()
        actors = [p.actor for p in self.procs.values() if p.actor is not None]
        if actors:
            ray.wait([a.stop.remote() for a in actors], num_returns=len(actors), timeout=timeout + 5)
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=2.0)
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
            self._restore_env()

    def _restore_env(self) -> None:
        """Undo what ray.init put in this process's environment (RAY_AUTH_MODE, PYTHONBREAKPOINT,
        ...): processes this controller starts later, by any launcher, must not inherit it."""
        for key in [k for k in os.environ if _set_by_ray_init(k)]:
            if key not in self._env_before:
                del os.environ[key]
        os.environ.update(self._env_before)

    def __enter__(self) -> RayLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def connect(address: str | None, demands: Sequence[ProcessDemand]) -> bool:
    """Join `address` (or RAY_ADDRESS), else start a Ray instance here; True when this call
    initialised Ray (so shutdown stops it). An initialised Ray is used as it is."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **quiet)
        log.info("joined the Ray cluster at %s: %s", address, ray.cluster_resources())
        return True
    cores = os.cpu_count() or 1
    asked = math.ceil(sum(d.cpus for d in demands))
    if asked > cores:
        log.warning(
            "the run's processes ask %d CPUs on %d cores: the local Ray instance advertises %d", asked, cores, asked
        )
    # address "local": a new instance even where `ray start` left /tmp/ray/ray_current_cluster behind
    ray.init(
        address="local",
        num_cpus=max(cores, asked),
        object_store_memory=OBJECT_STORE_BYTES,
        include_dashboard=False,
        **quiet,
    )
    return True


def bundle_groups(demands: Sequence[ProcessDemand]) -> list[list[ProcessDemand]]:
    """The processes that share a bundle (one machine): a group's members, else each alone."""
    groups: dict[tuple[bool, str], list[ProcessDemand]] = {}
    for d in demands:
        groups.setdefault((d.group is None, d.group or d.name), []).append(d)
    return list(groups.values())


def bundle_of(group: Sequence[ProcessDemand], labelled: frozenset[str]) -> dict[str, float]:
    """The placement-group bundle of a process group: the sum of its CPUs and GPUs, plus one
    unit of its role's node resource per process where the cluster has it."""
    bundle: dict[str, float] = {"CPU": float(sum(d.cpus for d in group))}
    gpus = sum(d.gpus for d in group)
    if gpus:
        bundle["GPU"] = float(gpus)
    resource = group[0].node_resource
    if resource in labelled:
        bundle[str(resource)] = float(len(group))
    return bundle


def forwarded_env() -> dict[str, str]:
    """The driver's variables every process should see wherever it runs (see FORWARDED_ENV_*)."""
    return {k: v for k, v in os.environ.items() if k in FORWARDED_ENV_KEYS or k.startswith(FORWARDED_ENV_PREFIXES)}


def _set_by_ray_init(key: str) -> bool:
    return key.startswith("RAY_") or key == "PYTHONBREAKPOINT"


def first_line(err: BaseException) -> str:
    """The first line of an error (Ray's carry a traceback after it)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
