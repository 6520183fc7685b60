"""Hosts a function node: calls `fn(batch, **args)` on the packed batch.

The same host runs in the controller (`host: controller`, for cheap functions such as the
advantage estimators) and in the `functions` worker process (`host: worker`). What a
function may return is checked by the controller for every node alike
(`runtime/orchestration/phase_runner.py`): its declared writes, for the sequences it keeps.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_graph.api.imports import import_object
from areal_graph.data.packed import PackedBatch


class FunctionHost:
    """`out_key`: a function with an `out_key` parameter that the node's args leave unset is
    given the node's single declared write, so a YAML names its output once (`writes`)."""

    def __init__(
        self, fn: str, args: dict[str, Any] | None = None, node: str = "?", writes: tuple[str, ...] | list[str] = ()
    ) -> None:
        self.fn = import_object(fn, what=f"function node {node!r} fn")
        if not callable(self.fn):
            raise TypeError(f"function node {node!r}: {fn} is not callable")
        self.args = dict(args or {})
        if "out_key" not in self.args and len(writes) == 1 and accepts(self.fn, "out_key"):
            self.args["out_key"] = writes[0]
        self.node = node
        self.path = fn

    def run(self, batch: PackedBatch) -> Any:
        """Whatever fn returns: a PackedBatch, or (PackedBatch, stats)."""
        return self.fn(batch, **self.args)


def accepts(fn: Callable, name: str) -> bool:
    """Whether `fn` names a parameter `name` (a catch-all **kwargs does not count)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import FunctionService

    def _serves(host: FunctionHost) -> FunctionService:
        return host
