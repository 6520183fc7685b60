"""Run model-written Python in a separate, limited process.

Agentic workflows execute code the policy wrote. That code can loop forever, allocate
without bound, print megabytes, or crash; none of that may reach the rollout worker. Each
call gets a fresh interpreter (`python -I`: no user site, no env vars, no cwd on sys.path)
in an empty temporary directory, with CPU-time, address-space, file-size and process-count
limits, a wall-clock timeout that kills the whole process group, and truncated output.

Not a security boundary against a determined attacker (no namespaces or seccomp here: a
cluster deployment should wrap this in its container sandbox of choice); it is the guard
rail that keeps RL runs alive.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output_bytes: int = 4096
    max_file_mb: int = 8
    max_processes: int = 32


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when killed for the wall-clock timeout
    timed_out: bool
    truncated: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def as_observation(self) -> str:
        """What an agent sees back: output, or the error, in a few lines."""
        if self.timed_out:
            return "Error: timed out"
        if self.returncode != 0:
            last = (self.stderr.strip().splitlines() or [f"exit code {self.returncode}"])[-1]
            return f"Error: {last}"
        return self.stdout.strip()


def _limit(limits: SandboxLimits):
    def apply() -> None:  # runs in the child between fork and exec
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        fsize = limits.max_file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


async def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Execute `code` in a limited subprocess; never raises for anything the code does."""
    with tempfile.TemporaryDirectory(prefix="areal-sandbox-") as workdir:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", code,
            cwd=workdir, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "PYTHONHASHSEED": "0"},
            preexec_fn=_limit(limits), start_new_session=True,
        )
        timed_out = False
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=limits.wall_s)
        except asyncio.TimeoutError:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = await proc.communicate()
        n = limits.max_output_bytes
        truncated = len(out) > n or len(err) > n
        return SandboxResult(
            stdout=out[:n].decode("utf-8", "replace"),
            stderr=err[:n].decode("utf-8", "replace"),
            returncode=None if timed_out else proc.returncode,
            timed_out=timed_out,
            truncated=truncated,
        )
