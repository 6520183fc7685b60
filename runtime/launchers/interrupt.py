"""Ctrl-C that always stops a run within seconds and leaves no process behind.

Why KeyboardInterrupt alone is not enough: Python raises it in the main thread at its next
bytecode, and the owner of a run's processes is not always somewhere that lets it through.

- C code can swallow it. A SIGINT that lands while `import torch` is importing numpy is cleared
  by torch's extension module and the import simply goes on (measured here: 10 of 25 SIGINTs sent
  0.15-0.25 s into `import torch`). The owner imports torch lazily while its workers start
  (`endpoint_healthy` -> `worker_client`), and on a fresh install, where that first import
  compiles bytecode for ~35 s, most of startup is such a window. Such an owner carried on as if
  nothing had happened, found its workers healthy and ran on (5 of 16 owners SIGINTed at that
  moment never exited).
- The unwinding can wait on the processes it is meant to stop: `asyncio.run` waits for its
  default executor's threads, and those sit in gRPC calls to workers with an hour's deadline
  (so do concurrent.futures' exit hooks at interpreter exit).

So SIGINT acts outside the main thread's control flow too. The handler installed here marks
every registered launcher interrupted (it starts nothing more, reports no death, restarts
nothing) and starts a reaper thread that SIGTERMs every process the launchers started, their
process groups and all their descendants, then SIGKILLs what is left after a short grace; calls
in flight to those processes then fail at once and the unwinding is quick. Then it raises
KeyboardInterrupt (or calls the handler it replaced) as before. A second Ctrl-C SIGKILLs
everything at once.

An application (`areal-graph run`: `exit_on_interrupt`) asks for more: every descendant of the
process is stopped, not only the launchers' (a kit build's helpers, a forkserver), a second
Ctrl-C also exits at once, and whatever the main thread is doing the process exits with 130
`deadline_s` after the first Ctrl-C. Once the main thread has unwound and said so,
`exit_interrupted` ends the process as soon as the reaper is done, without the interpreter's
teardown: its final garbage collection of a heap holding torch took 6 s of a Ctrl-C's 8 on a
loaded 2-core machine (py-spy: `gc_collect_main` after every atexit hook had run).

Only SIGINT is handled; the handler is installed from the main thread only (Python's rule), and
a SIGINT that is ignored (nohup, a background job) stays ignored.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import psutil

log = logging.getLogger(__name__)

EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a program Ctrl-C stopped
TERM_GRACE_S = 2.0  # SIGTERM -> SIGKILL on Ctrl-C: our workers exit at once on SIGTERM, servers drain
KILL_WAIT_S = 1.0  # after SIGKILL: only the kernel is left to wait for
DEADLINE_S = 8.0  # an application exits this long after Ctrl-C, whatever its main thread is doing


class Interruptible(Protocol):
    """What the handler needs from a launcher (LocalLauncher)."""

    def interrupt(self) -> None:
        """Mark it interrupted: start nothing more, report no death. Called from the signal
        handler, so it must be quick and take no lock the main thread may hold."""

    def process_roots(self) -> list[int]:
        """Pids of the processes it started and has not reaped (a reaped pid may belong to
        another process by now); each leads its own process group (start_new_session)."""


# ---------------------------------------------------------------------- process trees
def process_tree(roots: Iterable[int]) -> list[psutil.Process]:
    """`roots` and all their descendants, recorded now.

    Why record before signalling anything: a process that dies first orphans its children to
    init, out of `children()`'s reach (they stay in its process group, which `stop_trees` also
    signals, unless they started their own session)."""
    procs: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                procs.setdefault(p.pid, p)
        except psutil.Error:
            pass
    return list(procs.values())


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a process group; a group that is gone, or not ours, is fine. Never our own
    group (the terminal's, when run from a shell): the processes signalled here lead their own."""
    if pgid <= 1 or pgid == os.getpgrp():
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_all(procs: list[psutil.Process], groups: Iterable[int], sig: int) -> None:
    for pgid in groups:
        signal_group(pgid, sig)
    for p in procs:
        try:
            p.send_signal(sig)  # psutil checks the pid was not reused since it was recorded
        except psutil.Error:
            pass


def stop_trees(
    procs: list[psutil.Process],
    groups: Iterable[int],
    grace: float,
    kill_wait: float = KILL_WAIT_S,
    level: int = logging.WARNING,
) -> list[psutil.Process]:
    """SIGTERM the process groups `groups` and every process in `procs`, SIGKILL them all after
    `grace` s; returns the processes still alive `kill_wait` s after that (none, unless stuck
    in the kernel). Bounded: at most `grace + kill_wait` s. Each kill is logged at `level`
    (after Ctrl-C, INFO: the user asked for it, and the terminal gets one line)."""
    groups = list(groups)
    _signal_all(procs, groups, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace) if procs else ([], [])
    for p in alive:
        try:
            log.log(level, "killing %s (pid %d): still alive %.1f s after SIGTERM", p.name(), p.pid, grace)
        except psutil.Error:
            pass
    _signal_all(alive, groups, signal.SIGKILL)  # groups again: orphans that left the tree
    _, alive = psutil.wait_procs(alive, timeout=kill_wait) if alive else ([], [])
    return alive


def kill_trees(procs: list[psutil.Process], groups: Iterable[int]) -> None:
    """SIGKILL at once, waiting for nothing (a second Ctrl-C)."""
    _signal_all(procs, groups, signal.SIGKILL)


# ---------------------------------------------------------------------- the handler
@dataclass
class _Application:
    deadline_s: float
    grace_s: float
    exit_code: int


class _Hook:
    """Process-wide state of the SIGINT handler (there is one SIGINT disposition per process)."""

    def __init__(self) -> None:
        self.members: weakref.WeakSet[Any] = weakref.WeakSet()
        self.count = 0  # SIGINTs since the handler was installed
        self.installed = False
        self.previous: Any = None
        self.app: _Application | None = None
        self.reaper: threading.Thread | None = None  # the first Ctrl-C's
        self.lock = threading.Lock()  # install / uninstall; never taken by the handler


_hook = _Hook()


def interrupted() -> bool:
    """Whether Ctrl-C was pressed while the handler was installed (an application's whole run)."""
    return _hook.count > 0


def register(member: Interruptible) -> None:
    """Have Ctrl-C stop `member`'s processes; installs the handler (from the main thread)."""
    with _hook.lock:
        _hook.members.add(member)
        _install()


def unregister(member: Interruptible) -> None:
    """`member` has stopped its processes; the handler goes when nothing needs it any more."""
    with _hook.lock:
        _hook.members.discard(member)
        if not _hook.members and _hook.app is None:
            _uninstall()


@contextmanager
def exit_on_interrupt(
    deadline_s: float = DEADLINE_S, grace_s: float = TERM_GRACE_S, exit_code: int = EXIT_CODE
) -> Iterator[None]:
    """For an application's main: while inside, Ctrl-C stops every descendant of this process
    (SIGTERM, SIGKILL after `grace_s`), raises KeyboardInterrupt for the main thread to unwind
    and report, and exits the process with `exit_code` if it is still running `deadline_s`
    after the Ctrl-C; a second Ctrl-C kills every descendant and exits at once."""
    with _hook.lock:
        _hook.app = _Application(deadline_s, grace_s, exit_code)
        _install()
    try:
        yield
    finally:
        with _hook.lock:
            if _hook.count == 0:  # after a Ctrl-C the process is on its way out: a second one still forces it
                _hook.app = None
                if not _hook.members:
                    _uninstall()


def exit_interrupted(code: int = EXIT_CODE) -> NoReturn:
    """End an application whose main thread has unwound from a Ctrl-C and reported it: wait for
    the reaper (bounded by its grace), flush the logs and the standard streams, and exit with
    `code`, skipping the interpreter's teardown (module cleanup and a final garbage collection
    that, with torch loaded, can take seconds on a busy machine). Everything the run writes is
    closed by then: the unwinding ran every `with` and `finally`."""
    reaper = _hook.reaper
    if reaper is not None:
        reaper.join(timeout=TERM_GRACE_S + KILL_WAIT_S + 1.0)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing more can be said
            pass
    os._exit(code)


def _install() -> None:
    if _hook.installed or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is signal.SIG_IGN or current is None:
        return  # ignored on purpose (nohup, a background job), or set outside Python: leave it
    _hook.previous, _hook.count = current, 0  # set first: the handler may run right after it is installed
    signal.signal(signal.SIGINT, _on_sigint)
    _hook.installed = True


def _uninstall() -> None:
    if not _hook.installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, _hook.previous)
    _hook.previous, _hook.installed, _hook.count, _hook.reaper = None, False, 0, None


def _targets(members: list[Any], app: _Application | None) -> tuple[list[psutil.Process], list[int]]:
    """Every process to stop (recorded now) and the process groups to signal."""
    roots: list[int] = []
    for m in members:
        try:
            roots += m.process_roots()
        except Exception:  # one broken member must not keep the others' processes alive
            log.exception("listing the processes of %r failed", m)
    procs = process_tree(roots)
    if app is not None:  # everything this process started, by a launcher or not
        seen = {p.pid for p in procs}
        try:
            procs += [p for p in psutil.Process().children(recursive=True) if p.pid not in seen]
        except psutil.Error:
            pass
    return procs, roots


def _on_sigint(signum: int, frame: Any) -> None:
    """The SIGINT handler (runs in the main thread, between two bytecodes)."""
    _hook.count += 1
    members, app = list(_hook.members), _hook.app
    for m in members:
        m.interrupt()
    if _hook.count == 1:
        t0 = time.monotonic()
        try:
            if app is not None:  # daemon: it must not keep the process, it ends it
                threading.Thread(target=_deadline, args=(app, t0), name="ctrl-c-deadline", daemon=True).start()
            # not a daemon: the interpreter's exit waits for it (at most grace + KILL_WAIT_S), so
            # a main thread that unwinds at once cannot exit with processes not yet stopped
            _hook.reaper = threading.Thread(target=_reap, args=(members, app), name="ctrl-c-reaper")
            _hook.reaper.start()
        except RuntimeError:  # the interpreter is exiting: no new threads; stop them from here
            _reap(members, app)
    else:
        procs, groups = _targets(members, app)
        kill_trees(procs, groups)
        if app is not None:
            _hard_exit(app.exit_code, "second Ctrl-C: killed every process of the run")
    previous = _hook.previous
    if callable(previous) and previous is not signal.default_int_handler:
        previous(signum, frame)  # e.g. asyncio.run's: cancels its main task, raises on the second
        return
    raise KeyboardInterrupt


def _reap(members: list[Any], app: _Application | None) -> None:
    """The reaper thread of the first Ctrl-C: stop the processes (bounded: grace + KILL_WAIT_S)."""
    try:
        procs, groups = _targets(members, app)
        left = stop_trees(procs, groups, app.grace_s if app is not None else TERM_GRACE_S, level=logging.INFO)
        if left:
            log.error("still alive after SIGKILL: %s", ", ".join(str(p.pid) for p in left))
    except Exception:  # noqa: BLE001 - a thread's error would only be printed; say what failed
        log.exception("stopping the processes after Ctrl-C failed")


def _deadline(app: _Application, t0: float) -> None:
    """An application's exit by `app.deadline_s` after Ctrl-C, whatever the main thread does."""
    time.sleep(max(0.0, t0 + app.deadline_s - time.monotonic()))
    _hard_exit(app.exit_code, f"still running {app.deadline_s:.0f} s after Ctrl-C; exiting now")


def _hard_exit(code: int, message: str) -> None:
    """Exit now, from any thread, past whatever the main thread waits on (and past exit hooks
    that join threads). One line on stderr, and the cursor back if a live display hid it."""
    try:
        if os.isatty(1):
            os.write(1, b"\x1b[?25h\n")
        os.write(2, f"interrupted: {message}\n".encode())
    except OSError:
        pass
    os._exit(code)  # Python-level buffers are not flushed: their locks may be held by the main thread
