"""The executor of a real run: inference servers and gRPC worker processes, started, called, stopped.

Everything here is read off the plan: one worker process per distinct `Hosting.process`
(threads by its role), one hosted object per distinct (process, object), built from the
kind's `host_args`, and every node call is the kind's `call` sent to that object. Nodes the
plan places in the controller run in this process (`LocalHosts`).

Weight sync: the executor holds one transport, chosen from the workflow when it is built
(weight_sync.py: shared memory, disk or a LoRA adapter), and calls its publish, then has
`ServerWeights` (server_weights.py) load it onto the servers, check each and commit it, and
restore a restarted server, in turns, whatever the transport. docs/architecture.md, section
4, follows one sync hop by hop. A lagged model's servers (`lagged-<model>-<i>`,
lagged_servers.py) are inference servers like the policy's, with a transport of their own,
loaded after the policy's every `refresh_every` versions.

Processes that come back: a stateless process that dies (a rollout, reward or function
worker, an inference server) is started again, at most `runtime.max_restarts` times within
any `runtime.restart_window_s` seconds each (runtime/launchers/restart_budget.py, whichever
launcher runs it); a worker gets its hosted objects configured again, a server the last
committed weights. Node calls that failed because a process died are redone once it is back
(the controller never sees them fail). A model worker holds weights and optimizer state: its
death stops the run (resume from the last checkpoint with `areal-graph run --resume`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from areal_graph.api.process import RUN_TOKEN_ENV
from areal_graph.api.spans import TRACE_ENV
from areal_graph.data.packed import PackedBatch
from areal_graph.engines.inference.backends import ServerLaunch, get_backend
from areal_graph.engines.inference.client import InferenceClient, ServerPool
from areal_graph.graph.kind import CONTROLLER, RunInfo
from areal_graph.graph.plan import ExecutionPlan
from areal_graph.runtime.hosts.protocols import ModelService
from areal_graph.runtime.launchers import Launcher, LaunchRequest, ProcessDied, make_launcher
from areal_graph.runtime.launchers.local import free_port
from areal_graph.runtime.launchers.restart_budget import RestartBudget
from areal_graph.runtime.observability.clocks import ProcessClocks
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.executor import LocalHosts
from areal_graph.runtime.orchestration.lagged_servers import LaggedGroup, lagged_server_names
from areal_graph.runtime.orchestration.phase_runner import NodeResult
from areal_graph.runtime.orchestration.placement import (
    SMALL_MODEL_PARAMS,
    ProcessPlacement,
    inference_server_command,
    model_parameters,
    pin_this_process,
    placed_env,
    plan_placement,
    process_demands,
    thread_split,
)
from areal_graph.runtime.orchestration.server_weights import ServerWeights, WeightsMismatch
from areal_graph.runtime.orchestration.weight_sync import Published, WeightSync, choose_weight_sync
from areal_graph.runtime.orchestration.weight_sync import resolve_weight_sync as resolve_weight_sync
from areal_graph.runtime.rpc.worker_client import WorkerClient

log = logging.getLogger(__name__)

DP_RANK_MODULE = "areal_graph.runtime.hosts.dp_model_host"  # ranks 1..N-1 of a model with dp_size > 1


@dataclasses.dataclass(frozen=True)
class _Started:
    """The parts of a started executor (ProcessExecutor._started)."""

    launcher: Launcher
    io: _IOLoop
    info: RunInfo


def _worker_clock(client: WorkerClient) -> float:
    return client.stats(drain_spans=False)["now"]


def _server_clock(io: _IOLoop, client: Any) -> float:
    return io.run(client.server_clock(), timeout=10)


class ProcessExecutor:
    """Runs the plan's nodes in worker processes its launcher starts (on this machine, or
    on others with Ray; see the module docstring)."""

    def __init__(self, plan: ExecutionPlan, run_dir: RunDir) -> None:
        self.plan = plan
        self.spec = plan.spec
        self.run_dir = run_dir
        self.launcher: Launcher | None = None  # the one runtime.launcher names
        self.clients: dict[str, WorkerClient] = {}
        self.server_urls: list[str] = []
        self.servers: Any = None  # ServerPool, created in start()
        self.local: LocalHosts | None = None
        self._io: _IOLoop | None = None  # HTTP to the inference servers runs on its own event loop
        self.backend = get_backend(self.spec.inference.backend)  # the inference servers' API (backends/)
        # the one transport of this run's weights (weight_sync.py), chosen here once
        self.weight_sync: WeightSync = choose_weight_sync(
            self.spec, plan.actor, self.backend, run_dir, self._call_actor
        )
        # its loads onto the servers, in turns and checked (server_weights.py)
        self.server_weights = ServerWeights(
            self.weight_sync, [f"inference-{i}" for i in range(self.spec.inference.servers)]
        )
        # the lagged models' servers, each group with a transport of its own (lagged_servers.py)
        self.lagged: list[LaggedGroup] = [
            LaggedGroup.build(
                self.spec,
                model,
                names,
                choose_weight_sync(self.spec, plan.actor, self.backend, run_dir, self._call_actor, group=model),
            )
            for model, names in lagged_server_names(self.spec).items()
        ]
        self._roles: dict[str, str] = {}  # process name -> role (model, rollout, reward, ..., inference)
        self._ready: dict[str, threading.Event] = {}  # cleared while a process restarts
        self._deaths = 0  # restartable deaths so far (calls compare it before and after)
        rt = self.spec.runtime
        self.restart_budget = RestartBudget(rt.max_restarts, rt.restart_window_s)
        self._token: str | None = None
        self._info: RunInfo | None = None
        self._on_failure: Callable[..., None] = lambda message, resumable=False: None
        self.clocks = ProcessClocks()  # each process's clock offset, applied to its spans (clocks.py)
        self.placement: dict[str, ProcessPlacement] = {}  # process name -> cores, threads, GPUs (start())

    @property
    def restarts(self) -> dict[str, int]:
        """Process name -> times restarted over the run (end_state.json's `process_restarts`)."""
        return self.restart_budget.totals

    def _started(self) -> _Started:
        """What start() set up; calling a process before it is an error that says so."""
        if self.launcher is None or self._io is None or self._info is None:
            raise RuntimeError("ProcessExecutor: start() has not run (or failed): no processes to call")
        return _Started(self.launcher, self._io, self._info)

    # ------------------------------------------------------------------ start / stop
    def start(self, on_failure: Callable[..., None]) -> None:
        spec, rt = self.spec, self.spec.runtime
        actor_path = spec.models[self.plan.actor].path
        self.placement = plan_placement(spec, self.plan, model_parameters(actor_path) < SMALL_MODEL_PARAMS)
        gen_threads = self.placement["inference-0"].threads
        train_threads = max(
            (
                p.threads * self.plan.ranks(n)
                for n, p in self.placement.items()
                if p.side == "training" and n in self.plan.processes()
            ),
            default=thread_split(rt.max_staleness)[1],
        )
        self._on_failure = on_failure
        self.launcher = make_launcher(
            LaunchRequest(
                self.run_dir.path / "logs",
                self._on_death,
                process_demands(self.plan, self.backend, gen_threads, train_threads),
                rt,
                colocate=self.weight_sync.colocate,
            )
        )  # shared-memory weights: every process on one machine
        # One secret per run: every worker and inference server requires it, loopback included
        # (vLLM's dev endpoints excepted: vLLM guards only /v1 and /inference, backends/vllm.py).
        token = self._token = secrets.token_urlsafe(32)
        env = {RUN_TOKEN_ENV: token, **({} if rt.trace else {TRACE_ENV: "0"})}  # runtime.trace: off everywhere
        backend = self.backend
        for i in range(spec.inference.servers):
            url = self._start_server(f"inference-{i}", actor_path, rt.seed + i, self.weight_sync, env, token)
            self.server_urls.append(url)
        lagged_urls: dict[str, list[str]] = {}
        seed = rt.seed + spec.inference.servers  # every server its own seed
        for group in self.lagged:
            path = spec.models[group.model].path  # the actor's (graph/workflow_rules.py check_lagged)
            for name in group.names:
                lagged_urls.setdefault(group.model, []).append(
                    self._start_server(name, path, seed, group.transport, env, token)
                )
                seed += 1
        for process, role in sorted(self.plan.processes().items()):
            self._roles[process] = role
            place = self.placement[process]
            worker_env = self._start_other_ranks(self.launcher, process, role, env)
            address = self.launcher.start_worker(
                process, threads=place.threads, env={**worker_env, **placed_env(place)}, token_env=RUN_TOKEN_ENV
            )
            self.clients[process] = WorkerClient(address, timeout=3600, name=process, token=token)
        pin_this_process(self.placement["controller"])
        self.launcher.wait_healthy(timeout=backend.startup_timeout_s)
        self.servers = ServerPool(
            [
                InferenceClient(u, backend=backend, api_key=token, lora_adapters=self.weight_sync.adapters)
                for u in self.server_urls
            ]
        )
        for group in self.lagged:
            group.pool = ServerPool(
                [InferenceClient(u, backend=backend, api_key=token) for u in lagged_urls[group.model]]
            )
        self._io = _IOLoop()
        info = RunInfo(
            model_paths={m: s.path for m, s in spec.models.items()},
            server_urls=tuple(self.server_urls),
            served_urls={model: tuple(urls) for model, urls in lagged_urls.items()},
            train_threads=train_threads,
            run_dir=str(self.run_dir.path),
        )
        self.local = LocalHosts(self.plan, info)
        self._info = info
        self._ready = {name: threading.Event() for name in self._roles}
        for event in self._ready.values():
            event.set()
        self._configure(info)
        self._probe_clocks()
        if self.weight_sync.adapters:  # requests name an adapter from the first one: version 0 is the untrained one
            self._io.run(self.sync_weights(0), timeout=600)

    def _start_server(
        self, name: str, model_path: str, seed: int, transport: WeightSync, env: dict[str, str], token: str
    ) -> str:
        """Launch inference server `name` on `model_path` (the `inference` section's backend and
        settings, its placement, the transport's launch flags); returns its URL."""
        assert self.launcher is not None
        backend, place = self.backend, self.placement[name]
        host, port = self.launcher.server_endpoint(name)
        url = f"http://{host}:{port}"
        cmd = inference_server_command(
            backend, ServerLaunch(self.spec.inference, model_path, port, place.threads, seed, name, token, host)
        )
        server_env = {**env, **backend.environment(token), **placed_env(place, backend.thread_cap(place.threads))}
        flags, sync_env = transport.server_launch()  # the adapter's LoRA flags; else none
        cmd += flags
        server_env.update(sync_env)
        self.launcher.start_process(
            name,
            role="inference",
            cmd=cmd,
            env=server_env,
            health_url=f"{url}/health",
            threads=backend.thread_cap(place.threads),
        )
        self._roles[name] = "inference"
        return url

    def _start_other_ranks(self, launcher: Launcher, process: str, role: str, env: dict[str, str]) -> dict[str, str]:
        """Ranks 1..N-1 of a data-parallel process (runtime/hosts/dp_model_host.py), as plain
        processes the watchdog watches like the worker; returns the environment of rank 0,
        the worker itself. One free loopback port is the group's rendezvous (MASTER_PORT)."""
        ranks = self.plan.ranks(process)
        if ranks == 1:
            return env
        group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks)}
        for rank in range(1, ranks):
            name = f"{process}.rank{rank}"
            self._roles[name] = role
            place = self.placement[name]
            launcher.start_process(
                name,
                role=role,
                cmd=[sys.executable, "-m", DP_RANK_MODULE, "--name", name],
                env={**env, **group, "RANK": str(rank), "LOCAL_RANK": str(rank), **placed_env(place)},
                threads=place.threads,
            )
        return {**env, **group, "RANK": "0", "LOCAL_RANK": "0"}

    def _configure(self, info: RunInfo, only: str | None = None) -> None:
        """Build every hosted object once, where the plan puts it (controller objects lazily);
        `only`: just those of that process (it was restarted)."""
        done: set[tuple[str, str]] = set()
        for name, h in self.plan.hosting.items():
            if h.process == CONTROLLER or name in self.plan.fused or (h.process, h.obj) in done:
                continue
            if only is not None and h.process != only:
                continue
            done.add((h.process, h.obj))
            node = self.spec.nodes[name]
            self.clients[h.process].configure(h.obj, h.impl, self.plan.kind(name).host_args(node, self.spec, info))

    # ------------------------------------------------------------------ processes that die
    def _on_death(self, died: ProcessDied) -> None:
        """On the launcher's watchdog thread: restart a stateless process (as often as the restart
        budget allows), else stop the run with a message naming it and saying why."""
        role = self._roles.get(died.name, died.role)
        if role == "model":
            self._on_failure(
                self._death_message(died) + "\n(a model worker holds weights and optimizer state: "
                "the run can go on from its last complete checkpoint)",
                resumable=True,
            )
            return
        verdict = self.restart_budget.spend(died.name)
        if not verdict.allowed:
            self._on_failure(self._death_message(died) + f"\n({verdict.reason})")
            return
        self._ready[died.name].clear()
        self._deaths += 1
        log.warning("%s; restarting it (%s)", self._death_message(died).split("\n")[0], verdict.reason)
        try:
            if self.launcher is None:
                raise RuntimeError("no launcher")
            m = self.launcher.restart(died.name)
            if role == "inference" and died.name in self.server_weights.names:
                self._restore_server(self.server_weights.names.index(died.name))
            elif role == "inference":
                self._restore_lagged(died.name)
            else:
                old = self.clients[died.name]
                self.clients[died.name] = WorkerClient(m.address, timeout=3600, name=died.name, token=self._token)
                old.close()
                self._configure(self._started().info, only=died.name)
        except Exception as err:  # the restart itself failed: nothing left to try
            log.exception("restarting %s failed", died.name)
            self._on_failure(self._death_message(died) + f"\nrestarting it failed: {err}")
            return
        self._probe_clocks(only=died.name)
        self._ready[died.name].set()

    def _restore_server(self, index: int) -> None:
        """A restarted inference server starts on the workflow's model: give it the last committed
        weights (never while a sync loads: server_weights.py), checked, so it serves one whole
        version under that version's number; a sync under way brings it to the new one next."""
        io = self._started().io
        version = io.submit(self.server_weights.restore(index, self.servers.clients[index])).result(timeout=300)
        log.warning(
            "inference-%d is back on weight version %s",
            index,
            "0 (its initial weights: none synced yet)" if version is None else version,
        )

    def _restore_lagged(self, name: str) -> None:
        """A restarted server of a lagged model: its group's last committed weights, checked
        (none committed yet: it starts on the actor's path, version 0, which it stands for)."""
        group = next(g for g in self.lagged if name in g.names)
        index = group.names.index(name)
        io = self._started().io
        version = io.submit(group.weights.restore(index, group.pool.clients[index])).result(timeout=300)
        log.warning("%s is back on weight version %s", name, 0 if version is None else version)

    def _wait_ready(self, names: list[str], timeout: float = 600.0) -> None:
        for name in names:
            if not self._ready[name].wait(timeout):
                raise TimeoutError(f"{name!r} did not come back within {timeout:.0f} s")

    def _death_message(self, died: ProcessDied) -> str:
        nodes = self.plan.nodes_on(died.name)
        return (
            f"process {died.name!r} (role {self._roles.get(died.name, died.role)}, hosting nodes {nodes or 'none'}) died: "
            f"exit code {died.returncode}"
            + (f", signal {died.signal}" if died.signal else "")
            + (f"\n--- last lines of its log ---\n{died.log_tail}" if died.log_tail else "")
        )

    def shutdown(self) -> None:
        if self._io is not None and self.servers is not None:
            for pool in (self.servers, *(g.pool for g in self.lagged if g.pool is not None)):
                try:
                    self._io.run(pool.close(), timeout=5.0)
                except Exception:  # closing HTTP sessions must not mask the real error
                    log.debug("closing inference clients failed", exc_info=True)
            self._io.stop()
        if self.local is not None:
            self.local.close()
        if self.launcher is not None:
            self.launcher.shutdown()
        self.weight_sync.cleanup()
        for group in self.lagged:
            group.transport.cleanup()

    # ------------------------------------------------------------------ node calls
    async def run(
        self, node: str, batch: PackedBatch, *, step: int, version: int, extra: dict[str, Any] | None = None
    ) -> NodeResult:
        h = self.plan.hosting[node]
        if h.process == CONTROLLER:
            assert self.local is not None
            return await asyncio.to_thread(self.local.call, node, batch, extra)
        call = self.plan.kind(node).call(self.spec.nodes[node], self.spec)
        needs = [h.process, *self._servers_names()]  # a rollout's work also lives on the servers
        while True:
            if not all(self._ready[n].is_set() for n in needs):  # a process is restarting: wait off the loop
                await asyncio.to_thread(self._wait_ready, needs)
            deaths = self._deaths
            try:
                out, stats = await asyncio.to_thread(
                    self.clients[h.process].execute_with_stats,
                    h.obj,
                    call.method,
                    batch,
                    _step=step,
                    _version=version,
                    **{**call.args, **(extra or {})},
                )
                return NodeResult(out, stats)
            except Exception:
                if not await self._died_meanwhile(deaths, needs):
                    raise
                log.warning("node %r: a process it needs died during the call; redoing it once it is back", node)

    def _servers_names(self) -> list[str]:
        return [n for n, role in self._roles.items() if role == "inference"]

    async def _died_meanwhile(
        self, deaths: int, names: Sequence[str] = (), notice_s: float = 2.0, restart_s: float = 600.0
    ) -> bool:
        """Whether a process died since `deaths` was read. A call to a dead process usually
        fails before the watchdog (polling) notices, so give it `notice_s` to. The watchdog
        also restarts processes one at a time, on its own thread: a process among `names` that
        is dead but not noticed yet (the watchdog is still bringing back one that died just
        before) is waited for until it is, up to `restart_s`; retrying at once would only hit
        it again (a fault-injection run lost two prompt groups that way)."""
        deadline = time.monotonic() + notice_s
        while self._deaths == deaths and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._deaths == deaths and self._any_dead(names):
            deadline = time.monotonic() + restart_s
            while self._deaths == deaths and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        return self._deaths != deaths

    def _any_dead(self, names: Sequence[str]) -> bool:
        if self.launcher is None or not names:
            return False
        alive = self.launcher.alive()
        return any(not alive.get(name, False) for name in names)

    async def collect_spans(self) -> list[dict]:
        """Spans the workers and inference servers recorded since the last call (for the run's trace).

        A process that is restarting is skipped (asked again next time); the spans a process
        had not handed over when it died are gone with it, which must not stop the run.
        """
        spans: list[dict] = []
        for name, client in list(self.clients.items()):
            got = await self._spans_of([name], functools.partial(asyncio.to_thread, client.stats, drain_spans=True))
            spans.extend((got or {}).get("spans", []))
        if self.servers is not None:
            spans.extend(
                await self._spans_of(self.server_weights.names, lambda: self._servers(self.servers.spans())) or []
            )
        for group in self.lagged:
            if group.pool is not None:
                call = functools.partial(self._servers_spans, group.pool)
                spans.extend(await self._spans_of(group.names, call) or [])
        return self.clocks.align(spans) + self.cpu_span()  # in the controller's clock

    def cpu_span(self) -> list[dict]:
        """CPU seconds each process used so far (and the controller's own), as one zero-length
        span the cost model reads (perfmodel/costs.py): what the processes the trace shows no
        compute spans for (the controller, the rollout and reward workers) cost the machine."""
        report = getattr(self.launcher, "cpu_report", None)
        if not callable(report):
            return []
        import psutil

        procs = report()
        own = psutil.Process()
        times = own.cpu_times()
        procs["controller"] = {
            "cpu_s": round(times.user + times.system, 3),
            "pid": own.pid,
            "cores": sorted(own.cpu_affinity()),
        }
        now = time.time()
        return [
            {
                "name": "cpu_time",
                "cat": "profile",
                "process": "controller",
                "start": now,
                "end": now,
                "args": {"processes": procs, "machine": _machine_cpu(procs)},
            }
        ]

    def placement_args(self) -> dict[str, dict]:
        """Each process's placement (resources), with the cores the OS reports it may use, for the trace."""
        report = getattr(self.launcher, "cpu_report", None)
        seen = report() if callable(report) else {}
        return {
            name: {**p.as_dict(), **({"affinity": seen[name]["cores"]} if name in seen else {})}
            for name, p in self.placement.items()
        }

    def _probe_clocks(self, only: str | None = None) -> None:
        """Each process's clock offset against ours, measured as we connect to it (clocks.py)."""
        if not self.spec.runtime.trace:
            return
        for name, client in self.clients.items():
            if only in (None, name):
                self.clocks.probe(name, functools.partial(_worker_clock, client))
        if self.backend.server_spans and self.servers is not None:
            groups = [(self.server_weights.names, self.servers)]
            groups += [(g.names, g.pool) for g in self.lagged if g.pool is not None]
            for names, pool in groups:
                for name, client in zip(names, pool.clients):
                    if only in (None, name):
                        io = self._started().io
                        self.clocks.probe(name, functools.partial(_server_clock, io, client))

    async def _spans_of(self, names: list[str], call: Callable[[], Any]) -> Any:
        if not all(self._ready[n].is_set() for n in names):
            return None
        deaths = self._deaths
        try:
            return await call()
        except Exception:
            if not await self._died_meanwhile(deaths):  # no waiting for restarts: spans are best effort
                raise
            log.warning("spans of %s not yet collected were lost with a process that died", ", ".join(names))
            return None

    async def _servers_spans(self, pool: Any) -> list[dict]:
        return await self._servers(pool.spans())

    async def _servers(self, coro: Any) -> Any:
        """Run a call on the inference servers on the executor's own I/O loop: its HTTP sessions
        then live as long as the executor, whichever event loop the caller runs."""
        return await asyncio.wrap_future(self._started().io.submit(coro))

    # ------------------------------------------------------------------ weights and checkpoints
    def _models_client(self, model: str) -> WorkerClient:
        return self.clients[f"model-{model}"]

    def _call_actor(self, method: str, /, **args: Any) -> Any:
        """One blocking call of the actor's host (the trainer's side of a weight sync)."""
        return self._models_client(self.plan.actor).call(self.plan.actor, method, **args)

    def _trained_models(self) -> list[str]:
        return sorted(
            {
                h.obj
                for n, h in self.plan.hosting.items()
                if h.role == "model" and self.spec.models[h.obj].train is not None
            }
        )

    async def sync_weights(self, version: int) -> dict[str, float]:
        """The actor's weights to every inference server, labelled `version`, each server checked
        (see module docstring); a server that died meanwhile is waited for and the sync redone.
        Then each lagged model's servers whose refresh is due load it the same way
        (lagged_servers.py); the step's metrics say which version each of them holds."""
        published = await self._sync(version, self.weight_sync, self.server_weights, self.servers)
        stats = {"weight_sync/bytes": published.nbytes}
        for group in self.lagged:
            if group.due(version):
                await self._sync(version, group.transport, group.weights, group.pool)
                group.loaded(version)
            stats.update(group.metrics())
        return stats

    async def _sync(self, version: int, transport: WeightSync, weights: ServerWeights, pool: Any) -> Published:
        """Publish `version` on `transport` and have every server of `pool` load it, checked."""
        names = weights.names
        while True:
            if not all(self._ready[n].is_set() for n in names):
                await asyncio.to_thread(self._wait_ready, names)
            deaths = self._deaths
            try:
                published = await asyncio.to_thread(transport.publish, version)
                await self._servers(weights.sync(pool, published))
                return published
            except WeightsMismatch:  # a server holds other weights than it says: never redone, never passed over
                raise
            except Exception:
                if not await self._died_meanwhile(deaths, names):
                    raise
                log.warning(
                    "an inference server (%s) died during the weight sync to version %d; redoing it",
                    ", ".join(names),
                    version,
                )

    async def export_model(self, path: Path) -> None:
        await asyncio.to_thread(
            self._models_client(self.plan.actor).call,
            self.plan.actor,
            ModelService.export_weights.__name__,
            path=str(path),
            with_tokenizer=True,
        )

    async def save_checkpoint(self, path: Path) -> None:
        for model in self._trained_models():
            await asyncio.to_thread(
                self._models_client(model).call, model, ModelService.save_checkpoint.__name__, path=str(path / model)
            )

    async def load_checkpoint(self, path: Path) -> None:
        for model in self._trained_models():
            await asyncio.to_thread(
                self._models_client(model).call, model, ModelService.load_checkpoint.__name__, path=str(path / model)
            )


class _IOLoop:
    """An event loop in a daemon thread, for the executor's HTTP calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="executor-io", daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5.0)


def _machine_cpu(procs: dict[str, dict]) -> dict[str, Any]:
    """Busy CPU seconds of the cores the run's processes may use, since boot, whoever used them.

    Why: the cost model cannot tell a machine slowed by something outside the run (a build, a
    type check, another job) from slow work; the cores' busy time less what the run's processes
    used is that something (perfmodel/costs.py `_outside_load`). Busy is user, nice, system, irq
    and softirq time (steal is the hypervisor's, not this machine's work)."""
    import psutil

    cores = sorted({c for p in procs.values() for c in (p.get("cores") or ())})
    per_cpu = psutil.cpu_times(percpu=True)
    cores = [c for c in cores if 0 <= c < len(per_cpu)] or list(range(len(per_cpu)))
    busy = sum(
        t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        for t in (per_cpu[c] for c in cores)
    )
    return {"cpu_s": round(busy, 3), "cores": cores}
