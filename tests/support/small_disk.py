"""A real small filesystem for tests of a full disk: a size-limited tmpfs, mounted and unmounted.

Mounting needs root with CAP_SYS_ADMIN; elsewhere the test is skipped, saying why."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """`mnt` (created) as a tmpfs of `size` ("1m", "24m") for the block's duration."""
    mnt.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"a size-limited tmpfs cannot be mounted here (needs root with CAP_SYS_ADMIN): {done.stderr.strip()}"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
