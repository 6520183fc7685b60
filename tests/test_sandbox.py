"""The sandbox keeps model-written code from hurting the rollout worker."""

import asyncio
import time

from areal_graph.tools.sandbox import SandboxLimits, run_python


def run(code, **kw):
    return asyncio.run(run_python(code, SandboxLimits(**kw)))


def test_prints_result():
    r = run("print(sum(range(10)) * 3)")
    assert r.ok and r.stdout.strip() == "135" and r.as_observation() == "135"


def test_exception_becomes_error_observation():
    r = run("1/0")
    assert not r.ok and r.returncode != 0
    assert r.as_observation() == "Error: ZeroDivisionError: division by zero"


def test_infinite_loop_is_killed_on_time():
    t0 = time.monotonic()
    r = run("while True: pass", wall_s=1.0, cpu_s=5)
    assert r.timed_out and r.returncode is None and r.as_observation() == "Error: timed out"
    assert time.monotonic() - t0 < 30.0  # killed, not left to run: the bound is about liveness, not speed


def test_memory_bomb_fails_inside_the_sandbox():
    r = run("x = bytearray(2 * 1024**3); print('allocated')", memory_mb=256)
    assert not r.ok and "MemoryError" in r.stderr


def test_output_is_truncated():
    r = run("print('a' * 100000)", max_output_bytes=1000)
    assert r.truncated and len(r.stdout) == 1000


def test_isolated_from_environment_and_cwd(tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    r = run("import os; print(os.environ.get('SECRET_TOKEN')); print(os.listdir('.'))")
    assert r.stdout.split() == ["None", "[]"]


def test_sleeping_child_processes_are_killed_with_the_group():
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); import time; time.sleep(60)"
    t0 = time.monotonic()
    r = run(code, wall_s=1.0)
    assert r.timed_out and time.monotonic() - t0 < 30.0  # the 60 s sleepers did not hold the call open
