"""Optional tools in CI: a skip on a developer's machine is a failure there."""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest


def missing(what: str, how: str) -> None:
    """A test that needs an optional tool which is not here: skipped on a developer's machine,
    failed in CI (`.ci/run` sets AREAL_GRAPH_CI=1 after installing the tools), where a skip
    would hide that CI no longer runs what it is meant to."""
    if os.environ.get("AREAL_GRAPH_CI"):
        pytest.fail(f"{what} is missing in CI ({how})")
    pytest.skip(f"{what} is missing ({how})")


def optional(module: str, how: str) -> Any:
    """`module` imported, or the test skipped here and failed in CI (see `missing`)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(module, how)
