"""The sandbox keeps model-written code from hurting the rollout worker."""

import asyncio
import logging
import os
import sys
import time

import pytest

from areal_graph.tools.sandbox import SandboxLimits, bind_paths, run_python
from support.paths import REPO

AS_ROOT = os.geteuid() == 0


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


# ------------------------------------------------------------------ containment (tools/sandbox_launcher.py)


def test_stdin_is_the_programs_input():
    r = asyncio.run(
        run_python(
            "import sys; print(sum(int(x) for x in sys.stdin.read().split()))", SandboxLimits(), stdin="1 2\n3\n"
        )
    )
    assert r.ok and r.stdout == "6\n"


def test_unread_stdin_larger_than_a_pipe_does_not_hang():
    t0 = time.monotonic()
    r = asyncio.run(run_python("print('ignored my input')", SandboxLimits(wall_s=10), stdin="x" * (4 << 20)))
    assert r.ok and r.stdout == "ignored my input\n" and not r.timed_out
    assert time.monotonic() - t0 < 10


def test_code_longer_than_an_argv_entry_runs():
    code = "x = " + repr("y" * 300_000) + "\nprint(len(x))"  # execve caps one argument at 128 KiB
    assert run(code).stdout == "300000\n"


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)
    with pytest.raises(ValueError, match="isolation"):
        SandboxLimits(isolation="docker")


def test_bind_paths_are_system_and_interpreter_dirs_never_nested():
    paths = bind_paths(sys.executable)
    assert "/usr" in paths
    assert any(sys.base_prefix == p or sys.base_prefix.startswith(p + "/") for p in paths)
    assert not any(a != b and b.startswith(a + "/") for a in paths for b in paths)
    assert not any(p in ("/", "/root", "/home", "/tmp", "/work") for p in paths)


@pytest.mark.skipif(not AS_ROOT, reason="the full set needs root (user namespaces give all but the uid drop)")
def test_root_engine_gets_every_containment_feature():
    r = run("import os; print(os.getuid() >= 3_000_000_000, os.getpid(), os.getcwd(), sorted(os.listdir('/tmp')))")
    assert r.containment is not None and r.containment.full and r.containment.mode == "namespaces"
    # /tmp is empty but for the interpreter's own dirs when it lives there (a venv in /tmp/clone/.venv)
    tmp = sorted({p.split("/")[2] for p in bind_paths(sys.executable) if p.startswith("/tmp/")})
    # own uid, pid 2 under its init, private dirs
    assert r.stdout.strip().split(maxsplit=3) == ["True", "2", "/sandbox/work", str(tmp)]
    assert r.cpu_s is not None and r.max_rss_mb is not None and r.max_rss_mb > 1


@pytest.mark.skipif(not AS_ROOT, reason="forcing a user namespace from root keeps this test independent of the host")
def test_user_namespace_mode_contains_network_and_filesystem():
    code = (
        "import socket, os\n"
        "try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError as e:\n    print(e.errno)\n"
        "try:\n    open('/usr/x', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
    )
    r = run(code, isolation="user_namespace")
    c = r.containment
    assert c.mode == "user_namespace" and c.network and c.pid and c.filesystem and not c.process_limit
    assert r.stdout.split() == ["101", "30", "0000000000000000"]  # ENETUNREACH, EROFS, no capabilities


def test_degraded_mode_is_flagged_and_warned_once(caplog):
    with caplog.at_level(logging.WARNING, logger="areal_graph.tools.sandbox"):
        first = run("print(1)", isolation="rlimits")
        run("print(1)", isolation="rlimits")
    assert first.ok and first.containment.mode == "rlimits" and not first.containment.full
    assert not first.containment.network and not first.containment.filesystem
    warnings = [rec for rec in caplog.records if "degraded" in rec.getMessage()]
    assert len(warnings) <= 1  # once per process and kind of degradation (0 if an earlier test already warned)


def test_require_isolation_refuses_to_run_degraded():
    r = run("print('ran')", isolation="rlimits", require_isolation=True)
    assert not r.ok and r.stdout == "" and "full containment required" in r.error
    assert r.as_observation().startswith("Error: full containment required")


def test_output_cap_kills_and_keeps_only_the_cap():
    t0 = time.monotonic()
    r = run("import sys\nwhile True: sys.stdout.write('z' * 65536)", max_output_bytes=5000, wall_s=20)
    assert r.truncated and r.limit == "output" and r.returncode is None and not r.timed_out
    assert r.stdout == "z" * 5000 and r.as_observation().endswith("[output truncated]")
    assert time.monotonic() - t0 < 15  # stopped at the cap, not at the wall clock


def test_exit_status_and_signals_are_reported():
    assert run("import sys; sys.exit(3)").returncode == 3
    assert run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)").returncode == -15


def _sandbox_processes_with(marker: str) -> list[int]:
    """Live processes of a sandbox uid whose private root holds code containing `marker`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = int(open(f"/proc/{entry}/status").read().split("Uid:")[1].split()[0])
            if uid >= 3_000_000_000 and marker in open(f"/proc/{entry}/root/sandbox/main.py").read():
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.skipif(not AS_ROOT, reason="looks into other processes' roots through /proc")
def test_cancelling_the_caller_kills_the_sandbox():
    marker = f"cancelme{os.getpid()}"

    async def start_then_cancel():
        task = asyncio.ensure_future(run_python(f"import time  # {marker}\ntime.sleep(60)", SandboxLimits(wall_s=60)))
        for _ in range(100):  # until it runs
            await asyncio.sleep(0.1)
            if _sandbox_processes_with(marker):
                break
        running = _sandbox_processes_with(marker)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return running

    assert asyncio.run(start_then_cancel())  # it was running
    deadline = time.monotonic() + 5
    while _sandbox_processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sandbox_processes_with(marker) == []


def test_unencodable_code_is_the_programs_error_not_a_weaker_sandbox():
    r = run("print('\ud800')")  # a lone surrogate: not UTF-8, must not break the sandbox's setup
    assert r.error is None and r.returncode != 0 and "SyntaxError" in r.stderr
    assert r.containment is not None and r.containment.filesystem == (r.containment.mode != "rlimits")


def test_directories_of_dead_engines_are_removed(tmp_path, monkeypatch):
    import subprocess
    import tempfile

    from areal_graph.tools import sandbox

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale, live = tmp_path / f"areal-sandbox-{dead.pid}-abc", tmp_path / f"areal-sandbox-{os.getpid()}-def"
    for d in (stale, live):
        (d / "work").mkdir(parents=True)
    monkeypatch.setattr(sandbox, "_cleaned_stale", False)
    assert run("print(1)").ok
    assert not stale.exists() and live.exists()
    assert [p.name for p in tmp_path.iterdir()] == [live.name]  # the run's own directory is gone too


# ------------------------------------------------------------------ an interpreter under /tmp (a venv in a clone there)
# The engine's interpreter decides what the private root binds (its prefixes), so these tests run
# the sandbox from a second process whose interpreter is a venv under /tmp, as in a git clone in /tmp.
ENGINE_IN_TMP = r"""
import asyncio, dataclasses, importlib.util, json, sys
repo, isolation = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("areal_graph", repo + "/__init__.py", submodule_search_locations=[repo])
package = importlib.util.module_from_spec(spec)
sys.modules["areal_graph"] = package
spec.loader.exec_module(package)
from areal_graph.tools.sandbox import SandboxLimits, run_python
result = asyncio.run(run_python(sys.stdin.read(), SandboxLimits(isolation=isolation)))
print(json.dumps(dataclasses.asdict(result)))
"""

PROBE_IN_TMP = r"""
import errno, json, os, sys
import areal_sandbox_probe  # from the venv's own site-packages
clone = os.path.dirname(sys.prefix)
seen = {"prefix": sys.prefix, "executable": sys.executable, "probe": areal_sandbox_probe.VALUE,
        "tmp": sorted(os.listdir("/tmp")), "base": sorted(os.listdir(os.path.dirname(clone))),
        "clone": sorted(os.listdir(clone)), "uid": os.getuid()}
for key, path in (("secret", clone + "/secret.txt"), ("outside", @OUTSIDE@)):
    try:
        seen[key] = open(path).read()
    except OSError as e:
        seen[key] = errno.errorcode[e.errno]
for key, path in (("write_venv", sys.prefix + "/pwned"), ("write_tmp", @PWNED@)):
    try:
        open(path, "w").close()
        seen[key] = "wrote"
    except OSError as e:
        seen[key] = errno.errorcode[e.errno]
print(json.dumps(seen))
"""


@pytest.fixture(scope="module", params=["/tmp", "/dev/shm"])
def venv_under_tmp(request):
    """/tmp/areal-sbx-clone-*/.venv (what `git clone` into /tmp and `python -m venv .venv` make),
    with a secret next to it in the clone and another directly in /tmp; the same under /dev/shm,
    the other host directory the private root makes its own."""
    import shutil
    import subprocess
    import tempfile
    import uuid

    base = request.param
    if not os.path.isdir(base) or not os.access(base, os.W_OK):
        pytest.skip(f"no writable {base} here")
    clone = tempfile.mkdtemp(prefix="areal-sbx-clone-", dir=base)  # /tmp itself, whatever TMPDIR says
    outside = f"{base}/areal-sbx-secret-{uuid.uuid4().hex}"
    try:
        os.chmod(clone, 0o755)  # as a clone would be: only the private root keeps the secrets out
        venv = os.path.join(clone, ".venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        site_packages = subprocess.run(
            [python, "-c", "import site; print(site.getsitepackages()[0])"], check=True, capture_output=True, text=True
        ).stdout.strip()
        assert site_packages.startswith(venv + "/")
        with open(os.path.join(site_packages, "areal_sandbox_probe.py"), "w") as f:
            f.write("VALUE = 42\n")
        for path in (os.path.join(clone, "secret.txt"), outside):
            with open(path, "w") as f:
                f.write("areal-secret")
            os.chmod(path, 0o644)
        yield venv, outside
    finally:
        shutil.rmtree(clone, ignore_errors=True)
        if os.path.exists(outside):
            os.remove(outside)


def _run_with_engine_in_tmp(venv: str, code: str, isolation: str = "auto") -> dict:
    import json
    import subprocess

    repo = str(REPO)
    done = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c", ENGINE_IN_TMP, repo, isolation],
        input=code,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _namespaces_available() -> bool:
    return run("pass").containment.mode != "rlimits"


def test_interpreter_under_tmp_gets_a_private_root_showing_only_its_own_dirs(venv_under_tmp):
    """The issue: with the venv in /tmp, binding it made the root's /tmp early, the root's own
    `mkdir /tmp` then failed and the code ran with the host filesystem visible."""
    if not _namespaces_available():
        pytest.skip("no namespaces on this machine: no private root to check")
    venv, outside = venv_under_tmp
    pwned = f"/tmp/areal-sbx-pwned-{os.getpid()}"
    r = _run_with_engine_in_tmp(venv, PROBE_IN_TMP.replace("@OUTSIDE@", repr(outside)).replace("@PWNED@", repr(pwned)))
    if os.path.exists(pwned):  # only if the test fails: never leave it behind
        os.remove(pwned)
    c = r["containment"]
    assert r["error"] is None and r["returncode"] == 0, r
    assert c["filesystem"], c["warnings"]
    if AS_ROOT:
        assert c["mode"] == "namespaces"
        assert all(c[k] for k in ("network", "pid", "filesystem", "user", "process_limit"))
    seen = __import__("json").loads(r["stdout"])
    assert seen["prefix"] == venv and seen["executable"] == os.path.join(venv, "bin", "python")  # the venv's python
    assert seen["probe"] == 42  # its site-packages are there
    clone = os.path.dirname(venv)
    assert seen["base"] == [os.path.basename(clone)] and seen["clone"] == [".venv"]  # nothing else of /tmp
    assert seen["tmp"] == ([os.path.basename(clone)] if clone.startswith("/tmp/") else [])
    assert seen["secret"] == "ENOENT" and seen["outside"] == "ENOENT"
    assert seen["write_venv"] == "EROFS" and seen["write_tmp"] == "EROFS"
    assert not os.path.exists(os.path.join(venv, "pwned"))


# A stand-in launcher whose build_root fails as a layout bug would (the launcher runs in its own process).
BROKEN_LAUNCHER = r"""
import errno, importlib.util, sys
spec = importlib.util.spec_from_file_location("sandbox_launcher", @LAUNCHER@)
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)
def build_root(spec, work_uid):
    raise OSError(errno.@ERRNO@, "forced failure")
launcher.build_root = build_root
launcher.main(sys.argv)
"""


def _broken_launcher(tmp_path, monkeypatch, err: str) -> None:
    from areal_graph.tools import sandbox

    path = tmp_path / "broken_launcher.py"
    path.write_text(BROKEN_LAUNCHER.replace("@LAUNCHER@", repr(str(sandbox.LAUNCHER))).replace("@ERRNO@", err))
    monkeypatch.setattr(sandbox, "LAUNCHER", path)
    monkeypatch.setattr(sandbox, "_logged_errors", set())


def _assert_refused_loudly(r, caplog, cause: str) -> None:
    assert not r.ok and r.returncode != 0 and r.stdout == "" and r.stderr == ""  # the program never ran
    assert r.error.startswith("private root failed") and cause in r.error and "not run" in r.error
    assert r.as_observation().startswith("Error: private root failed")
    assert r.containment is not None and not r.containment.filesystem
    assert any(rec.levelno == logging.ERROR and cause in rec.getMessage() for rec in caplog.records)


@pytest.mark.skipif(not AS_ROOT, reason="namespaces mode needs root")
def test_a_failed_private_root_on_a_root_engine_is_an_error_and_nothing_runs(tmp_path, monkeypatch, caplog):
    _broken_launcher(tmp_path, monkeypatch, "EPERM")  # even the kernel refusing it: root may mount
    with caplog.at_level(logging.ERROR, logger="areal_graph.tools.sandbox"):
        r = run("print('ran')", isolation="namespaces")
    _assert_refused_loudly(r, caplog, "forced failure")


@pytest.mark.skipif(not AS_ROOT, reason="forcing a user namespace from root keeps this test independent of the host")
@pytest.mark.parametrize("err", ["EEXIST", "EPERM"])
def test_user_namespace_degrades_only_when_the_kernel_refuses_the_private_root(err, tmp_path, monkeypatch, caplog):
    _broken_launcher(tmp_path, monkeypatch, err)
    with caplog.at_level(logging.WARNING, logger="areal_graph.tools.sandbox"):
        r = run("print('ran')", isolation="user_namespace")
    if err == "EEXIST":  # our own bug, not the machine's policy: no silent fallback
        _assert_refused_loudly(r, caplog, "forced failure")
    else:  # what the machine allows: runs, flagged and warned about
        assert r.ok and r.stdout == "ran\n" and r.error is None and not r.containment.filesystem
        assert any("refused by the kernel" in w for w in r.containment.warnings)


@pytest.mark.skipif(not AS_ROOT, reason="namespaces mode needs root")
@pytest.mark.parametrize("bad", ["/tmp", "/proc/sys", "/dev"])
def test_binds_over_the_roots_own_dirs_are_refused(bad, monkeypatch, caplog):
    from areal_graph.tools import sandbox

    real = sandbox.bind_paths
    monkeypatch.setattr(sandbox, "bind_paths", lambda python: [*real(python), bad])
    monkeypatch.setattr(sandbox, "_logged_errors", set())
    with caplog.at_level(logging.ERROR, logger="areal_graph.tools.sandbox"):
        r = run("print('ran')", isolation="namespaces")
    _assert_refused_loudly(r, caplog, f"bind {bad}")
