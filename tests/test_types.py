"""The type checker holds the hosts to what the owner calls on them.

A node call crosses a process boundary as a method name and the worker looks it up with
getattr (runtime/hosts/protocols.py says why that needs a declared interface). mypy checks
each host class against its Protocol there (every module ends with a `_serves` function the
checker alone reads) and the executor that sends those names. Configuration: pyproject.toml
[tool.mypy]; third-party packages count as Any, which keeps the run to seconds.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from support.ci import missing
from support.paths import REPO

# the hosts and their Protocols, and the owner's side that calls them by name
CHECKED = ["areal_graph.runtime.hosts", "areal_graph.runtime.orchestration.process_executor"]


def need_mypy() -> None:
    if importlib.util.find_spec("mypy") is None:
        missing("mypy", "a dev dependency: pip install -e '.[dev]'")


def run_mypy(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess:
    need_mypy()
    # the repository root is the package: mypy finds it as `areal_graph` through a link
    (tmp_path / "areal_graph").symlink_to(REPO)
    args = [a for t in targets for a in ("-p", t)]
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), *args], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "MYPYPATH": str(tmp_path)}, timeout=300)


def test_the_hosts_and_their_callers_type_check(tmp_path):
    done = run_mypy(tmp_path, *CHECKED)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success" in done.stdout


def test_a_host_that_drops_a_method_fails_the_check(tmp_path):
    """The check can fail: a copy of the package whose ModelHost misspells publish_weights."""
    need_mypy()
    copy = tmp_path / "pkg"
    copy.mkdir()
    for part in ("runtime", "data", "graph", "api", "engines", "nodes", "tools", "workflows", "__init__.py"):
        (copy / part).symlink_to(REPO / part)
    (copy / "runtime").unlink()
    runtime = copy / "runtime"
    runtime.mkdir()
    for entry in (REPO / "runtime").iterdir():
        if entry.name != "hosts":
            (runtime / entry.name).symlink_to(entry)
    hosts = runtime / "hosts"
    hosts.mkdir()
    for entry in (REPO / "runtime" / "hosts").glob("*.py"):
        text = entry.read_text()
        if entry.name == "model_host.py":
            assert "def publish_weights(self" in text
            text = text.replace("def publish_weights(self", "def publish_weight(self")
        (hosts / entry.name).write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    (work / "areal_graph").symlink_to(copy)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "-p", "areal_graph.runtime.hosts"], cwd=work,
                          capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(work)}, timeout=300)
    assert done.returncode == 1 and "publish_weights" in done.stdout, done.stdout[-3000:]
