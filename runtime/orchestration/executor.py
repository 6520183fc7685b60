"""How the controller reaches nodes: the `NodeExecutor` interface, and in-process hosting.

The controller decides *what* runs *when* (the DAG, the staleness gate, retries); an
executor decides *where* and *how*: `ProcessExecutor` (process_executor.py) starts worker
processes and inference servers and calls nodes over gRPC; `InProcessExecutor` hosts every
node's object in the controller's own process, which is how the controller's logic is
tested in one process with real host objects of small test kinds.

`LocalHosts` builds and calls host objects in this process from the kinds' entries (the
controller-placed nodes of a real run, such as the advantage node, go through it too).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from areal_graph.api.imports import import_object
from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kind import RunInfo
from areal_graph.graph.plan import ExecutionPlan
from areal_graph.runtime.orchestration.phase_runner import NodeResult
from areal_graph.runtime.rpc.worker_server import split_result


class NodeExecutor(Protocol):
    """What the controller needs from the machinery that runs nodes (see module docstring)."""

    def start(self, on_failure: Callable[[str], None]) -> None:
        """Bring up what the plan needs; `on_failure(message)` reports a dead process at any time later."""

    async def run(
        self, node: str, batch: PackedBatch, *, step: int, version: int, extra: dict[str, Any] | None = None
    ) -> NodeResult:
        """Call `node` on `batch` (its declared reads); `extra` adds call arguments (e.g. eval sampling)."""

    async def sync_weights(self, version: int) -> dict[str, float]:
        """Make the actor's current weights the inference servers' policy, labelled `version`."""

    async def save_checkpoint(self, path: Path) -> None: ...

    async def load_checkpoint(self, path: Path) -> None: ...

    async def export_model(self, path: Path) -> None:
        """The actor as an HF model directory (with its tokenizer) for people to use."""

    async def collect_spans(self) -> list[dict]:
        """Trace spans recorded elsewhere since the last call."""

    def shutdown(self) -> None: ...


class LocalHosts:
    """Host objects of the plan built in this process, one per (process, object) as in a worker."""

    def __init__(self, plan: ExecutionPlan, info: RunInfo) -> None:
        self.plan = plan
        self.info = info
        self._objects: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def get(self, node: str) -> Any:
        h = self.plan.hosting[node]
        with self._lock:
            obj = self._objects.get((h.process, h.obj))
            if obj is None:
                spec = self.plan.spec
                cls = import_object(h.impl, what="implementation")
                obj = cls(**self.plan.kind(node).host_args(spec.nodes[node], spec, self.info))
                self._objects[(h.process, h.obj)] = obj
        return obj

    def call(self, node: str, batch: PackedBatch, extra: dict[str, Any] | None = None) -> NodeResult:
        spec = self.plan.spec
        c = self.plan.kind(node).call(spec.nodes[node], spec)
        fn = getattr(self.get(node), c.method)
        out, stats = split_result(fn(batch, **{**c.args, **(extra or {})}), batch, f"{node}.{c.method}")
        return NodeResult(out, stats)

    def objects(self) -> list[Any]:
        with self._lock:
            return list(self._objects.values())

    def close(self) -> None:
        for obj in self.objects():
            close = getattr(obj, "close", None)
            if callable(close):
                close()


class InProcessExecutor:
    """Every node's host object lives in this process; calls run in threads, as gRPC calls would.

    Weight sync has no servers to reach: host objects that define `set_policy_version(v)`
    (an in-process rollout that stamps token versions) are told the new version.
    Checkpoints and exports call the actor's host `save_checkpoint` / `export_weights`
    when it has them. For tests and single-process debugging.
    """

    def __init__(self, plan: ExecutionPlan, info: RunInfo | None = None) -> None:
        self.plan = plan
        self.hosts = LocalHosts(plan, info or RunInfo(model_paths={m: s.path for m, s in plan.spec.models.items()}))
        self.calls: list[tuple[str, int, int]] = []  # (node, step, version), for tests
        self.version = 0  # the policy version of the last sync (a resumed run starts past 0)
        self._told: set[int] = set()  # host objects told the current version

    def start(self, on_failure: Callable[[str], None]) -> None:
        self.on_failure = on_failure

    async def run(
        self, node: str, batch: PackedBatch, *, step: int, version: int, extra: dict[str, Any] | None = None
    ) -> NodeResult:
        self.calls.append((node, step, version))
        self._tell(self.hosts.get(node))  # built lazily: after a resume's sync, it starts on that version
        return await asyncio.to_thread(self.hosts.call, node, batch, extra)

    def _tell(self, obj: Any) -> None:
        if id(obj) not in self._told and callable(getattr(obj, "set_policy_version", None)):
            obj.set_policy_version(self.version)
            self._told.add(id(obj))

    async def sync_weights(self, version: int) -> dict[str, float]:
        self.version = version
        self._told.clear()
        for obj in self.hosts.objects():
            self._tell(obj)
        return {}

    def _actor_host(self) -> Any | None:
        node = next((n for n, h in self.plan.hosting.items() if h.obj == self.plan.actor), None)
        return None if node is None else self.hosts.get(node)

    async def save_checkpoint(self, path: Path) -> None:
        host = self._actor_host()
        if host is not None and callable(getattr(host, "save_checkpoint", None)):
            await asyncio.to_thread(host.save_checkpoint, str(path / self.plan.actor))

    async def load_checkpoint(self, path: Path) -> None:
        host = self._actor_host()
        if host is not None and callable(getattr(host, "load_checkpoint", None)):
            await asyncio.to_thread(host.load_checkpoint, str(path / self.plan.actor))

    async def export_model(self, path: Path) -> None:
        host = self._actor_host()
        if host is not None and callable(getattr(host, "export_weights", None)):
            await asyncio.to_thread(host.export_weights, str(path), True)

    async def collect_spans(self) -> list[dict]:
        return []

    def shutdown(self) -> None:
        self.hosts.close()
