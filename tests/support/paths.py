"""Where things are, for tests at any depth of the tree, and the environment a subprocess
needs to import `support.*` (user kinds, reward functions) the way a user's module would."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
WORKFLOWS = REPO / "workflows"


def child_env(**extra: str) -> dict[str, str]:
    """os.environ with tests/ first on PYTHONPATH (so `support.fake_kinds:ROLLOUT` imports in a
    worker), plus `extra`."""
    path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
