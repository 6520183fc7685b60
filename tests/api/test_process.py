"""Process-level settings every run's owner makes (api/process.py)."""

from __future__ import annotations

import os


def test_the_owner_limits_its_malloc_arenas_unless_the_user_chose():
    """mallopt(M_ARENA_MAX) in a fresh process: set on glibc; a user's MALLOC_ARENA_MAX wins."""
    import subprocess
    import sys

    code = "from areal_graph.api.process import limit_malloc_arenas; print(limit_malloc_arenas())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip() == "True"
    )
    chosen = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "MALLOC_ARENA_MAX": "4"}
    )
    assert chosen.stdout.strip() == "False"
