"""Hostile snippets against the sandbox, one table row each.

Each row is code a policy could write. The test runs it in the sandbox, records what stopped
it (which limit, what error the code saw), checks from OUTSIDE that containment held (the
test server saw no connection, the file outside does not exist, the secret never appears,
no process of the sandbox's uid is left), and records what the code reward scored it (the
row's code as a completion, with one stdin test expecting "ok").

    .venv/bin/python -m pytest tests/tools/test_sandbox_hostile.py -s     # prints the table

Rows whose check relies on a containment feature the machine does not give (e.g. the uid
drop needs root) are skipped with the reason; on a root engine every row runs.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import areal_graph
from areal_graph.nodes.code_reward import CodeRewardConfig, CodeTest, extract_code, score_code
from areal_graph.runtime.launchers.local import free_port
from areal_graph.tools.sandbox import Containment, SandboxLimits, SandboxResult, run_python

UID_BASE = 3_000_000_000
SECRET = f"areal-secret-{uuid.uuid4().hex}"
REPO = Path(areal_graph.__file__).resolve().parent
TAG = uuid.uuid4().hex[:10]
OUTSIDE_FILES = {
    "tmp": f"/tmp/areal-hostile-{TAG}",
    "repo": str(REPO / f"areal-hostile-{TAG}"),
    "shm": f"/dev/shm/areal-hostile-{TAG}",
}
OK_TEST = [CodeTest(stdin="", expected_stdout="ok")]


# ------------------------------------------------------------------ outside witnesses
class Listener:
    """A TCP server outside the sandbox that counts every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            if any(line.split()[1:2] == [str(uid)] for line in status.splitlines() if line.startswith("Uid:")):
                pids.append(int(entry))
    return pids


def none_left(uid: int, wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while processes_of(uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass
class Ctx:
    listener: Listener
    bind_port: int
    secret_file: str
    probes: list = field(default_factory=list)  # outside connection attempts to bind_port: True = connected


# ------------------------------------------------------------------ the checks (outside view)
def _secret_absent(r: SandboxResult, ctx: Ctx) -> str:
    assert SECRET not in r.stdout and SECRET not in r.stderr
    assert "AREAL_GRAPH_RUN_TOKEN" not in r.stdout
    return "secret value absent from stdout/stderr"


def _no_connection(r: SandboxResult, ctx: Ctx) -> str:
    assert ctx.listener.accepted == 0
    assert "connected" not in r.stdout
    return "outside server accepted 0 connections"


def _not_reachable_from_outside(r: SandboxResult, ctx: Ctx) -> str:
    assert ctx.probes and not any(ctx.probes)
    return f"{len(ctx.probes)} outside connects to its port all refused"


def _no_file(key: str) -> Callable[[SandboxResult, Ctx], str]:
    def check(r: SandboxResult, ctx: Ctx) -> str:
        assert not os.path.exists(OUTSIDE_FILES[key])
        return f"{OUTSIDE_FILES[key]} does not exist"

    return check


def _fork_limited(r: SandboxResult, ctx: Ctx) -> str:
    forked, uid = int(r.stdout.split()[1]), int(r.stdout.split()[-1])
    assert forked <= 3 and none_left(uid)  # max_processes=4: the program and 3 children
    return f"{forked} forks succeeded; no process of uid {uid} left"


def _bomb_cleaned(r: SandboxResult, ctx: Ctx) -> str:
    uid = int(r.stdout.split()[0])
    assert none_left(uid)
    return f"no process of uid {uid} left after the kill"


def _bounded_memory(r: SandboxResult, ctx: Ctx) -> str:
    assert r.max_rss_mb is not None and r.max_rss_mb < 256
    return f"peak RSS {r.max_rss_mb:.0f} MB < 256 MB"


def _bounded_output(r: SandboxResult, ctx: Ctx) -> str:
    kept = len(r.stdout) + len(r.stderr)
    assert kept == 65536 and r.truncated
    return f"kept {kept} bytes; engine peak {ctx.probes[0] / 1e6:.2f} MB traced"


def _engine_alive(r: SandboxResult, ctx: Ctx) -> str:
    os.kill(os.getpid(), 0)
    assert ctx.listener.thread.is_alive()
    return "engine and its threads alive"


def _stopped_in_time(r: SandboxResult, ctx: Ctx) -> str:
    assert r.limit in ("cpu_time", "wall_time")
    return f"stopped by {r.limit}"


def _host_path_exists(path: str) -> Callable[[SandboxResult, Ctx], str]:
    def check(r: SandboxResult, ctx: Ctx) -> str:
        assert "listed" not in r.stdout and "read" not in r.stdout.split()
        if not os.path.exists(path):  # e.g. no /root/.cache on a fresh machine: nothing shown proves nothing
            pytest.skip(f"{path} does not exist on this host: nothing there to hide")
        return f"{path} exists on the host, not inside"

    return check


def _secret_file_unread(r: SandboxResult, ctx: Ctx) -> str:
    assert Path(ctx.secret_file).read_text() == SECRET
    return _secret_absent(r, ctx) + "; key file exists outside"


def _tmpfs_full(r: SandboxResult, ctx: Ctx) -> str:
    assert "No space left on device" in r.stdout or "File too large" in r.stdout
    return "writes stopped inside its own tmpfs"


def _still_unprivileged(r: SandboxResult, ctx: Ctx) -> str:
    assert "uid 0" not in r.stdout
    return "no privilege gained"


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Row:
    name: str
    code: str
    check: Callable[[SandboxResult, Ctx], str]
    limits: dict = field(default_factory=dict)
    needs: tuple[str, ...] = ("network", "pid", "filesystem")


FORK_COUNT = """import os, time
n, err = 0, ''
for _ in range(64):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError as e:
        err = e.strerror
        break
print('forked', n, err.replace(' ', '_'), os.getuid())"""

FORK_BOMB = """import os
print(os.getuid(), flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass"""

NETWORK = """import socket, urllib.request
for label, attempt in [('tcp', lambda: socket.create_connection(('127.0.0.1', @PORT@), timeout=2)),
                       ('http', lambda: urllib.request.urlopen('http://127.0.0.1:@PORT@/', timeout=2)),
                       ('internet', lambda: socket.create_connection(('1.1.1.1', 80), timeout=2))]:
    try:
        attempt()
        print(label, 'connected')
    except Exception as e:
        print(label, type(e).__name__, e)"""

BIND = """import socket, time
s = socket.socket()
try:
    s.bind(('0.0.0.0', @BIND_PORT@))
    s.listen()
    print('listening on @BIND_PORT@', flush=True)
    time.sleep(2.5)
except OSError as e:
    print('bind failed', e)"""

WRITE = """import os
for path in [@PATHS@]:
    try:
        with open(path, 'w') as f:
            f.write('pwned')
        print('wrote', path)
    except OSError as e:
        print(type(e).__name__, e)"""

ENV = """import os
print(sorted(os.environ))
for path in ['/proc/1/environ', '/proc/%d/environ' % os.getppid(), '/proc/@ENGINE_PID@/environ']:
    try:
        print(path, open(path, 'rb').read()[:200])
    except OSError as e:
        print(path, type(e).__name__, e)
seen = []
for pid in os.listdir('/proc'):
    try:
        seen.append(open('/proc/%s/environ' % pid, 'rb').read())
    except OSError:
        pass
print('readable environs:', len(seen), b'@SECRET@' in b''.join(seen))"""

KILL_PARENT = """import os, signal
for pid in (os.getppid(), @ENGINE_PID@):
    try:
        os.kill(pid, signal.SIGKILL)
        print('killed', pid)
    except OSError as e:
        print(pid, type(e).__name__, e)"""

KILL_ALL = """import os, signal, sys
caps = open('/proc/self/status').read().split('CapEff:')[1].split()[0]
if os.getuid() < 3_000_000_000 or int(caps, 16) != 0:
    print('refusing: not the unprivileged sandbox uid')  # never kill(-1) with privileges
    sys.exit(0)
print('kill(-1)', flush=True)
os.kill(-1, signal.SIGKILL)"""

READ = """import os
for path in [@PATHS@]:
    try:
        if os.path.isdir(path):
            print('listed', path, os.listdir(path)[:5])
        else:
            print('read', path, open(path).read()[:100])
    except OSError as e:
        print(path, type(e).__name__, e)"""

FILL = """import os
n = 0
try:
    while True:
        with open('f%d' % n, 'wb') as f:
            for _ in range(4):
                f.write(b'x' * (1 << 20))
        n += 1
except OSError as e:
    print(n * 4, 'MB then', e.strerror)"""

ESCALATE = """import os
for label, attempt in [('setuid0', lambda: os.setuid(0)), ('chroot', lambda: os.chroot('/')),
                       ('read-init-memory', lambda: open('/proc/1/mem', 'rb').read(1))]:
    try:
        attempt()
        print(label, 'succeeded: uid', os.getuid())
    except OSError as e:
        print(label, type(e).__name__, e)"""

ROWS = [
    Row(
        "fork bomb (counting forks)",
        FORK_COUNT,
        _fork_limited,
        {"max_processes": 4, "wall_s": 5},
        ("pid", "user", "process_limit"),
    ),
    Row(
        "fork bomb (while True: fork)",
        FORK_BOMB,
        _bomb_cleaned,
        {"max_processes": 4, "wall_s": 2},
        ("pid", "user", "process_limit"),
    ),
    Row("memory hog (one 2 GB bytearray)", "x = bytearray(2 * 1024**3)", _bounded_memory, {"memory_mb": 256}, ()),
    Row(
        "memory hog (grow by 16 MB)",
        "xs = []\nwhile True:\n    xs.append(bytearray(16 << 20))",
        _bounded_memory,
        {"memory_mb": 256},
        (),
    ),
    Row("infinite loop", "while True:\n    pass", _stopped_in_time, {"cpu_s": 1, "wall_s": 4}, ()),
    Row("sleep forever", "import time\ntime.sleep(3600)", _stopped_in_time, {"wall_s": 1}, ()),
    Row(
        "100 MB to stdout",
        "import sys\nsys.stdout.write('x' * 100_000_000)",
        _bounded_output,
        {"max_output_bytes": 65536},
        (),
    ),
    Row(
        "100 MB to stderr",
        "import sys\nsys.stderr.write('e' * 100_000_000)",
        _bounded_output,
        {"max_output_bytes": 65536},
        (),
    ),
    Row("connect to a server outside (tcp, http, internet)", NETWORK, _no_connection, {}, ("network",)),
    Row("bind and listen on a port", BIND, _not_reachable_from_outside, {"wall_s": 5}, ("network",)),
    Row("write /tmp/x", WRITE.replace("@PATHS@", repr(OUTSIDE_FILES["tmp"])), _no_file("tmp"), {}, ("filesystem",)),
    Row(
        "write into the repository",
        WRITE.replace("@PATHS@", repr(OUTSIDE_FILES["repo"])),
        _no_file("repo"),
        {},
        ("filesystem",),
    ),
    Row("write /dev/shm", WRITE.replace("@PATHS@", repr(OUTSIDE_FILES["shm"])), _no_file("shm"), {}, ("filesystem",)),
    Row("fill the disk (4 MB files)", FILL, _tmpfs_full, {}, ("filesystem",)),
    Row(
        "read env, /proc/1, /proc/<parent>, /proc/<engine> environ",
        ENV,
        _secret_absent,
        {},
        ("pid", "filesystem", "user"),
    ),
    Row("kill the parent and the engine", KILL_PARENT, _engine_alive, {}, ("pid", "user")),
    Row("kill(-1): every process it may signal", KILL_ALL, _engine_alive, {}, ("pid", "user")),
    Row(
        "read /root/.cache",
        READ.replace("@PATHS@", "'/root/.cache', '/root/.cache/areal-graph'"),
        _host_path_exists("/root/.cache"),
        {},
        ("filesystem",),
    ),
    Row(
        "read ssh keys and /etc/shadow",
        READ.replace("@PATHS@", "'@SECRET_FILE@', '/root/.ssh/id_rsa', '/root/.ssh/id_ed25519', '/etc/shadow'"),
        _secret_file_unread,
        {},
        ("filesystem",),
    ),
    Row(
        "read the repository",
        READ.replace("@PATHS@", repr(str(REPO / "README.md"))),
        _host_path_exists(str(REPO / "README.md")),
        {},
        ("filesystem",),
    ),
    Row("setuid(0), chroot, read init's memory", ESCALATE, _still_unprivileged, {}, ("user",)),
]

TABLE: list[tuple[str, ...]] = []


@pytest.fixture(scope="module")
def containment() -> Containment:
    """What this machine gives. A sandbox that fails to set up is a failure here, never a reason
    to skip rows: a root engine with namespaces must give every feature (a private root that
    cannot be built, e.g. for an interpreter under /tmp, once skipped the filesystem rows)."""
    result = asyncio.run(run_python("pass"))
    assert result.error is None and result.containment is not None, result
    assert result.containment.mode != "namespaces" or result.containment.full, result.containment
    return result.containment


@pytest.fixture(scope="module")
def listener():
    server = Listener()
    yield server
    server.close()
    if TABLE:
        header = ("snippet", "wall", "stopped by: what the code saw", "containment (checked outside)", "code reward")
        lines = [header, tuple("---" for _ in header), *TABLE]
        print("\n\n" + "\n".join("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in lines))


def _fill(code: str, ctx: Ctx) -> str:
    return (
        code.replace("@PORT@", str(ctx.listener.port))
        .replace("@BIND_PORT@", str(ctx.bind_port))
        .replace("@ENGINE_PID@", str(os.getpid()))
        .replace("@SECRET_FILE@", ctx.secret_file)
        .replace("@SECRET@", SECRET)
    )


async def _probe(port: int, until: asyncio.Task, probes: list) -> None:
    while not until.done():
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.5)
            writer.close()
            probes.append(True)
        except (TimeoutError, OSError):
            probes.append(False)
        await asyncio.sleep(0.1)


async def _run_row(row: Row, ctx: Ctx) -> tuple[SandboxResult, float, object]:
    code = _fill(row.code, ctx)
    limits = SandboxLimits(**row.limits)
    reward_config = CodeRewardConfig(
        wall_s=limits.wall_s, cpu_s=limits.cpu_s, memory_mb=limits.memory_mb, max_processes=limits.max_processes
    )
    t0 = time.monotonic()
    if row.check is _bounded_output:  # measure the engine's own memory while it reads 100 MB
        tracemalloc.start()
        result = await run_python(code, limits)
        ctx.probes.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        elapsed = time.monotonic() - t0
        return result, elapsed, await score_code(extract_code(f"```python\n{code}\n```"), OK_TEST, reward_config)
    sandbox = asyncio.ensure_future(run_python(code, limits))
    prober = (
        asyncio.ensure_future(_probe(ctx.bind_port, sandbox, ctx.probes))
        if row.check is _not_reachable_from_outside
        else None
    )
    score = await score_code(extract_code(f"```python\n{code}\n```"), OK_TEST, reward_config)
    result = await sandbox
    elapsed = time.monotonic() - t0
    if prober is not None:
        await prober
    return result, elapsed, score


def _what_happened(r: SandboxResult) -> str:
    how = r.limit or (f"exit {r.returncode}" if r.returncode is not None else "killed")
    lines = (r.stderr.strip().splitlines() or [""])[-1:] + r.stdout.strip().splitlines()[:3]
    seen = " / ".join(line.strip()[:60] for line in lines if line.strip())
    text = f"{how}: {seen}" if seen else how
    return text if len(text) <= 150 else text[:147] + "..."


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_hostile_snippet_is_contained(row: Row, containment: Containment, listener: Listener, tmp_path):
    missing = [f for f in row.needs if not getattr(containment, f)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (this machine's sandbox: mode {containment.mode})")
    secret_file = tmp_path / "id_rsa"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    os.environ["AREAL_GRAPH_RUN_TOKEN"] = SECRET  # the engine's secret, as a run sets it
    try:
        ctx = Ctx(listener, free_port(), str(secret_file))
        result, elapsed, score = asyncio.run(_run_row(row, ctx))
    finally:
        os.environ.pop("AREAL_GRAPH_RUN_TOKEN", None)
    assert result.error is None and result.containment is not None and result.containment.mode == containment.mode
    evidence = row.check(result, ctx)
    assert score.reward == 0.0 and score.reason != "passed"
    TABLE.append(
        (row.name, f"{elapsed:4.1f}s", _what_happened(result), evidence, f"{score.reward:.0f} ({score.reason})")
    )
    for path in OUTSIDE_FILES.values():  # never leave a file behind, whatever happened
        if os.path.exists(path):
            os.remove(path)
