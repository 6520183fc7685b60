"""Bounded staleness: how many trajectories the rollout side may have accepted-or-running.

The rule (AReaL; docs/design.md): with B trajectories per training step, current policy version
v and max staleness eta, at most ``(eta + v + 1) * B`` trajectories may be accepted or
running *in total, since the start of the run*; capacity for new requests is

    min(max_concurrent - running, (eta + v + 1) * B - (accepted + running))

(both formulas are `staleness_rule.py`'s functions, which perfmodel/simulator.py calls too).

Why a running total: the trainer consumes B accepted trajectories per version, so the rule
caps how far generation may run ahead of training (at most eta versions). A trajectory that
finished but was dropped (`on_reject`: failed, filtered) gives its slot back: it is neither
running nor accepted.

With eta = 0 this *is* synchronous RL: at version v at most (v+1)*B trajectories exist, the
trainer's step v needs (v+1)*B accepted in total, so step v can only start when every
admitted trajectory has finished, and every trajectory it trains was started at version v.

Every method is thread-safe (`on_submit` checks the bound and counts under one lock), and
`wait_for_capacity` wakes waiting coroutines from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import torch

from areal_graph.data.packed import token_seq_ids
from areal_graph.runtime.orchestration import staleness_rule

log = logging.getLogger(__name__)


class StalenessGate:
    """Admission control for rollouts under the bounded-staleness rule (see module docstring)."""

    def __init__(self, batch_size: int, max_staleness: int, max_concurrent: int) -> None:
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("max_staleness", max_staleness, 0),
            ("max_concurrent", max_concurrent, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"StalenessGate: {name} must be an integer >= {low}, got {value!r}")
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.max_concurrent = max_concurrent
        self._lock = threading.Lock()
        self._version = 0
        self._running = 0
        self._accepted = 0
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # ------------------------------------------------------------------ queries
    def bound(self, version: int | None = None) -> int:
        v = self._version if version is None else version
        return staleness_rule.staleness_bound(self.max_staleness, v, self.batch_size)

    def capacity(self) -> int:
        """How many new trajectories may be submitted now (never negative)."""
        with self._lock:
            return self._capacity_locked()

    def _capacity_locked(self) -> int:
        return staleness_rule.admissible(self.max_concurrent, self._running, self._accepted, self.bound())

    @property
    def version(self) -> int:
        return self._version

    @property
    def running(self) -> int:
        return self._running

    @property
    def accepted(self) -> int:
        return self._accepted

    # ------------------------------------------------------------------ transitions
    def on_submit(self, n: int = 1) -> None:
        """n trajectories start generating. Exceeding the staleness bound is a bug: it raises.

        `max_concurrent` is a throughput limit that `capacity()` honours; it is not enforced
        here so that a resume can re-register the trajectories already trained (see `restore`).
        """
        self._check_n(n, "on_submit")
        with self._lock:
            if self._accepted + self._running + n > self.bound():
                raise RuntimeError(
                    f"staleness bound exceeded: submitting {n} with accepted={self._accepted}, "
                    f"running={self._running}, bound (eta+v+1)*B={self.bound()} at version {self._version}"
                )
            self._running += n

    def on_accept(self, n: int = 1) -> None:
        """n running trajectories finished and were kept (they will be trained)."""
        self._finish(n, accepted=True)

    def on_reject(self, n: int = 1) -> None:
        """n running trajectories finished but were dropped: their slots are free again."""
        self._finish(n, accepted=False)

    def set_max_concurrent(self, n: int) -> None:
        """A new concurrency limit (the autopilot's): a higher one lets waiting submissions go now."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"StalenessGate: max_concurrent must be an integer >= 1, got {n!r}")
        with self._lock:
            self.max_concurrent = n
        self._notify()

    def set_version(self, version: int) -> None:
        """The trainer published weights of `version`: capacity grows by B per version."""
        with self._lock:
            if version < self._version:
                raise ValueError(f"version went backwards: {self._version} -> {version}")
            self._version = version
        self._notify()

    def restore(self, version: int, accepted: int) -> None:
        """Resume: `accepted` trajectories were already generated (and trained) before."""
        with self._lock:
            if self._running or self._accepted:
                raise RuntimeError("restore() must be called on a fresh gate")
            self._version = version
            self._accepted = accepted
        self._notify()

    def _finish(self, n: int, accepted: bool) -> None:
        self._check_n(n, "on_accept" if accepted else "on_reject")
        with self._lock:
            if n > self._running:
                raise RuntimeError(f"{n} trajectories finished but only {self._running} were running")
            self._running -= n
            if accepted:
                self._accepted += n
        self._notify()

    # ------------------------------------------------------------------ waiting
    def _max_admissible(self) -> int:
        return min(self.max_concurrent, staleness_rule.staleness_bound(self.max_staleness, 0, self.batch_size))

    async def wait_for_capacity(self, n: int = 1) -> None:
        """Wait (without blocking the event loop) until `n` trajectories can be submitted.

        It only waits: call `on_submit(n)` right after, with no await in between, in the same
        coroutine (a single event loop then cannot oversubscribe).
        """
        self._check_wait(n)
        loop = asyncio.get_running_loop()
        while True:
            event = asyncio.Event()
            with self._lock:
                if self._capacity_locked() >= n:
                    return
                self._async_waiters.append((loop, event))
            try:
                await event.wait()
            finally:
                with self._lock:
                    if (loop, event) in self._async_waiters:
                        self._async_waiters.remove((loop, event))

    def _notify(self) -> None:
        with self._lock:
            waiters, self._async_waiters = self._async_waiters, []
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop has closed: nobody is waiting any more
                pass

    def _check_wait(self, n: int) -> None:
        self._check_n(n, "wait_for_capacity")
        if n > self._max_admissible():
            raise ValueError(
                f"waiting for {n} slots can never succeed: at most min(max_concurrent={self.max_concurrent}, "
                f"(max_staleness+1)*batch_size={(self.max_staleness + 1) * self.batch_size}) run at once"
            )

    @staticmethod
    def _check_n(n: int, what: str) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{what}: n must be a non-negative integer, got {n!r}")


def version_range(
    versions: torch.Tensor, loss_mask: torch.Tensor, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, the oldest and the newest policy version among its generated tokens
    (int64; -1 and -1 for a sequence without generated tokens)."""
    mask = torch.as_tensor(loss_mask).bool()
    n = cu_seqlens.numel() - 1
    if versions.numel() != mask.numel() or mask.numel() != int(cu_seqlens[-1]):
        raise ValueError(
            f"version_range: versions ({versions.numel()}) and loss_mask ({mask.numel()}) must have "
            f"cu_seqlens[-1] = {int(cu_seqlens[-1])} entries"
        )
    seq = token_seq_ids(cu_seqlens, mask.numel())[mask]
    vers = versions[mask].to(torch.int64)
    big = torch.iinfo(torch.int64).max
    vmin = torch.full((n,), big, dtype=torch.int64).scatter_reduce(0, seq, vers, "amin")
    vmax = torch.full((n,), -1, dtype=torch.int64).scatter_reduce(0, seq, vers, "amax")
    return torch.where(vmin == big, -1, vmin), vmax
