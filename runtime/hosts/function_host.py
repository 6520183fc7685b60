"""Hosts a function node: calls `fn(batch, **args)` on the packed batch.

The same host runs in the controller (`host: controller`, for cheap functions such as the
advantage estimators) and in the `functions` worker process (`host: worker`). What a
function may return is checked by the controller for every node alike
(`runtime/orchestration/scheduler.py`): its declared writes, for the sequences it keeps.
"""

from __future__ import annotations

from typing import Any

from areal_graph.api.imports import import_object
from areal_graph.data.packed import PackedBatch


class FunctionHost:
    def __init__(self, fn: str, args: dict[str, Any] | None = None, node: str = "?") -> None:
        self.fn = import_object(fn, what=f"function node {node!r} fn")
        if not callable(self.fn):
            raise TypeError(f"function node {node!r}: {fn} is not callable")
        self.args = dict(args or {})
        self.node = node
        self.path = fn

    def run(self, batch: PackedBatch) -> Any:
        """Whatever fn returns: a PackedBatch, or (PackedBatch, stats)."""
        return self.fn(batch, **self.args)
