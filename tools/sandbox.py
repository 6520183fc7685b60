"""Run model-written Python so that nothing it does reaches the engine or the machine.

Agentic rollouts and code rewards execute code the policy wrote. That code may loop, allocate
without bound, print gigabytes, fork-bomb, open sockets, write anywhere, read secrets or
signal its parent; RL finds such behaviour if it pays. Each call runs the code in a fresh
interpreter (`python -I`) behind `tools/sandbox_launcher.py`, which, when the kernel allows:

- puts it in new network (loopback down: nothing to connect to or be reached on), pid,
  mount, IPC and UTS namespaces; the pid namespace dies, all of it, when the program ends;
- gives it a private root: the system and Python directories read-only, a fresh /proc of
  its own pid namespace, a size-limited tmpfs `/sandbox/work` as its only writable place
  (cwd, HOME, TMPDIR); /root, /home, the repository and /dev/shm are absent, and /tmp is a
  read-only directory, empty but for the interpreter's own dirs when it lives there (a venv in
  /tmp/clone/.venv is bound read-only; nothing else of the host's /tmp is visible);
- runs it as an unprivileged uid unique to this sandbox (so RLIMIT_NPROC holds even when
  the engine is root, and it can neither signal the engine nor read /proc/<pid>/environ of
  anything but itself), with no_new_privs, an empty environment and rlimits on address
  space, CPU time, file size, open files and processes.

The engine side (here) bounds wall time and reads stdout/stderr incrementally, never holding
more than `max_output_bytes` of each: past the cap the sandbox is killed. When namespaces are
refused (not root and no user namespaces, or a container that forbids them) the run degrades
to rlimits, logs a warning once, and says so in `SandboxResult.containment`;
`SandboxLimits.require_isolation` refuses to run the code at all in that case. Security never
degrades for any other reason: when the namespaces exist but the private root cannot be built
(a bug, or a layout it cannot contain), the code is not run and `SandboxResult.error` says why
(logged as an error once per cause), so a reward scores it as a sandbox error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
Isolation = Literal["auto", "namespaces", "user_namespace", "rlimits"]
# Read-only inside the private root, besides the interpreter's own prefixes.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime")
PROGRAM_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/sandbox/work",
    "TMPDIR": "/sandbox/work",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_READ_CHUNK = 1 << 16
_STATUS_CAP = 1 << 16
_DIR_PREFIX = "areal-sandbox-"  # then the engine's pid: stale directories are recognised by it
_warned: set[tuple] = set()
_logged_errors: set[str] = set()
_MAX_LOGGED_ERRORS = 256  # distinct causes remembered; past it every error is logged again
_cleaned_stale = False


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. Memory is per process, so the worst case for the whole sandbox is
    max_processes x memory_mb (plus work_dir_mb of tmpfs)."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output_bytes: int = 4096  # per stream; past it the run is killed
    max_file_mb: int = 8
    max_processes: int = 8  # tasks (threads count) of the sandbox's own uid
    work_dir_mb: int = 16  # size of the writable tmpfs /sandbox/work
    isolation: Isolation = "auto"
    require_isolation: bool = False  # refuse to run unless every containment feature is active

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_output_bytes", "max_file_mb", "max_processes", "work_dir_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.isolation not in ("auto", "namespaces", "user_namespace", "rlimits"):
            raise ValueError(
                f"SandboxLimits.isolation must be auto, namespaces, user_namespace or rlimits, got {self.isolation!r}"
            )


@dataclass(frozen=True)
class Containment:
    """Which protections were active for one run (all True on a root engine that may unshare)."""

    mode: str  # "namespaces" (as root), "user_namespace", or "rlimits" (degraded)
    network: bool  # own network namespace, loopback down
    pid: bool  # own pid namespace: sees only itself, all of it dies together
    filesystem: bool  # private read-only root with a tmpfs /sandbox/work
    user: bool  # unprivileged uid of its own
    process_limit: bool  # RLIMIT_NPROC enforced
    warnings: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        return self.network and self.pid and self.filesystem and self.user and self.process_limit


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when the sandbox killed it (wall time or output cap); -N: signal N
    timed_out: bool
    truncated: bool
    limit: str | None = None  # the limit that stopped it: wall_time, output, cpu_time, memory, processes
    cpu_s: float | None = None  # the program's CPU time (main process and reaped children)
    max_rss_mb: float | None = None
    containment: Containment | None = None
    error: str | None = None  # the sandbox could not run the code (setup failed or isolation refused)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.error is None

    def as_observation(self) -> str:
        """What an agent sees back: output, or the error, in a few lines."""
        if self.error:
            return f"Error: {self.error}"
        if self.timed_out:
            return "Error: timed out"
        if self.limit == "output":
            return self.stdout.strip() + "\n[output truncated]"
        if self.returncode != 0:
            last = (self.stderr.strip().splitlines() or [f"exit code {self.returncode}"])[-1]
            return f"Error: {last}"
        return self.stdout.strip()


# ------------------------------------------------------------------------------- the spec
def _interpreter_paths(python: str) -> list[str]:
    """Directories the interpreter needs: its prefixes (a venv and the base install)."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(python))),
    }
    return [p for p in paths if p and p != "/"]


def bind_paths(python: str) -> list[str]:
    """Every path mounted read-only in the private root, none nested in another."""
    chosen: list[str] = []
    for path in sorted({os.path.normpath(p) for p in (*SYSTEM_PATHS, *_interpreter_paths(python))}, key=len):
        if not any(path == c or path.startswith(c.rstrip("/") + "/") for c in chosen):
            chosen.append(path)
    return chosen


def _write_spec(directory: str, code: str, limits: SandboxLimits) -> None:
    python = sys.executable
    spec = {
        "code": code,
        "python": python,
        "binds": bind_paths(python),
        "env": PROGRAM_ENV,
        "mode": limits.isolation,
        "require_full": limits.require_isolation,
        "parent_pid": os.getpid(),
        "limits": {
            k: getattr(limits, k) for k in ("cpu_s", "memory_mb", "max_file_mb", "max_processes", "work_dir_mb")
        },
    }
    path = os.path.join(directory, "spec.json")
    with open(
        os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8", errors="surrogatepass"
    ) as f:
        json.dump(spec, f)


# ------------------------------------------------------------------------------- reading
async def _read_capped(stream: asyncio.StreamReader, cap: int, overflow: asyncio.Event) -> tuple[bytes, bool]:
    """Up to `cap` bytes of `stream`; on more, set `overflow` and stop (never holds more than cap)."""
    buf = bytearray()
    while True:
        chunk = await stream.read(min(_READ_CHUNK, cap + 1 - len(buf)))
        if not chunk:
            return bytes(buf), False
        buf += chunk
        if len(buf) > cap:
            overflow.set()
            return bytes(buf[:cap]), True


async def _open_status(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """The read end of the launcher's status pipe as a stream (the transport owns the fd)."""
    reader = asyncio.StreamReader(limit=_STATUS_CAP)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


async def _read_status(reader: asyncio.StreamReader, directory: str) -> dict:
    """The launcher's JSON lines (containment, wait status, errors), merged; {} if none.

    Once the program runs in its private root the host directory is no longer used: it is
    removed at once, so a caller killed mid-run (a reward worker past its timeout) leaves
    nothing behind."""
    merged: dict = {}
    total = 0
    while total < _STATUS_CAP:
        try:
            line = await reader.readline()
        except ValueError:  # a line over the limit: not the launcher's
            break
        if not line:
            break
        total += len(line)
        try:
            item = json.loads(line)
            merged.update(item)
        except (json.JSONDecodeError, TypeError, ValueError):
            continue
        if isinstance(item.get("containment"), dict) and item["containment"].get("filesystem"):
            shutil.rmtree(directory, ignore_errors=True)
    return merged


def _remove_stale_directories() -> None:
    """Directories of sandboxes whose engine process died before cleaning up (killed workers)."""
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        parts = name.split("-")
        if name.startswith(_DIR_PREFIX) and len(parts) >= 4 and parts[2].isdigit() and not _alive(int(parts[2])):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


async def _feed_stdin(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program exited or closed stdin without reading it all
    finally:
        proc.stdin.close()


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the launcher's process group; the init (same group, and a parent-death signal)
    dies with it, and with the init the whole pid namespace."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: proc.kill()):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


# ------------------------------------------------------------------------------- running
async def run_python(
    code: str, limits: SandboxLimits = SandboxLimits(), stdin: str | bytes | None = None
) -> SandboxResult:
    """Execute `code` (with `stdin` as its standard input) contained; never raises for anything
    the code does."""
    global _cleaned_stale
    if not _cleaned_stale:
        _cleaned_stale = True
        _remove_stale_directories()
    directory = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
    try:
        _write_spec(directory, code, limits)
        read_fd, write_fd = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                str(LAUNCHER),
                directory,
                str(write_fd),
                cwd=directory,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                pass_fds=(write_fd,),
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        data = stdin.encode("utf-8", "surrogatepass") if isinstance(stdin, str) else stdin
        return await _supervise(proc, read_fd, limits, data, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _supervise(
    proc: asyncio.subprocess.Process, status_fd: int, limits: SandboxLimits, stdin: bytes | None, directory: str
) -> SandboxResult:
    overflow = asyncio.Event()
    assert proc.stdout is not None and proc.stderr is not None
    status_reader, status_transport = await _open_status(status_fd)
    status_task = asyncio.ensure_future(_read_status(status_reader, directory))
    readers = [
        asyncio.ensure_future(_read_capped(s, limits.max_output_bytes, overflow)) for s in (proc.stdout, proc.stderr)
    ]
    feeder = asyncio.ensure_future(_feed_stdin(proc, stdin)) if stdin is not None else None
    finished = asyncio.ensure_future(asyncio.gather(*readers, status_task, proc.wait()))
    stopper = asyncio.ensure_future(overflow.wait())
    try:
        either: list[asyncio.Future[Any]] = [finished, stopper]
        await asyncio.wait(either, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        killed = not finished.done()  # wall time, output cap, or the caller was cancelled: no orphans
        if killed:
            _kill(proc)
            await _after_kill(proc, readers, status_task)
        for task in (stopper, feeder, *readers, status_task, finished):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(finished, stopper, *(t for t in (feeder,) if t), return_exceptions=True)
        status_transport.close()
    outputs = [r.result() if r.done() and not r.cancelled() else (b"", False) for r in readers]
    status = status_task.result() if status_task.done() and not status_task.cancelled() else {}
    timed_out = killed and not overflow.is_set()
    return _result(outputs, status, proc.returncode, limits, timed_out=timed_out, killed=killed)


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read and drop what is left: the writers are dead, so at most a pipe buffer remains."""
    while await stream.read(_READ_CHUNK):
        pass


async def _after_kill(
    proc: asyncio.subprocess.Process, readers: Sequence[asyncio.Future], status_task: asyncio.Future
) -> None:
    """Collect what the killed run left. asyncio's `Process.wait()` returns only once every pipe
    has seen EOF, and a reader that stopped at the cap no longer reads: drain both pipes (in
    chunks that are dropped) so the transport sees EOF. Bounded in time: a process that escaped
    the kill (possible only without a pid namespace) may hold a pipe open forever."""
    await asyncio.wait({status_task, *readers}, timeout=2.0)
    for reader in readers:
        reader.cancel()  # a no-op for those done; one still waiting would race the drain
    await asyncio.gather(*readers, return_exceptions=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        await asyncio.wait_for(asyncio.gather(_drain(proc.stdout), _drain(proc.stderr)), timeout=2.0)
        await asyncio.wait_for(proc.wait(), timeout=2.0)
    except TimeoutError:
        log.warning("sandbox (pid %d) killed, but its pipes are still open after 4 s; closing them", proc.pid)
        transport = getattr(proc, "_transport", None)  # asyncio offers no public close for a Process
        if transport is not None:
            transport.close()


def _result(
    outputs: list[tuple[bytes, bool]],
    status: dict,
    launcher_rc: int | None,
    limits: SandboxLimits,
    timed_out: bool,
    killed: bool,
) -> SandboxResult:
    (out, out_cut), (err, err_cut) = outputs
    containment = None
    if "containment" in status:
        containment = Containment(**status["containment"], warnings=tuple(status.get("warnings", ())))
    if killed:
        returncode = None
    elif "wait_status" in status:
        returncode = os.waitstatus_to_exitcode(status["wait_status"])
    else:
        returncode = launcher_rc
    stderr = err.decode("utf-8", "replace")
    error = status.get("error")
    if error is None and containment is None and not killed:
        error = f"sandbox launcher failed (exit {launcher_rc}): {stderr.strip()[-500:]}"
    if error is not None:
        _log_error_once(error, containment)  # the code did not run: an error, not a degradation
    elif containment is not None:
        _warn_once(containment)
    cpu_s = status.get("cpu_s")
    return SandboxResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=stderr,
        returncode=returncode,
        timed_out=timed_out,
        truncated=out_cut or err_cut,
        limit=_limit_hit(returncode, stderr, cpu_s, limits, timed_out, out_cut or err_cut),
        cpu_s=cpu_s,
        max_rss_mb=status["max_rss_kb"] / 1024 if "max_rss_kb" in status else None,
        containment=containment,
        error=error,
    )


def _limit_hit(
    returncode: int | None, stderr: str, cpu_s: float | None, limits: SandboxLimits, timed_out: bool, truncated: bool
) -> str | None:
    """Best effort: which limit stopped the program (None: it ended on its own terms)."""
    if timed_out:
        return "wall_time"
    if truncated:
        return "output"
    if returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and cpu_s is not None and cpu_s >= limits.cpu_s):
        return "cpu_time"  # the soft limit sends SIGXCPU, the hard one (a second later) SIGKILL
    tail = stderr[-2000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return "memory"
    if "Resource temporarily unavailable" in tail and ("fork" in tail or "BlockingIOError" in tail):
        return "processes"
    if "File too large" in tail or returncode == -signal.SIGXFSZ:
        return "file_size"
    return None


def _log_error_once(error: str, containment: Containment | None) -> None:
    """Every call the sandbox refused or failed to run is an error the operator must see (each
    reward behind it scores 0); once per cause, since a run may make thousands of such calls."""
    if error in _logged_errors:
        return
    if len(_logged_errors) < _MAX_LOGGED_ERRORS:
        _logged_errors.add(error)
    log.error("sandbox did not run the code (mode %s): %s", containment.mode if containment else "unknown", error)


def _warn_once(containment: Containment) -> None:
    if containment.full:
        return
    key = tuple(sorted(asdict(containment).items()))
    if key not in _warned:
        _warned.add(key)
        missing = [
            name for name in ("network", "pid", "filesystem", "user", "process_limit") if not getattr(containment, name)
        ]
        log.warning(
            "sandbox runs degraded (mode %s; not contained: %s): %s",
            containment.mode,
            ", ".join(missing),
            "; ".join(containment.warnings) or "no detail",
        )


__all__ = ["Containment", "SandboxLimits", "SandboxResult", "bind_paths", "run_python"]
