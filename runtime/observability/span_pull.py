"""Bringing the spans of workers and inference servers into the run's trace, off the trainer's path.

Why in the background: a pull is a few RPCs plus decoding a few hundred KB of JSON (tens of
ms, more on a busy machine). Awaited inline every few seconds it delayed the training loop by
about 2% of its time; as a task of its own the trainer goes on with its next step. Each pull
is itself a span ("collect_spans", category "trace"), so the trace shows what it cost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


class BackgroundSpanPull:
    """At most one pull in flight; `maybe_start` from the event loop, `wait` before the end."""

    def __init__(self, tracer: Any, collect: Callable[[], Awaitable[list[dict]]], every_s: float) -> None:
        self.tracer = tracer
        self.collect = collect
        self.every_s = every_s
        self._last = time.perf_counter()
        self._task: asyncio.Task | None = None

    def maybe_start(self) -> None:
        """Start a pull when tracing is on, `every_s` has passed and none is in flight."""
        if not self.tracer.enabled or (self._task is not None and not self._task.done()):
            return
        if time.perf_counter() - self._last < self.every_s:
            return
        self._last = time.perf_counter()
        self._task = asyncio.create_task(self._pull(), name="collect-spans")

    async def wait(self) -> None:
        """Let the pull in flight finish (its spans were already taken from the processes)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _pull(self) -> None:
        try:
            with self.tracer.span("collect_spans", cat="trace"):
                horizon = self.tracer.now()  # what the processes finished before this is in the reply
                self.tracer.merge(await self.collect(), horizon=horizon)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a trace with a gap is no reason to stop a run
            log.warning("collecting spans from the run's processes failed (%s); the trace has a gap", err)
