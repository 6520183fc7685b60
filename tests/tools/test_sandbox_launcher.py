"""tools/sandbox_launcher.py, its parts one by one: which binds the private root refuses
(`check_binds`), that nothing is made outside the root through a symlink (`_inside`), when an
interpreter is reachable by another uid (`world_executable`), the status pipe (`Status`), the
rlimits a program gets (`set_limits`), the files a program without a private root runs from
(`_prepare_host_dir`), and that a launcher whose caller is gone exits at once (`main`).

tests/tools/test_sandbox.py runs whole programs through `run_python`; these call the launcher's
functions directly (rlimits and `main` in a short child, as they change the process), and run
the launcher file the way `run_python` does, with `python -I -S` (no site, no areal_graph)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from areal_graph.tools import sandbox_launcher as L

LAUNCHER = L.__file__


@pytest.mark.parametrize(
    "binds",
    [
        [],
        ["/usr", "/lib", "/etc/ssl"],
        ["/opt/venv", "/tmp/clone/.venv", "/dev/shm/venv"],
        ["/tmpx", "/procfs", "/sandboxes"],
        ["/usr/", "/usr//lib"],
    ],
)
def test_binds_outside_the_roots_own_dirs_are_accepted(binds):
    L.check_binds(binds)


@pytest.mark.parametrize(
    "bind,words",
    [
        ("usr/lib", "is not an absolute path below /"),
        ("/", "is not an absolute path below /"),
        ("/..", "is not an absolute path below /"),
        ("/tmp", "would cover the sandbox's own /tmp"),
        ("/tmp/", "would cover the sandbox's own /tmp"),
        ("/dev", "would cover the sandbox's own /dev"),
        ("/proc", "would cover the sandbox's own /proc"),
        ("/sandbox", "would cover the sandbox's own /sandbox"),
        ("/proc/sys", "lies below the sandbox's own /proc"),
        ("/sandbox/work", "lies below the sandbox's own /sandbox"),
        ("/usr/../proc/1", "lies below the sandbox's own /proc"),
        ("//tmp", "would cover the sandbox's own /tmp"),  # normpath keeps a leading "//"
        ("//proc/sys", "lies below the sandbox's own /proc"),
        ("//", "is not an absolute path below /"),
    ],
)
def test_binds_over_or_below_the_roots_own_dirs_are_refused(bind, words):
    with pytest.raises(L.PrivateRootError, match=words):
        L.check_binds(["/usr", bind])


def test_nothing_is_made_through_a_symlink_out_of_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    os.symlink("/usr/lib", root / "lib")  # what binding a host's /lib -> /usr/lib leaves in the root
    os.symlink("usr/lib", root / "lib64")  # relative: stays inside
    L._inside(str(root), str(root / "usr" / "lib" / "x"))
    L._inside(str(root), str(root / "lib64"))
    L._inside(str(root), str(root))
    with pytest.raises(L.PrivateRootError, match=r"^/lib/python resolves to /usr/lib/python, outside the private root"):
        L._inside(str(root), str(root / "lib" / "python"))


def test_root_path_is_beside_the_spec():
    assert L.root_path({"dir": "/var/tmp/sbx-1"}) == "/var/tmp/sbx-1/root"


@pytest.fixture
def open_dir():
    """A fresh directory whose parents every uid can pass (pytest's own tmp dirs are 0700)."""
    path = tempfile.mkdtemp(prefix="launcher-test-")
    try:
        if not all(os.stat(p).st_mode & 0o001 for p in Path(path).parents):
            pytest.skip(f"the temp dir {path} lies below a directory other uids cannot pass")
        os.chmod(path, 0o755)
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_world_executable_needs_every_directory_on_the_way(open_dir, tmp_path):
    assert L.world_executable("/usr/bin/env")
    a = open_dir / "a"
    (a / "b").mkdir(parents=True)
    tool = a / "b" / "tool"
    tool.write_text("")
    os.chmod(tool, 0o755)
    assert L.world_executable(str(tool))
    a.chmod(0o700)  # one closed directory on the way
    assert not L.world_executable(str(tool))
    a.chmod(0o711)  # passable though not readable: enough
    assert L.world_executable(str(tool))
    os.chmod(tool, 0o750)
    assert not L.world_executable(str(tool))
    closed = tmp_path / "tool"  # below pytest's 0700 base dir
    closed.write_text("")
    os.chmod(closed, 0o755)
    assert not L.world_executable(str(closed))


def test_world_executable_follows_symlinks(tmp_path):
    link = tmp_path / "env"
    os.symlink("/usr/bin/env", link)
    assert L.world_executable(str(link))  # decided on /usr/bin/env, not on the closed tmp dirs


def test_status_writes_one_json_line_per_call_and_survives_a_closed_reader():
    r, w = os.pipe()
    os.set_inheritable(w, True)
    status = L.Status(w)
    assert not os.get_inheritable(w)  # the program never inherits it
    status.write(containment={"mode": "rlimits"}, warnings=["w"])
    status.write(error="x")
    status.close()
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"containment": {"mode": "rlimits"}, "warnings": ["w"]},
        {"error": "x"},
    ]
    r, w = os.pipe()
    os.close(r)
    status = L.Status(w)
    status.write(error="nobody listens")  # EPIPE is not an error for the launcher
    status.close()
    status.close()  # twice: still no error


CHILD = r"""
import importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location("launcher", sys.argv[1])
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)
launcher.set_limits({"memory_mb": 512, "max_file_mb": 3, "max_processes": 7, "cpu_s": 9}, process_limit=sys.argv[2] == "1")
names = ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CPU")
print(json.dumps({n: resource.getrlimit(getattr(resource, n)) for n in names}))
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("areal_graph", "site", "torch")))))
"""


@pytest.mark.parametrize("process_limit", [True, False])
def test_set_limits_in_a_launcher_started_like_run_python_starts_it(process_limit):
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", CHILD, LAUNCHER, "1" if process_limit else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={},
    )
    assert proc.returncode == 0, proc.stderr
    limits_line, modules_line = proc.stdout.splitlines()
    got = {k: tuple(v) for k, v in json.loads(limits_line).items()}
    nproc = (7, 7) if process_limit else resource.getrlimit(resource.RLIMIT_NPROC)  # inherited from here
    assert got == {
        "RLIMIT_AS": (512 << 20, 512 << 20),
        "RLIMIT_FSIZE": (3 << 20, 3 << 20),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (256, 256),
        "RLIMIT_NPROC": nproc,
        "RLIMIT_CPU": (9, 10),
    }
    assert json.loads(modules_line) == []  # standard library only: no site, no areal_graph


def test_without_a_private_root_the_program_runs_from_files_in_the_sandbox_dir(tmp_path):
    spec = {"dir": str(tmp_path), "code": "print('hé')\n", "env": {"PATH": "/usr/bin"}, "uid": L.UID_BASE + 1}
    L._prepare_host_dir(spec, False)
    work = tmp_path / "work"
    assert work.is_dir() and (tmp_path / "main.py").read_text(encoding="utf-8") == "print('hé')\n"
    assert spec["env"] == {"PATH": "/usr/bin", "HOME": str(work), "TMPDIR": str(work)}
    L._prepare_host_dir(spec, False)  # the work dir may already exist


@pytest.mark.skipif(os.geteuid() != 0, reason="handing the work dir to another uid needs root")
def test_as_root_the_program_uid_gets_its_work_dir_and_only_reads_the_code(tmp_path):
    d = tmp_path / "sbx"
    d.mkdir(mode=0o700)
    spec = {"dir": str(d), "code": "pass\n", "env": {}, "uid": L.UID_BASE + 12345}
    L._prepare_host_dir(spec, True)
    assert (os.stat(d).st_mode & 0o777) == 0o711 and (os.stat(d / "main.py").st_mode & 0o777) == 0o444
    assert os.stat(d / "work").st_uid == L.UID_BASE + 12345 and os.stat(d / "work").st_gid == L.UID_BASE + 12345


def test_a_launcher_whose_caller_is_gone_exits_before_doing_anything(tmp_path):
    """The spec names the pid that wrote it; a launcher with another parent (its caller died and
    it was reparented before its parent-death signal was armed) exits 1 and reports nothing."""
    (tmp_path / "spec.json").write_text(json.dumps({"parent_pid": 1, "mode": "rlimits"}))
    r, w = os.pipe()
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", LAUNCHER, str(tmp_path), str(w)],
            pass_fds=[w],
            capture_output=True,
            timeout=60,
            env={},
        )
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        status = f.read()
    assert proc.returncode == 1 and status == b"" and proc.stderr == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]  # no work dir, no root, no main.py
