"""Placement: which cores, threads and GPUs each process of a run gets.

The workflow's `resources` section (graph/spec.py `ResourcesSpec`) names cores and GPUs per
side: the inference servers, the model workers (training), and everything else (the
controller, rollout, reward and function workers). This module turns it into one
`ProcessPlacement` per process, which the executor hands to the launcher as environment:
`AREAL_CPU_CORES` (the launcher pins the process with `os.sched_setaffinity` as soon as it
exists; its children inherit the mask), the torch/OpenMP/BLAS thread counts to match, and
`CUDA_VISIBLE_DEVICES`.

Why every process gets an explicit core list once any side is pinned: children inherit the
mask of the process that forks them, so a process left "unpinned" would silently inherit
whatever the owner had. Unpinned sides get every core this process may use.

With no `resources` section nothing is pinned and threads follow `thread_split` (the default
that ran before placement existed: synchronous runs give each side every core, asynchronous
ones split them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_graph.api.process import CORES_ENV
from areal_graph.runtime.launchers.base import ProcessDemand
from areal_graph.runtime.launchers.local import rank_threads

if TYPE_CHECKING:
    from areal_graph.engines.inference.backends import InferenceBackend, ServerLaunch
    from areal_graph.graph.plan import ExecutionPlan

SIDES = ("inference", "training", "other")
GPUS_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class ProcessPlacement:
    """What one process computes on. `cores`/`gpus` None: not pinned (every core; the devices its
    configuration names)."""

    side: str
    threads: int
    cores: tuple[int, ...] | None = None
    gpus: tuple[int, ...] | None = None

    def env(self) -> dict[str, str]:
        """Environment for the launcher: thread caps, the cores to pin, the visible GPUs."""
        t = str(int(self.threads))
        out = {"OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "AREAL_TORCH_THREADS": t}
        if self.cores is not None:
            out[CORES_ENV] = ",".join(map(str, self.cores))
        if self.gpus is not None:
            out[GPUS_ENV] = ",".join(map(str, self.gpus))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "threads": self.threads,
            "cores": list(self.cores) if self.cores is not None else None,
            "gpus": list(self.gpus) if self.gpus is not None else None,
        }


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), in order."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def thread_split(max_staleness: int, cores: int | None = None) -> tuple[int, int]:
    """Torch threads for generation and for training when nothing is pinned.

    Synchronous RL alternates generation and training, so each may use every core; the
    asynchronous run overlaps them, so the cores are split to avoid oversubscription."""
    cores = cores or os.cpu_count() or 2
    if max_staleness == 0:
        return cores, cores
    half = max(cores // 2, 1)
    return half, max(cores - half, 1)


def _share(items: tuple[int, ...] | None, parts: int, index: int) -> tuple[int, ...] | None:
    """The `index`-th of `parts` equal contiguous slices of `items` (None stays None)."""
    if items is None:
        return None
    k = max(len(items) // parts, 1)
    return items[index * k : (index + 1) * k] or items[-k:]


def server_processes(spec: Any) -> list[str]:
    """Every inference server's process name: the policy's `inference-<i>`, then each lagged
    model's `lagged-<model>-<i>` (runtime/orchestration/lagged_servers.py)."""
    from areal_graph.runtime.orchestration.lagged_servers import lagged_server_names

    return [f"inference-{i}" for i in range(spec.inference.servers)] + [
        name for names in lagged_server_names(spec).values() for name in names
    ]


def plan_placement(spec: Any, plan: Any, small_model: bool) -> dict[str, ProcessPlacement]:
    """Every process of the run -> its placement. Names: `inference-<i>`, the lagged models'
    servers, the plan's worker processes and their data-parallel ranks (`<process>.rank<r>`),
    and `controller` (this one). The inference side's cores are split over every server; a
    lagged model's server i shares the GPUs of the policy's server i mod `inference.servers`.

    small_model: the actor is small enough that one decode thread beats two on a CPU (see
    SMALL_MODEL_PARAMS); an embedded server then takes one thread unless
    `inference.threads` says otherwise."""
    res = spec.resources
    everything = usable_cores() if any(getattr(res, s).cores is not None for s in SIDES) else None
    cores = {s: getattr(res, s).cores if getattr(res, s).cores is not None else everything for s in SIDES}
    gen_default, train_default = thread_split(spec.runtime.max_staleness)
    out: dict[str, ProcessPlacement] = {}
    servers, names = spec.inference.servers, server_processes(spec)
    for k, name in enumerate(names):
        share = _share(cores["inference"], len(names), k)
        pinned = res.inference.cores is not None
        width = len(share) if pinned and share else gen_default
        threads = spec.inference.threads or (1 if small_model else width)
        gpus = _share(res.inference.gpus, servers, k % servers)
        out[name] = ProcessPlacement("inference", threads, share, gpus)
    for process, role in sorted(plan.processes().items()):
        ranks = plan.ranks(process)
        names = [process] + [f"{process}.rank{r}" for r in range(1, ranks)]
        for r, name in enumerate(names):
            if role == "model":
                share = _share(cores["training"], ranks, r)
                threads = len(share) if res.training.cores is not None and share else max(train_default // ranks, 1)
                out[name] = ProcessPlacement("training", threads, share, res.training.gpus)
            else:
                out[name] = ProcessPlacement("other", 1, cores["other"], res.other.gpus)
    mine = cores["other"]
    out["controller"] = ProcessPlacement(
        "other",
        len(mine) if mine is not None and res.other.cores is not None else (os.cpu_count() or 1),
        mine,
        res.other.gpus,
    )
    return out


def placed_env(place: ProcessPlacement, threads: int | None = None) -> dict[str, str]:
    """A process's placement as launcher environment; `threads` overrides its thread count (a
    backend that caps a server's threads)."""
    env = place.env()
    if threads is not None and threads != place.threads:
        env.update(dataclasses.replace(place, threads=threads).env())
    return env


def pin_this_process(place: ProcessPlacement) -> None:
    """The controller's own placement (the `other` side), once every process it starts was pinned
    explicitly (children inherit the mask of the process that forks them)."""
    if place.cores is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, place.cores)


def process_demands(
    plan: ExecutionPlan, backend: InferenceBackend, gen_threads: int, train_threads: int
) -> tuple[ProcessDemand, ...]:
    """What each process of the run needs, for launchers that reserve it up front (Ray).

    CPUs are the threads a process computes with (`backend`'s servers: an SGLang server's work
    is on its GPUs, 1), scaled down together when the thread plan oversubscribes this machine on
    purpose (a synchronous run gives generation and training every core: they take turns), so a
    run fits a machine like this one. GPUs: an inference server's, and one per rank of a model
    on CUDA. A model's data-parallel ranks form one group (one machine: they meet at a
    loopback rendezvous)."""
    spec = plan.spec
    server_cpus, server_gpus = backend.cpus(gen_threads), backend.gpus(spec.inference)
    out = [ProcessDemand(name, "inference", server_cpus, server_gpus) for name in server_processes(spec)]
    for process, role in sorted(plan.processes().items()):
        models = {m for n in plan.nodes_on(process) if (m := spec.nodes[n].model) is not None}
        gpus = int(any(spec.models[m].device.startswith("cuda") for m in models))
        ranks = plan.ranks(process)
        threads = rank_threads(train_threads if role == "model" else 1, ranks)
        group = process if ranks > 1 else None
        out.append(ProcessDemand(process, role, threads, gpus, group))
        out += [ProcessDemand(f"{process}.rank{r}", role, threads, gpus, group) for r in range(1, ranks)]
    cores, asked = os.cpu_count() or 1, sum(d.cpus for d in out)
    if asked <= cores:
        return tuple(out)
    scale = cores / asked  # Ray counts CPUs to 1e-4; round down so the total stays within the cores
    return tuple(dataclasses.replace(d, cpus=max(math.floor(d.cpus * scale * 1e4) / 1e4, 0.01)) for d in out)


def inference_server_command(backend: InferenceBackend, launch: ServerLaunch) -> list[str]:
    """The command line of one inference server (`backend` builds it from `launch`), or an error
    saying why the backend cannot start here.

    `inference.args` become extra `--flag value` options (underscores as dashes; `true`
    gives a bare flag), e.g. `{mem_fraction_static: 0.8}` for SGLang.
    """
    problem = backend.unavailable(launch.inference.python)
    if problem:
        raise RuntimeError(problem)
    return backend.command(launch)


# Below this size the embedded engine decodes faster on one thread than on two: per-op
# overhead and thread synchronisation outweigh the matmul speed-up (benchmarks/bench_generation.py
# --rl-step: 0.085 s vs 0.175 s a step on 1 vs 2 threads, measured on the earlier 1.68M-parameter
# tiny-arith; today's is 0.83M).
SMALL_MODEL_PARAMS = 50_000_000


def model_parameters(model_dir: str) -> int:
    """Approximate parameter count of a HF decoder from its config.json (0 when unreadable)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        h, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        inter, vocab = int(cfg.get("intermediate_size", 4 * h)), int(cfg.get("vocab_size", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return vocab * h + layers * (4 * h * h + 3 * h * inter)
