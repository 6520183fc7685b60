"""Start, watch and stop the processes of a run: one adapter per `runtime.launcher` value.

Why a registry: the executor (runtime/orchestration/process_executor.py) asks for "the
launcher this run names" and talks to it through `Launcher` alone, so a new launcher is one
module plus one entry in `LAUNCHERS` (and its name in `RuntimeSpec.launcher`'s Literal; a
test checks the two agree). Adapters are imported only when chosen: `ray` stays optional.

- `local` (runtime/launchers/local.py): subprocesses of the controller on this machine.
- `ray` (runtime/launchers/ray.py): each process started by a Ray actor, all of them in one
  placement group, on a local Ray instance or a cluster joined by address.
"""

from __future__ import annotations

from collections.abc import Callable

from areal_graph.runtime.launchers.base import (
    INFERENCE_NODE_RESOURCE,
    NODE_RESOURCE_UNITS,
    ROLE_NODE_RESOURCE,
    TRAIN_NODE_RESOURCE,
    Launcher,
    LaunchRequest,
    ProcessDemand,
    ProcessDied,
)

__all__ = [
    "INFERENCE_NODE_RESOURCE",
    "LAUNCHERS",
    "NODE_RESOURCE_UNITS",
    "ROLE_NODE_RESOURCE",
    "TRAIN_NODE_RESOURCE",
    "LaunchRequest",
    "Launcher",
    "ProcessDemand",
    "ProcessDied",
    "make_launcher",
]


def _local(request: LaunchRequest) -> Launcher:
    from areal_graph.runtime.launchers.local import LocalLauncher

    return LocalLauncher(log_dir=request.log_dir, on_death=request.on_death)


def _ray(request: LaunchRequest) -> Launcher:
    from areal_graph.runtime.launchers.ray import RayLauncher

    return RayLauncher.for_run(request)


# runtime.launcher -> factory. Adding a launcher: one module, one entry here, one name in
# graph/spec.py RuntimeSpec.launcher.
LAUNCHERS: dict[str, Callable[[LaunchRequest], Launcher]] = {"local": _local, "ray": _ray}


def make_launcher(request: LaunchRequest) -> Launcher:
    """The launcher `request.runtime.launcher` names."""
    name = request.runtime.launcher
    try:
        factory = LAUNCHERS[name]
    except KeyError:
        raise ValueError(f"runtime.launcher {name!r} is not one of {sorted(LAUNCHERS)}") from None
    return factory(request)
