"""Start, watch and stop the processes of a run on this machine.

`LocalLauncher` starts gRPC workers (runtime/rpc/worker_server.py) and arbitrary servers (e.g.
inference servers, given a command line), each with its own environment and thread limits
and a log file (stdout and stderr together). A watchdog thread polls them every 0.2 s; a
process that exits while the run is still going is reported once, as `ProcessDied`, to the
`on_death` callback and to the `deaths` queue, so the controller can stop with a message
that names what died and shows the end of its log.

`shutdown()` (also on `with`-exit, on error, on Ctrl-C) terminates every process *and its
descendants* (psutil) and their process groups, then kills what did not exit; it is bounded
(about `timeout` + 1 s). Workers also poll their parent (`--parent-pid`) and, on Linux, every
child gets PR_SET_PDEATHSIG, so even a SIGKILLed controller leaves no orphans.

Ctrl-C does not depend on KeyboardInterrupt reaching `shutdown()` (C code can swallow it, and
the unwinding can wait on calls to these very processes): a launcher registers with
runtime/launchers/interrupt.py, whose SIGINT handler stops its processes from a thread of its
own, and an interrupted launcher starts nothing more and raises KeyboardInterrupt again from
its next wait in the main thread.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

import areal_graph.runtime.launchers.interrupt as interrupt
from areal_graph.api.process import CORES_ENV, PDEATHSIG_ENV, arm_parent_death_signal, pin_to_cores
from areal_graph.runtime.launchers.base import ProcessDied, report_death, signal_name

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 30


@dataclass
class _Managed:
    name: str
    role: str
    popen: subprocess.Popen
    log_path: Path
    log_file: IO[bytes]
    address: str | None = None  # "host:port" for workers
    health_url: str | None = None
    token: str | None = None
    reported: bool = field(default=False)
    restart: Callable[[], object] | None = None  # starts it again as it was first started
    restarts: int = 0


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a text file ('' when missing); reads only the end of big files.

    When the end of the file holds an exception line above those lines, the first one is added:
    chained tracebacks print the root cause first, and servers such as vLLM end their log with a
    long traceback of a wrapper ("Engine core initialization failed. See root cause above.")."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - 64 * 1024, 0))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    all_lines = data.splitlines()
    out = "\n".join(all_lines[-lines:])
    for line in all_lines[:-lines]:
        match = ERROR_LINE.search(line)
        if match:
            return f"{out}\n(first error in the log: {match.group(0)[:500]})"
    return out


ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): \S.*")


def _cpu_seconds(proc: object) -> float:
    t = proc.cpu_times()  # type: ignore[attr-defined]
    return float(t.user + t.system)


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group. Every process here leads its own session
    (start_new_session), so its group is it and what it started; when it dies, its children
    are orphaned out of `children()`'s reach but stay in its group."""
    interrupt.signal_group(pgid, signal.SIGKILL)


def wait_until_healthy(
    pending: set[str],
    timeout: float,
    *,
    exit_code: Callable[[str], int | None],
    healthy: Callable[[str], bool],
    role: Callable[[str], str],
    log_path: Callable[[str], Path],
    log_tail: Callable[[str], str],
    check: Callable[[], None] | None = None,
) -> None:
    """Poll until every process in `pending` is healthy; a process that exits first, or the
    deadline, raises naming it with its log. Every launcher's `wait_healthy` (they differ only
    in how they ask a process for its exit code, health and log). `check` runs every round and
    may raise (an interrupted launcher: KeyboardInterrupt)."""
    deadline = time.monotonic() + timeout
    while pending:
        if check is not None:
            check()
        for name in sorted(pending):
            code = exit_code(name)
            if code is not None:
                raise RuntimeError(
                    f"{role(name)} {name!r} exited with code {code} while starting; "
                    f"log {log_path(name)}:\n{log_tail(name)}"
                )
            if healthy(name):
                pending.discard(name)
        if not pending:
            break
        if time.monotonic() > deadline:
            details = "\n".join(f"--- {n} ({log_path(n)}):\n{log_tail(n)}" for n in sorted(pending))
            raise TimeoutError(f"not healthy after {timeout:.0f} s: {sorted(pending)}\n{details}")
        time.sleep(0.1)


def endpoint_healthy(name: str, address: str | None, token: str | None, health_url: str | None) -> bool | None:
    """Whether a process answers its health check: a gRPC worker at `address`, else a server's
    `health_url` (HTTP GET -> 200); None when it has neither (then being alive is all there is).
    Shared by every launcher: health is asked of the endpoint, wherever the process runs."""
    if address is not None:
        from areal_graph.runtime.rpc.worker_client import WorkerClient, WorkerError

        client = WorkerClient(address, token=token, name=name)
        try:
            return bool(client.health(timeout=2.0)["ok"])
        except WorkerError:
            return False
        finally:
            client.close()
    if health_url is not None:
        try:
            with urllib.request.urlopen(health_url, timeout=2.0) as r:
                return r.status == 200
        except OSError:
            return False
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_threads(threads: int, ranks: int) -> int:
    """Each data-parallel rank's share of a process's threads (the ranks share one machine's cores)."""
    return max(int(threads) // ranks, 1)


def thread_env(threads: int) -> dict[str, str]:
    """Environment that caps the BLAS/OpenMP pools and (read by the worker) torch's threads."""
    t = str(int(threads))
    return {"OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "AREAL_TORCH_THREADS": t}


class LocalLauncher:
    def __init__(
        self,
        log_dir: Path | str,
        on_death: Callable[[ProcessDied], None] | None = None,
        python: str = sys.executable,
        pythonpath: Sequence[str | Path] = (),
        poll_interval: float = 0.2,
        die_with_parent: bool = True,
    ) -> None:
        """`pythonpath` entries are prepended to PYTHONPATH of every child (e.g. test node modules).

        `die_with_parent` sets PR_SET_PDEATHSIG; note Linux fires it when the *thread* that
        started the child exits, so start processes from a long-lived thread (the main one).
        """
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.on_death = on_death
        self.deaths: queue.Queue[ProcessDied] = queue.Queue()
        self.python = python
        self.pythonpath = [str(p) for p in pythonpath]
        self.poll_interval = poll_interval
        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        self.procs: dict[str, _Managed] = {}
        self._stopping = threading.Event()
        # set by the SIGINT handler, which may run while the main thread holds any lock (even
        # `_stopping`'s): a plain attribute, read by the watchdog and every wait
        self._interrupted = False
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        interrupt.register(self)

    # ------------------------------------------------------------------ Ctrl-C (interrupt.py)
    def interrupt(self) -> None:
        """Ctrl-C: start nothing more, report no death (the processes are being stopped)."""
        self._interrupted = True

    def process_roots(self) -> list[int]:
        """Pids of the processes started and not reaped yet (so not reused by another process);
        each leads its own process group. The watchdog SIGKILLs a reaped one's group when it
        reports the death."""
        return [m.popen.pid for m in list(self.procs.values()) if m.popen.returncode is None]

    def _check_interrupted(self) -> None:
        """Raise if Ctrl-C was pressed: KeyboardInterrupt in the main thread (again: the first
        one may have been swallowed, e.g. by a C extension importing), an error elsewhere."""
        if self._interrupted:
            if threading.current_thread() is threading.main_thread():
                raise KeyboardInterrupt("interrupted (Ctrl-C)")
            raise RuntimeError("the launcher was interrupted (Ctrl-C)")

    # ------------------------------------------------------------------ start
    def _env(self, env: dict[str, str] | None, threads: int | None) -> dict[str, str]:
        full = dict(os.environ)
        full["PYTHONUNBUFFERED"] = "1"
        if self.pythonpath:
            full["PYTHONPATH"] = os.pathsep.join(self.pythonpath + [p for p in [full.get("PYTHONPATH")] if p])
        if threads is not None:
            full.update(thread_env(threads))
        full.update(env or {})
        return full

    def _spawn(
        self,
        name: str,
        role: str,
        cmd: Sequence[str],
        env: dict[str, str] | None,
        threads: int | None,
        cwd: str | Path | None,
    ) -> _Managed:
        if name in self.procs:
            raise ValueError(f"a process named {name!r} was already started")
        self._check_interrupted()
        if self._stopping.is_set():
            raise RuntimeError("the launcher is shut down")
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab", buffering=0)
        full_env = self._env(env, threads)
        ours = len(cmd) > 2 and cmd[1] == "-m" and str(cmd[2]).startswith("areal_graph.")
        if self.die_with_parent and ours:
            full_env[PDEATHSIG_ENV] = "1"  # armed by the child itself (see die_with_parent)
        popen: subprocess.Popen | None = None
        try:
            popen = subprocess.Popen(
                list(cmd),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=arm_parent_death_signal if self.die_with_parent and not ours else None,
            )
            m = _Managed(name, role, popen, log_path, log_file)
            if full_env.get(CORES_ENV):  # pinned from birth: threads it starts inherit the mask
                pin_to_cores(popen.pid, tuple(int(c) for c in full_env[CORES_ENV].split(",")))
            with self._lock:
                self.procs[name] = m
        except BaseException:
            # e.g. Ctrl-C between the start and the bookkeeping: nothing may run unrecorded
            if popen is not None:
                kill_group(popen.pid)
                popen.kill()
                try:
                    popen.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    log.error("%s (pid %d) did not exit after SIGKILL", name, popen.pid)
                with self._lock:
                    self.procs.pop(name, None)
            log_file.close()
            raise
        log.info("started %s (%s) pid %d, log %s", name, role, popen.pid, log_path)
        self._ensure_watchdog()
        return m

    def server_endpoint(self, name: str) -> tuple[str, int]:
        """Where server `name` listens: loopback, on a port free now (every process is on this machine)."""
        return "127.0.0.1", free_port()

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
        """Start any server process; `health_url` (HTTP GET -> 200) is what `wait_healthy` polls."""
        m = self._spawn(name, role, cmd, env, threads, cwd)
        m.health_url = health_url
        m.restart = lambda: self.start_process(name, role, cmd, env, threads, health_url, cwd)
        return m.popen.pid

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
        """Start a gRPC worker; blocks until it has bound a port and returns "host:port".

        Returns once the port is known, not once it is healthy: call `wait_healthy` after
        starting everything, so the workers' imports overlap.
        """
        port_file = self.log_dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        cmd = [
            self.python,
            "-m",
            "areal_graph.runtime.rpc.worker_server",
            "--name",
            name,
            "--host",
            host,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--parent-pid",
            str(os.getpid()),
        ]
        if token_env:
            cmd += ["--token-env", token_env]
        if max_concurrent_calls:
            cmd += ["--max-workers", str(max_concurrent_calls)]
        m = self._spawn(name, role, cmd, env, threads, None)
        deadline = time.monotonic() + startup_timeout
        while not port_file.exists():
            self._check_interrupted()
            if m.popen.poll() is not None:
                raise RuntimeError(
                    f"worker {name!r} exited with code {m.popen.returncode} before binding a port; "
                    f"log {m.log_path}:\n{tail(m.log_path)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"worker {name!r} bound no port within {startup_timeout:.0f} s; "
                    f"log {m.log_path}:\n{tail(m.log_path)}"
                )
            time.sleep(0.02)
        connect_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        m.address = f"{connect_host}:{int(port_file.read_text())}"
        if token_env:
            m.token = (env or {}).get(token_env) or os.environ.get(token_env)
        m.restart = lambda: self.start_worker(
            name, env, threads, host, token_env, role, startup_timeout, max_concurrent_calls
        )
        return m.address

    # ------------------------------------------------------------------ health
    def _is_healthy(self, m: _Managed) -> bool:
        answered = endpoint_healthy(m.name, m.address, m.token, m.health_url)
        return m.popen.poll() is None if answered is None else answered

    def wait_healthy(self, timeout: float = 120.0, names: Sequence[str] | None = None) -> None:
        """Block until every (named) process answers its health check; raise naming the laggards."""
        wait_until_healthy(
            set(names) if names is not None else set(self.procs),
            timeout,
            exit_code=lambda n: self.procs[n].popen.poll(),
            healthy=lambda n: self._is_healthy(self.procs[n]),
            role=lambda n: self.procs[n].role,
            log_path=lambda n: self.procs[n].log_path,
            log_tail=lambda n: tail(self.procs[n].log_path),
            check=self._check_interrupted,
        )

    # ------------------------------------------------------------------ watchdog
    def _ensure_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="launcher-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_interval):
            with self._lock:
                procs = list(self.procs.values())
            for m in procs:
                rc = m.popen.poll()
                if rc is None or m.reported or self._stopping.is_set() or self._interrupted:
                    continue
                m.reported = True
                kill_group(m.popen.pid)  # what it started and left behind (a vLLM server's engine processes)
                died = ProcessDied(m.name, m.role, rc, signal_name(rc), tail(m.log_path))
                report_death(died, self.deaths, self.on_death, log)

    def restart(self, name: str, timeout: float = 180.0) -> _Managed:
        """Start a process that died again, exactly as it was first started (same command,
        environment and log file, appended; a worker binds a new port: see `address`), and
        wait until it is healthy. Call from a long-lived thread (see `__init__`): the watchdog's
        `on_death` callback runs on one."""
        with self._lock:
            old = self.procs.get(name)
            if old is None or old.restart is None:
                raise KeyError(f"no process {name!r} to restart")
            if old.popen.poll() is None:
                raise RuntimeError(f"{name!r} is still running")
            del self.procs[name]
        old.log_file.close()
        old.restart()
        m = self.procs[name]
        m.restarts = old.restarts + 1
        self.wait_healthy(timeout=timeout, names=[name])
        log.warning("restarted %s %r (restart %d), pid %d", m.role, name, m.restarts, m.popen.pid)
        return m

    def alive(self) -> dict[str, bool]:
        return {n: m.popen.poll() is None for n, m in self.procs.items()}

    def cpu_report(self) -> dict[str, dict[str, object]]:
        """Each running process's CPU seconds so far (its own and its live descendants': a reward
        pool's processes count for the reward worker), its pid and the cores it may run on."""
        out: dict[str, dict[str, object]] = {}
        for name, m in list(self.procs.items()):
            try:
                proc = psutil.Process(m.popen.pid)
                seconds = _cpu_seconds(proc)
                for child in proc.children(recursive=True):
                    try:
                        seconds += _cpu_seconds(child)
                    except psutil.Error:
                        continue
                # per thread, the busy ones (the engine's or the trainer's thread apart from HTTP/gRPC handling)
                threads = {
                    str(t.id): round(t.user_time + t.system_time, 3)
                    for t in proc.threads()
                    if t.user_time + t.system_time > 0.05
                }
                out[name] = {
                    "cpu_s": round(seconds, 3),
                    "threads_s": threads,
                    "pid": proc.pid,
                    "cores": sorted(proc.cpu_affinity()),
                }
            except psutil.Error:  # it exited meanwhile: its seconds are in the last report
                continue
        return out

    def address(self, name: str) -> str:
        addr = self.procs[name].address
        if addr is None:
            raise KeyError(f"{name!r} is not a gRPC worker")
        return addr

    # ------------------------------------------------------------------ stop
    def shutdown(self, timeout: float = 5.0) -> None:
        """Terminate every process, all its descendants and its process group; kill whatever
        outlives `timeout` s (after Ctrl-C at most interrupt.TERM_GRACE_S). Bounded: about
        `timeout` + 1 s, plus 1 s per process the kernel cannot reap."""
        self._stopping.set()
        grace = min(timeout, interrupt.TERM_GRACE_S) if self._interrupted else timeout
        managed = list(self.procs.values())
        groups = [m.popen.pid for m in managed]  # all: orphans of one that died while no death was reported
        left = interrupt.stop_trees(
            interrupt.process_tree(self.process_roots()),
            groups,
            grace,
            level=logging.INFO if self._interrupted else logging.WARNING,
        )
        for p in left:
            log.error("pid %d did not exit after SIGKILL", p.pid)
        for m in managed:
            try:
                m.popen.wait(timeout=1.0)  # reap, so no zombie remains
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) did not exit", m.name, m.popen.pid)
            m.log_file.close()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=2.0)
        interrupt.unregister(self)

    def __enter__(self) -> LocalLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
