"""Weight sync: how the actor's new weights reach the inference servers, one class per transport.

Why objects: a transport is a few decisions that belong together (what the trainer writes and
where, what a server is told to load, what a server restarted in the middle of the run is
given, what is left to delete, how to read back what was written), and a run uses one
transport from start to end. The executor picks it once from the workflow
(`choose_weight_sync`) and then calls the same methods whatever it is; nothing else asks
which transport a run has.

- `SharedMemorySync` (`runtime.weight_sync: memory`; what `auto` picks for the embedded and
  vLLM backends): the actor's host copies its weights into a file in RAM (/dev/shm,
  engines/shared_weights.py) and returns a manifest; the servers map the same file and load
  views of it (no serialisation, milliseconds for small models; one machine only, so the
  launcher colocates every process). Two files are used in turn: a publish writes the one
  the committed version does not occupy.
- `DiskSync` (`disk`; what `auto` picks for SGLang, the only way it takes weights): the host
  exports safetensors into the run directory's `weights/v<version>`; the servers load them.
  The directory two publishes back is deleted once every server holds the new one.

A lagged model's servers (runtime/orchestration/lagged_servers.py) get a transport of their own
(`choose_weight_sync(..., group=NAME)`: its own shared-memory files, or `weights/NAME/`), so
what a restarted lagged server replays is the version its group committed, never one the
policy's servers moved past (and whose file they overwrote or deleted).
- `AdapterSync` (`lora.sync: adapter` on a backend that serves adapters: vLLM, SGLang): the
  host exports the LoRA adapter alone (megabytes, peft's layout) and every server loads it
  under its version's name; requests name the newest adapter they know, so a server keeps
  `max_staleness + 2` of them loaded and the one older than that is unloaded and deleted.
- `InProcessWeightSync`: trainer and engine in one process (CUDA to CUDA on one GPU, the
  floor benchmarks/bench_gpu.py measures): the engine swaps in the trainer's own tensors,
  nothing is written anywhere. A run's servers are other processes, so no workflow setting
  chooses it.

A version, once published, is whole and stays as published while any server may read it:
`publish` never writes where the committed version lies (the other shared-memory file; a
directory of its own per version), `commit` (after every server has loaded and been
checked) makes it what `restore` replays and only then deletes what no server can need, and
the executor never lets a restore and a sync's load overlap
(runtime/orchestration/server_weights.py). So a server restarted while a sync is under way
loads the last committed version, whole, under that version's number (issue 49: it used to
replay the last manifest from the one shared file, which the new publish was rewriting).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from areal_graph.engines.inference.backends import InferenceBackend
from areal_graph.engines.weights_digest import Samples, sample_safetensors, sample_shared_file, sample_tensors
from areal_graph.graph.kinds.common import adapter_sync
from areal_graph.runtime.hosts.protocols import ModelService
from areal_graph.runtime.observability.run_dir import RunDir

if TYPE_CHECKING:
    from areal_graph.graph.spec import WorkflowSpec

# `call_actor(method, **args)`: one blocking RPC to the actor's host (a `ModelService` method by
# name), as the executor reaches it; the trainer's side of every transport but the in-process one.
ActorCall = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Published:
    """What one publish left for the servers: the version, where it lies (the shared file or
    the version's directory), the manifest of a shared file, the bytes that crossed (the
    `weight_sync/bytes` metric) and, in one process, the tensors themselves."""

    version: int
    where: str
    nbytes: float
    manifest: list[dict] | None = None
    state: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)


class WeightTarget(Protocol):
    """What a transport tells servers to do: one server's client (`InferenceClient`, a restored
    server) or all of them at once (`ServerPool`); both define these three."""

    async def update_weights_from_shared_memory(self, path: str, manifest: list[dict], version: int) -> None: ...

    async def update_weights_from_disk(self, path: str, version: int) -> None: ...

    async def load_adapter(self, path: str, version: int, unload: int | None = None) -> None: ...


class WeightSync(Protocol):
    """One transport of the actor's weights to the inference servers (see module docstring).

    The executor calls `publish` off its event loop (it blocks on the trainer's RPC), then
    `apply` and, once every server is checked, `commit` on its I/O loop; `restore` for a
    restarted server on the same loop, never during an `apply` (server_weights.py); `cleanup`
    once at shutdown."""

    mode: str  # "memory", "disk", "adapter" or "in-process": for logs and messages
    colocate: bool  # every process of the run on one machine (the launcher packs them)
    adapters: bool  # requests name their version's adapter: version 0 is loaded before the first request

    def server_launch(self) -> tuple[list[str], dict[str, str]]:
        """Extra command-line flags and environment each inference server starts with."""
        ...

    def publish(self, version: int) -> Published:
        """Trainer side: the actor's current weights written where the servers can read them,
        never over the committed version (a restore may be reading it)."""
        ...

    async def apply(self, servers: WeightTarget, published: Published) -> None:
        """Server side: every server loads `published`."""
        ...

    def commit(self, published: Published) -> None:
        """Every server holds `published`: from now on it is what `restore` gives, and what
        no server can read any more is deleted."""
        ...

    async def restore(self, server: WeightTarget) -> Published | None:
        """A restarted server starts on the workflow's model: give it the last committed version
        and return it (None before the first commit: the initial weights are the current ones)."""
        ...

    def samples(self, published: Published) -> Samples | None:
        """A few values of each tensor as published, read back from where they were written
        (engines/weights_digest.py); None where the transport cannot read its own output."""
        ...

    def cleanup(self) -> None:
        """At shutdown: remove what the transport made that the run directory should not keep."""
        ...


class SharedMemorySync:
    """`memory`: two files in RAM that the actor's host writes in turn and every server maps.

    A publish writes the file that the committed version does not occupy, so what a restarted
    server replays is never what is being written; a file is written again only after a newer
    version was committed (every server loaded it) and no restore reads it any more."""

    mode = "memory"
    colocate = True
    adapters = False

    def __init__(self, call_actor: ActorCall, path: str) -> None:
        self.call_actor = call_actor
        self.files = (f"{path}-a", f"{path}-b")
        self.last: Published | None = None

    def server_launch(self) -> tuple[list[str], dict[str, str]]:
        return [], {}

    def publish(self, version: int) -> Published:
        where = self.files[1] if self.last is not None and self.last.where == self.files[0] else self.files[0]
        manifest = self.call_actor(ModelService.publish_weights.__name__, path=where)
        # what crossed: each tensor once (tied weights share an entry's bytes); LoRA: the adapters
        nbytes = float(sum({e["offset"]: e["nbytes"] for e in manifest}.values()))
        return Published(version, where, nbytes, manifest=manifest)

    async def apply(self, servers: WeightTarget, published: Published) -> None:
        assert published.manifest is not None  # publish wrote one
        await servers.update_weights_from_shared_memory(published.where, published.manifest, published.version)

    def commit(self, published: Published) -> None:
        self.last = published  # the other file is free for the next publish; both stay mapped

    async def restore(self, server: WeightTarget) -> Published | None:
        last = self.last
        if last is None or last.manifest is None:
            return None
        await server.update_weights_from_shared_memory(last.where, last.manifest, last.version)
        return last

    def samples(self, published: Published) -> Samples | None:
        return None if published.manifest is None else sample_shared_file(published.where, published.manifest)

    def cleanup(self) -> None:
        for path in self.files:
            Path(path).unlink(missing_ok=True)


class _DirectorySync:
    """A version's directory in the run directory, exported by the actor's host (the part
    `DiskSync` and `AdapterSync` share: where it goes, what it weighs, how to read it back).

    Each version has a directory of its own, so a publish never writes where the committed
    version lies; a version exported again after a failed load is replaced whole (the host
    writes a new directory and renames it), and no server reads it until it is loaded again."""

    colocate = False
    adapters = False
    export: str  # the ModelService method that writes the directory

    def __init__(self, call_actor: ActorCall, run_dir: RunDir, group: str | None = None) -> None:
        """`group`: a lagged model's servers, whose versions live in weights/<group>/."""
        self.call_actor = call_actor
        self.run_dir = run_dir
        self.group = group
        self.last: Published | None = None

    def server_launch(self) -> tuple[list[str], dict[str, str]]:
        return [], {}

    def publish(self, version: int) -> Published:
        path = self.run_dir.weights_dir(version, self.group)
        self.call_actor(self.export, path=str(path))
        return Published(version, str(path), float(sum(f.stat().st_size for f in path.glob("*.safetensors"))))

    def _delete(self, version: int) -> None:
        old = self.run_dir.weights_dir(version, self.group)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)

    def samples(self, published: Published) -> Samples | None:
        return sample_safetensors(published.where)

    def cleanup(self) -> None:
        """Nothing: the last versions stay in the run directory (a server may re-read them)."""


class DiskSync(_DirectorySync):
    """`disk`: HF safetensors in `weights/v<version>`; any backend, any number of machines
    sharing the run directory. Two publishes are kept: the served one and the one before.

    `every`: versions between two publishes (a lagged group's refresh_every; 1 for the policy's
    servers). A commit deletes what this transport committed before the one before, and the
    version `2 * every` back, which a run resumed in this directory left there."""

    mode = "disk"
    export = ModelService.export_weights.__name__

    def __init__(self, call_actor: ActorCall, run_dir: RunDir, group: str | None = None, every: int = 1) -> None:
        super().__init__(call_actor, run_dir, group)
        self.every = every
        self.committed: list[int] = []

    async def apply(self, servers: WeightTarget, published: Published) -> None:
        await servers.update_weights_from_disk(published.where, published.version)

    def commit(self, published: Published) -> None:
        self.last = published
        self.committed.append(published.version)
        while len(self.committed) > 2:
            self._delete(self.committed.pop(0))
        if published.version - 2 * self.every not in self.committed:
            self._delete(published.version - 2 * self.every)

    async def restore(self, server: WeightTarget) -> Published | None:
        last = self.last
        if last is None:
            return None
        await server.update_weights_from_disk(last.where, last.version)
        return last


class AdapterSync(_DirectorySync):
    """`lora.sync: adapter` on vLLM or SGLang: the adapter directory under its version's name.

    `kept` adapters stay loaded on each server, one per version a request in flight may still
    name (`max_staleness + 2`); the one `kept` versions back is unloaded and its directory
    deleted (a server may re-read an evicted adapter from its directory: the rest stay)."""

    mode = "adapter"
    adapters = True
    export = ModelService.export_adapter.__name__

    def __init__(
        self,
        call_actor: ActorCall,
        run_dir: RunDir,
        backend: InferenceBackend,
        rank: int,
        target_modules: list[str],
        kept: int,
        colocate: bool = False,
    ) -> None:
        super().__init__(call_actor, run_dir)
        self.backend = backend
        self.rank, self.target_modules, self.kept = rank, target_modules, kept
        self.colocate = colocate

    def server_launch(self) -> tuple[list[str], dict[str, str]]:
        return self.backend.lora_launch_flags(
            self.rank, self.target_modules, self.kept
        ), self.backend.lora_environment()

    async def apply(self, servers: WeightTarget, published: Published) -> None:
        unload = published.version - self.kept
        await servers.load_adapter(published.where, published.version, unload if unload >= 0 else None)

    def commit(self, published: Published) -> None:
        self.last = published
        if published.version - self.kept >= 0:
            self._delete(published.version - self.kept)

    async def restore(self, server: WeightTarget) -> Published | None:
        last = self.last
        if last is None:
            return None
        await server.load_adapter(last.where, last.version)
        return last


class InProcessWeightSync:
    """Trainer and engine in one process: the engine swaps in the trainer's tensors as they
    are (`state_dict_for_sync(copy=False)`: CUDA to CUDA on one GPU, no host memory, no file).

    `trainer`: a training engine (engines/training/protocol.py); the target of `apply` is an
    `EmbeddedEngine` in this process. Nothing restarts apart from this process, so `restore`
    and `commit` have nothing to do, and the tensors are the trainer's, so `cleanup` neither."""

    mode = "in-process"
    colocate = True
    adapters = False

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def server_launch(self) -> tuple[list[str], dict[str, str]]:
        return [], {}

    def publish(self, version: int) -> Published:
        state = self.trainer.state_dict_for_sync(copy=False)
        nbytes = float(sum({(t.data_ptr(), t.dtype): t.numel() * t.element_size() for t in state.values()}.values()))
        return Published(version, "in-process", nbytes, state=state)

    async def apply(self, servers: Any, published: Published) -> None:
        """`servers`: the engine (its swap waits for a step boundary: off the event loop)."""
        await asyncio.to_thread(servers.update_weights_from_state_dict, published.state, published.version)

    def commit(self, published: Published) -> None:
        return None

    async def restore(self, server: Any) -> Published | None:
        return None

    def samples(self, published: Published) -> Samples | None:
        return None if published.state is None else sample_tensors(published.state)

    def cleanup(self) -> None:
        return None


# ---------------------------------------------------------------------------- choosing one
def resolve_weight_sync(setting: str, backend: InferenceBackend) -> str:
    """`auto`: in memory where the backend can take it (embedded, vLLM), else from disk (SGLang)."""
    if setting == "auto":
        return "memory" if backend.shared_memory_weights else "disk"
    return setting


def shared_memory_path(name: str) -> str:
    """A file in RAM (/dev/shm) where the OS has one, else in the temp directory."""
    root = Path("/dev/shm")
    return str((root if root.is_dir() and os.access(root, os.W_OK) else Path(tempfile.gettempdir())) / name)


def choose_weight_sync(
    spec: WorkflowSpec,
    actor: str,
    backend: InferenceBackend,
    run_dir: RunDir,
    call_actor: ActorCall,
    group: str | None = None,
) -> WeightSync:
    """The run's transport, from the workflow: the adapter where the policy (model `actor`)
    syncs as a LoRA adapter and the backend serves adapters, else `runtime.weight_sync`
    (`auto` resolved). `group`: the transport of lagged model `group`'s servers (files of its
    own; they load every `refresh_every` versions)."""
    mode = resolve_weight_sync(spec.runtime.weight_sync, backend)
    lora = spec.models[actor].lora
    if adapter_sync(spec) and backend.lora_adapters and lora is not None:
        if group is not None:  # refused by `validate` (graph/workflow_rules.py check_lagged)
            raise ValueError(f"a lagged copy ({group}) of a policy synced as a LoRA adapter is not built yet")
        # the launcher colocates as the resolved setting says (`auto` on vLLM: as for memory)
        return AdapterSync(
            call_actor,
            run_dir,
            backend,
            lora.r,
            lora.target_modules,
            kept=spec.runtime.max_staleness + 2,
            colocate=mode == "memory",
        )
    folder = None if group is None else re.sub(r"[^\w.-]", "_", group)  # a file name's part
    if mode == "memory":
        tag = "" if folder is None else f"-{folder}"
        return SharedMemorySync(
            call_actor, shared_memory_path(f"areal-{os.getpid()}-{uuid.uuid4().hex[:8]}{tag}-weights")
        )
    lagged = spec.models[group].lagged if group is not None else None
    return DiskSync(call_actor, run_dir, folder, every=lagged.refresh_every if lagged is not None else 1)


if TYPE_CHECKING:  # the type checker holds each transport to the protocol, and both clients to the target
    from areal_graph.engines.inference.client import InferenceClient, ServerPool

    def _transports(a: SharedMemorySync, b: DiskSync, c: AdapterSync, d: InProcessWeightSync) -> list[WeightSync]:
        return [a, b, c, d]

    def _targets(one: InferenceClient, pool: ServerPool) -> list[WeightTarget]:
        return [one, pool]
