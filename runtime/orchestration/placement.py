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

import os
from dataclasses import dataclass
from typing import Any

from areal_graph.api.process import CORES_ENV

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


def plan_placement(spec: Any, plan: Any, small_model: bool) -> dict[str, ProcessPlacement]:
    """Every process of the run -> its placement. Names: `inference-<i>`, the plan's worker
    processes and their data-parallel ranks (`<process>.rank<r>`), and `controller` (this one).

    small_model: the actor is small enough that one decode thread beats two on a CPU (see
    process_executor.SMALL_MODEL_PARAMS); an embedded server then takes one thread unless
    `inference.threads` says otherwise."""
    res = spec.resources
    everything = usable_cores() if any(getattr(res, s).cores is not None for s in SIDES) else None
    cores = {s: getattr(res, s).cores if getattr(res, s).cores is not None else everything for s in SIDES}
    gen_default, train_default = thread_split(spec.runtime.max_staleness)
    out: dict[str, ProcessPlacement] = {}
    servers = spec.inference.servers
    for i in range(servers):
        share = _share(cores["inference"], servers, i)
        pinned = res.inference.cores is not None
        width = len(share) if pinned and share else gen_default
        threads = spec.inference.threads or (1 if small_model else width)
        out[f"inference-{i}"] = ProcessPlacement("inference", threads, share, _share(res.inference.gpus, servers, i))
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
