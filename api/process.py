"""Process helpers every areal-graph entry point shares (workers, the embedded inference server).

Why a child arms its own parent-death signal: the launcher could set PR_SET_PDEATHSIG in a
`preexec_fn`, but Python code run between fork and exec in a process with gRPC threads can
abort the child (gRPC's fork handlers: "epoll_wait error: Bad file descriptor", exit -6).
So the launcher sets an environment variable and our entry points arm the signal at start.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

PDEATHSIG_ENV = "AREAL_DIE_WITH_PARENT"
# The secret of a run: its launcher sets it for every worker and inference server it starts.
# Workers require it on every call, inference servers as their API key, and clients inside
# workers (a rollout's inference client) send it. An environment variable, never an argument:
# `ps` shows arguments to every local user.
RUN_TOKEN_ENV = "AREAL_RUN_TOKEN"
# The cores a process is pinned to ("0,1"), from the workflow's `resources` section: the launcher
# pins the process as soon as it exists and our entry points pin themselves again at start.
CORES_ENV = "AREAL_CPU_CORES"


def cores_from_env() -> tuple[int, ...] | None:
    """The cores `CORES_ENV` names (None when unset or unreadable)."""
    raw = os.environ.get(CORES_ENV, "").strip()
    try:
        return tuple(int(c) for c in raw.split(",")) if raw else None
    except ValueError:
        return None


def pin_to_cores(pid: int = 0, cores: tuple[int, ...] | None = None) -> bool:
    """Pin process `pid` (0: this one) to `cores` (default: `CORES_ENV`); False when there is
    nothing to pin or this OS cannot (no sched_setaffinity)."""
    cores = cores if cores is not None else cores_from_env()
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return False
    os.sched_setaffinity(pid, cores)
    return True


def run_token() -> str | None:
    """This process's run secret (None outside a run)."""
    return os.environ.get(RUN_TOKEN_ENV) or None


def arm_parent_death_signal() -> None:
    """PR_SET_PDEATHSIG: SIGTERM this process when its parent exits (Linux; a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def die_with_parent() -> None:
    """Arm the parent-death signal when the launcher asked for it (see module docstring)."""
    if os.environ.pop(PDEATHSIG_ENV, None) != "1" or not sys.platform.startswith("linux"):
        return
    arm_parent_death_signal()
    if os.getppid() == 1:  # the parent was already gone before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """At most `arenas` glibc malloc arenas in this process; False where that cannot be set.

    Why: glibc gives threads arenas of their own (up to 8 per core) and keeps what is freed in
    each for reuse, so a process whose many threads allocate and free a lot (the run's owner:
    gRPC calls from a thread pool, the trace's flush thread) grows by fragments over a long run:
    ~26 MB per 1,000 steps of the main job with the default, flat with 2 (bench_soak.py). The
    environment variable MALLOC_ARENA_MAX, when the user sets one, wins."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, int(arenas)))
    except (OSError, AttributeError):
        return False


def release_freed_memory() -> None:
    """Hand memory freed in this process back to the OS (glibc's malloc_trim; a no-op elsewhere).

    A trace flush allocates and frees tens of MB of small strings and dicts; glibc keeps freed
    heap memory for reuse, and its fragments add up over a long run (runtime/observability/tracing.py)."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None
