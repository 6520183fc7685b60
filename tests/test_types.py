"""The type checker holds the package together: hosts and engines to what their callers use,
and every module to its own annotations.

A node call crosses a process boundary as a method name and the worker looks it up with
getattr (runtime/hosts/protocols.py says why that needs a declared interface). mypy checks
each host class against its Protocol there (every module ends with a `_serves` function the
checker alone reads), each training engine against engines/training/protocol.py (`_implements`),
and the executor that sends those names. Configuration: pyproject.toml [tool.mypy];
third-party packages count as Any, which keeps the run to about 25 s.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.ci import missing
from support.paths import REPO

# The whole package: the hosts and the engines with their Protocols (runtime/hosts/protocols.py,
# engines/training/protocol.py, engines/inference/backends/base.py), the owner that calls them by
# name, and everything else. Not protos/: generated code whose classes only exist at run time.
CHECKED = [
    f"areal_graph.{p}"
    for p in (
        "api",
        "cli",
        "data",
        "engines",
        "graph",
        "modelkit",
        "nodes",
        "perfmodel",
        "runtime",
        "tools",
        "trace_analysis",
        "workflows",
    )
]


def need_mypy() -> None:
    if importlib.util.find_spec("mypy") is None:
        missing("mypy", "a dev dependency: pip install -e '.[dev]'")


def run_mypy(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess:
    need_mypy()
    # the repository root is the package: mypy finds it as `areal_graph` through a link
    (tmp_path / "areal_graph").symlink_to(REPO)
    args = [a for t in targets for a in ("-p", t)]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(tmp_path)},
        timeout=300,
    )


def test_the_package_type_checks(tmp_path):
    done = run_mypy(tmp_path, *CHECKED)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success" in done.stdout


def shadow_package(root: Path, changes: dict[str, tuple[str, str]]) -> Path:
    """A copy of the package in `root`/areal_graph: links, but for the folders down to each
    changed file and the file itself, in which `old` is replaced by `new` (changes: path ->
    (old, new))."""
    copy = root / "areal_graph"
    copy.mkdir(parents=True)
    real = {copy.joinpath(*Path(c).parts[:k]) for c in changes for k in range(1, len(Path(c).parts))}  # folders

    def fill(here: Path, there: Path) -> None:
        for entry in here.iterdir():
            if entry.name in (".git", ".venv", ".venv-vllm", "__pycache__"):
                continue
            rel = (there / entry.name).relative_to(copy).as_posix()
            if there / entry.name in real:
                (there / entry.name).mkdir()
                fill(entry, there / entry.name)
            elif rel in changes:
                old, new = changes[rel]
                text = entry.read_text()
                assert old in text, (rel, old)
                (there / entry.name).write_text(text.replace(old, new))
            else:
                (there / entry.name).symlink_to(entry)

    fill(REPO, copy)
    return root


@pytest.mark.slow  # ~20 s of a second mypy run; the check itself runs on every `make test`
def test_an_implementation_that_drops_a_method_fails_the_check(tmp_path):
    """The check can fail: a copy of the package in which a host misspells a method the owner
    calls by name, and the training engine lacks one the model host drives."""
    need_mypy()
    work = shadow_package(
        tmp_path / "work",
        {
            "runtime/hosts/model_host.py": ("def publish_weights(self", "def publish_weight(self"),
            "engines/training/train_engine.py": ("def state_dict_for_sync(self", "def state_dict_to_sync(self"),
        },
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "-p",
            "areal_graph.runtime.hosts",
            "-p",
            "areal_graph.engines.training",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(work)},
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert "model_host.py" in done.stdout and "publish_weights" in done.stdout, done.stdout[-3000:]
    assert "train_engine.py" in done.stdout and "state_dict_for_sync" in done.stdout, done.stdout[-3000:]
