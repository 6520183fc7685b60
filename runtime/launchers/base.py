"""What every launcher shares: the `Launcher` protocol the executor talks to, what it is asked
to start (`LaunchRequest`, one `ProcessDemand` per process), the death it reports
(`ProcessDied`) and the Ray resources that pin roles to nodes.

Why a module of its own: the launchers (local.py, ray.py) and the registry that picks one
(`__init__.py`) all need these types; here they import neither launcher, so no module of this
package imports one that imports it back.
"""

from __future__ import annotations

import logging
import queue
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class ProcessDied:
    """A launched process exited while the run still needed it."""

    name: str
    role: str
    returncode: int | None
    signal: str | None  # e.g. "SIGKILL" when it was killed by a signal
    log_tail: str


def signal_name(code: int) -> str | None:
    """SIGKILL for an exit code of -9 (a process killed by a signal), else None."""
    return signal.Signals(-code).name if code < 0 and -code in signal.Signals._value2member_map_ else None


def report_death(
    died: ProcessDied,
    deaths: queue.Queue[ProcessDied],
    on_death: Callable[[ProcessDied], None] | None,
    log: logging.Logger,
) -> None:
    """A launcher's watchdog reports a death (once): logged on the launcher's `log`, queued on
    `deaths`, then `on_death` called, whose failure is logged (the watchdog must keep watching the others)."""
    log.error(
        "%s %r died: exit code %s%s",
        died.role,
        died.name,
        died.returncode,
        f" ({died.signal})" if died.signal else "",
    )
    deaths.put(died)
    if on_death is not None:
        try:
            on_death(died)
        except Exception:
            log.exception("on_death callback failed for %s", died.name)


# Ray custom resources that pin roles to nodes. A cluster whose nodes advertise them (the
# SLURM script brings its nodes up so: runtime/launchers/slurm.py) gets inference servers on
# the inference nodes and model workers on the training nodes; on a cluster without them the
# processes go wherever the placement group fits. Each process asks for one unit.
INFERENCE_NODE_RESOURCE = "areal_inference"
TRAIN_NODE_RESOURCE = "areal_train"
NODE_RESOURCE_UNITS = 1000  # units a labelled node advertises: at most that many processes of its role

ROLE_NODE_RESOURCE: dict[str, str] = {"inference": INFERENCE_NODE_RESOURCE, "model": TRAIN_NODE_RESOURCE}


@dataclass(frozen=True)
class ProcessDemand:
    """What one process of a run needs from the machine it lands on.

    Why up front: a launcher that places processes on a cluster (Ray) reserves every
    process's CPUs and GPUs at once, so a run starts whole or not at all (gang scheduling).
    `cpus` are the torch threads the process computes with; `gpus` the devices it owns.
    """

    name: str
    role: str  # "inference", "model", "rollout", "stateless"
    cpus: float
    gpus: int = 0
    group: str | None = None  # processes of one group share a machine (a model's data-parallel ranks)

    @property
    def node_resource(self) -> str | None:
        """The custom resource that pins this role to its kind of node (None: anywhere)."""
        return ROLE_NODE_RESOURCE.get(self.role)


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launcher factory is given: where logs go, whom to tell about deaths,
    the processes the run will start, and the runtime section (launcher fields)."""

    log_dir: Path
    on_death: Callable[[ProcessDied], None] | None
    demands: tuple[ProcessDemand, ...]
    runtime: Any  # graph.spec.RuntimeSpec
    colocate: bool = False  # every process must share one machine (weights through shared memory)


class Launcher(Protocol):
    """What the executor needs from a launcher (LocalLauncher is the reference).

    Deaths go to the `on_death` callback (on a long-lived watchdog thread, which may call
    `restart`) and to the `deaths` queue, each reported once, as `ProcessDied`.
    """

    deaths: queue.Queue[ProcessDied]

    def server_endpoint(self, name: str) -> tuple[str, int]:
        """(host, port) the server process `name` should bind and clients should use."""

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
        """Start a server process; returns its pid."""

    def start_worker(
        self,
        name: str,
        env: dict[str, str] | None = None,
        threads: int | None = None,
        host: str = "127.0.0.1",
        token_env: str | None = None,
        role: str = "worker",
        startup_timeout: float = 60.0,
        max_concurrent_calls: int | None = None,
    ) -> str:
        """Start a gRPC worker; returns the "host:port" the controller connects to."""

    def wait_healthy(self, timeout: float = 120.0, names: Sequence[str] | None = None) -> None:
        """Block until every (named) process answers its health check."""

    def restart(self, name: str, timeout: float = 180.0) -> Any:
        """Start a dead process again as it was first started; the result has `.address`."""

    def alive(self) -> dict[str, bool]:
        """Process name -> whether it is running."""

    def address(self, name: str) -> str:
        """The "host:port" of worker `name`."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every process (and what it started); no death is reported for them."""
