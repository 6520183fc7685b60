"""runtime/launchers/interrupt.py, its parts in this process: the process-tree helpers
(`process_tree`, `signal_group`, `stop_trees`, `kill_trees`), the SIGINT handler's contract
with a registered member (it is told, its processes are stopped, KeyboardInterrupt or the
previous handler follows, a second Ctrl-C kills at once), when the handler is installed and
put back, and `exit_interrupted` (in one short child: it ends the process).

tests/runtime/launchers/test_local.py presses Ctrl-C on whole owner processes; here the
pieces are called one by one. The processes stopped are small children started here, each
leading its own session so that signalling its group reaches nothing else. (A killed process's
own children are reaped by it, or by its SIGCHLD being ignored: an orphan's zombie could
otherwise outlive the test on machines whose init does not reap.)"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from areal_graph.runtime.launchers import interrupt
from support.paths import child_env

# A parent that ignores SIGTERM and has one child that does not (auto-reaped: SIGCHLD ignored).
STUBBORN = r"""
import signal, subprocess, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "60"])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(child.pid, flush=True)
time.sleep(60)
"""


def _stubborn() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True, start_new_session=True)
    return proc, int(proc.stdout.readline())


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether `pid` has exited (reaped, or a zombie), waiting up to `within` s for a signal sent
    to it to take effect."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


@pytest.fixture
def cleanup():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:  # whatever a failed test left: each process leads its own group
        if p.poll() is None:
            interrupt.signal_group(p.pid, signal.SIGKILL)
            p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


class Member:
    """A stand-in launcher: records `interrupt()` calls and owns `roots`."""

    def __init__(self, roots=(), broken=False):
        self.roots, self.broken, self.interrupts = list(roots), broken, 0

    def interrupt(self):
        self.interrupts += 1

    def process_roots(self):
        if self.broken:
            raise RuntimeError("listing failed")
        return list(self.roots)


@pytest.fixture
def handler_state(monkeypatch):
    """A fresh handler state for the test (anything another test left registered is set aside by
    swapping the module's `_hook`), SIGINT at Python's default, and both put back afterwards."""
    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(interrupt, "_hook", interrupt._Hook())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    hook = interrupt._hook
    if hook.reaper is not None:
        hook.reaper.join(timeout=10)
    hook.members.clear()
    hook.app = None
    interrupt._uninstall()
    signal.signal(signal.SIGINT, before)


# ---------------------------------------------------------------------- process trees
def test_process_tree_records_roots_and_every_descendant(cleanup):
    sh = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    cleanup.append(sh)
    deadline = time.monotonic() + 10
    while len(psutil.Process(sh.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    kids = psutil.Process(sh.pid).children()
    gone = _sleeper()
    gone.kill()
    gone.wait()
    tree = interrupt.process_tree([sh.pid, sh.pid, gone.pid])  # a root twice, and one that is gone
    assert sorted(p.pid for p in tree) == sorted([sh.pid, *(k.pid for k in kids)])
    for k in kids:  # stop the children first: the shell reaps them and exits
        k.kill()
    sh.wait(timeout=10)
    assert interrupt.process_tree([sh.pid]) == []


def test_signal_group_never_signals_init_or_our_own_group(monkeypatch):
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    for pgid in (0, 1, -5, os.getpgrp()):
        interrupt.signal_group(pgid, signal.SIGTERM)
    interrupt.signal_group(4242, signal.SIGTERM)
    assert sent == [(4242, signal.SIGTERM)]


def test_signal_group_ignores_a_group_that_is_gone(cleanup):
    p = _sleeper()
    p.kill()
    p.wait()
    interrupt.signal_group(p.pid, signal.SIGKILL)  # no ProcessLookupError


def test_stop_trees_terms_then_kills_what_stays_and_logs_it(cleanup, caplog):
    parent, child = _stubborn()
    cleanup.append(parent)
    procs = interrupt.process_tree([parent.pid])
    assert sorted(p.pid for p in procs) == sorted([parent.pid, child])
    with caplog.at_level(logging.INFO, logger=interrupt.__name__):
        left = interrupt.stop_trees(procs, [parent.pid], grace=0.3, kill_wait=5.0, level=logging.INFO)
    assert left == [] and _gone(parent.pid) and _gone(child)
    [record] = [r for r in caplog.records if "still alive" in r.getMessage()]
    # only the parent ignored SIGTERM; its child went at once
    assert (
        record.levelno == logging.INFO and f"(pid {parent.pid}): still alive 0.3 s after SIGTERM" in record.getMessage()
    )


def test_stop_trees_of_processes_that_exit_on_sigterm_logs_nothing(cleanup, caplog):
    a, b = _sleeper(), _sleeper()
    cleanup += [a, b]
    with caplog.at_level(logging.DEBUG, logger=interrupt.__name__):
        left = interrupt.stop_trees(interrupt.process_tree([a.pid, b.pid]), [a.pid, b.pid], grace=5.0)
    assert left == [] and _gone(a.pid) and _gone(b.pid)
    assert not caplog.records
    assert interrupt.stop_trees([], [], grace=5.0) == []


def test_kill_trees_kills_at_once_even_what_ignores_sigterm(cleanup):
    parent, child = _stubborn()
    cleanup.append(parent)
    interrupt.kill_trees(interrupt.process_tree([parent.pid]), [parent.pid])
    parent.wait(timeout=10)
    assert parent.returncode == -signal.SIGKILL
    assert _gone(child)


# ---------------------------------------------------------------------- the handler
def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)  # the handler runs at the next bytecode; sleep is interrupted by it


def test_register_installs_the_handler_and_unregister_puts_the_previous_one_back(handler_state):
    member = Member()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    interrupt.register(member)
    assert signal.getsignal(signal.SIGINT) is interrupt._on_sigint and not interrupt.interrupted()
    other = Member()
    interrupt.register(other)
    interrupt.unregister(member)
    assert signal.getsignal(signal.SIGINT) is interrupt._on_sigint  # still needed by the other one
    interrupt.unregister(other)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored(handler_state):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    member = Member()
    interrupt.register(member)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and not interrupt._hook.installed
    interrupt.unregister(member)


def test_ctrl_c_tells_every_member_stops_their_processes_and_raises(handler_state, cleanup, caplog):
    a, b = _sleeper(), _sleeper()
    cleanup += [a, b]
    first, second, broken = Member([a.pid]), Member([b.pid]), Member(broken=True)
    for m in (first, second, broken):
        interrupt.register(m)
    with pytest.raises(KeyboardInterrupt):
        _sigint()
    assert interrupt.interrupted()
    assert (first.interrupts, second.interrupts, broken.interrupts) == (1, 1, 1)
    interrupt._hook.reaper.join(timeout=10)  # the reaper: SIGTERM, then SIGKILL after the grace
    assert _gone(a.pid) and _gone(b.pid)  # a broken member kept no one alive (psutil reaped them: no returncode)
    assert any("listing the processes of" in r.getMessage() and r.exc_info for r in caplog.records)
    for m in (first, second, broken):
        interrupt.unregister(m)
    assert not interrupt.interrupted() and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_kills_without_waiting(handler_state, cleanup, monkeypatch):
    monkeypatch.setattr(interrupt, "TERM_GRACE_S", 60.0)  # the first Ctrl-C alone would wait a minute
    parent, child = _stubborn()
    cleanup.append(parent)
    member = Member([parent.pid])
    interrupt.register(member)
    with pytest.raises(KeyboardInterrupt):
        _sigint()
    with pytest.raises(KeyboardInterrupt):
        _sigint()
    assert member.interrupts == 2 and interrupt._hook.count == 2
    interrupt._hook.reaper.join(timeout=30)  # it ends as soon as its processes are gone, not after its grace
    assert not interrupt._hook.reaper.is_alive()
    assert _gone(parent.pid, within=10) and _gone(child, within=10)  # well inside the first Ctrl-C's minute
    interrupt.unregister(member)


def test_a_previous_python_handler_is_called_instead_of_raising(handler_state, cleanup):
    calls = []
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    p = _sleeper()
    cleanup.append(p)
    member = Member([p.pid])
    interrupt.register(member)
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [signal.SIGINT] and member.interrupts == 1  # no KeyboardInterrupt got here
    interrupt._hook.reaper.join(timeout=10)
    assert _gone(p.pid)
    interrupt.unregister(member)
    assert signal.getsignal(signal.SIGINT) not in (interrupt._on_sigint, signal.default_int_handler)


def test_exit_on_interrupt_installs_for_its_block_only_when_no_ctrl_c_came(handler_state):
    member = Member()
    with interrupt.exit_on_interrupt(deadline_s=30):
        assert signal.getsignal(signal.SIGINT) is interrupt._on_sigint and interrupt._hook.app.deadline_s == 30
        interrupt.register(member)
    assert interrupt._hook.app is None
    assert signal.getsignal(signal.SIGINT) is interrupt._on_sigint  # the member still needs it
    interrupt.unregister(member)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_exit_interrupted_flushes_and_exits_without_the_interpreters_teardown():
    code = (
        "import atexit, sys\n"
        "from areal_graph.runtime.launchers.interrupt import exit_interrupted\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "sys.stdout.write('said before exiting')\n"  # buffered: a pipe is not a tty
        "sys.stderr.write('and on stderr')\n"
        "exit_interrupted(7)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 7
    assert proc.stdout == "said before exiting" and proc.stderr == "and on stderr"  # flushed; atexit never ran
    assert interrupt.EXIT_CODE == 130
