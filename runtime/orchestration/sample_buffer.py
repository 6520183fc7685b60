"""The buffer between generation and training: finished trajectories wait here for the trainer.

Why a buffer of its own: generation finishes prompt groups in any order while the trainer
wants B trajectories at a time. The buffer keeps each prompt group whole (group-normalised
advantages need all answers of a prompt in one batch), hands out the *oldest* groups first
(by the oldest policy version among their generated tokens, then arrival order), so staleness
stays as low as the gate allows, and counts everything that entered and left so that nothing
is dropped silently (`stats()`, `drain()`).

Thread-safe: `put` is called from the generation side, `get` / `get_async` / `take_groups`
from the trainer; a cancelled `get_async` takes nothing. (The controller takes named groups,
in submission order: see `take_groups`.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass

import torch

from areal_graph.data.packed import PackedBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BufferedGroup:
    """One prompt group (or one group-less piece) waiting to be trained."""

    batch: PackedBatch
    group_id: int | None
    min_version: int  # oldest policy version among generated tokens (-1: unknown)
    max_version: int
    arrival: int  # order of arrival, breaks version ties (FIFO)

    @property
    def num_seqs(self) -> int:
        return self.batch.num_seqs

    def sort_key(self) -> tuple[int, int]:
        return (self.min_version, self.arrival)


@dataclass(frozen=True)
class BufferStats:
    put_trajectories: int
    put_groups: int
    taken_trajectories: int
    taken_batches: int
    drained_trajectories: int
    buffered_trajectories: int
    buffered_groups: int

    def balanced(self) -> bool:
        """Every trajectory that entered was taken, drained, or is still buffered."""
        return self.put_trajectories == self.taken_trajectories + self.drained_trajectories + self.buffered_trajectories


class SampleBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._groups: list[BufferedGroup] = []
        self._keys: tuple[frozenset, frozenset, frozenset] | None = None
        self._arrivals = itertools.count()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._put_trajs = self._put_groups = 0
        self._taken_trajs = self._taken_batches = self._drained_trajs = 0
        self._buffered = 0

    # ------------------------------------------------------------------ in
    def put(self, batch: PackedBatch) -> None:
        """Add finished trajectories. A batch holding several groups (per-sequence key
        `group_id`) is split into whole groups; without `group_id` the batch is one unit."""
        keys = (frozenset(batch.tokens), frozenset(batch.seqs), frozenset(batch.meta))
        pieces = _split_groups(batch)
        with self._cond:
            if self._keys is None:
                self._keys = keys
            elif keys != self._keys:
                raise ValueError(
                    "SampleBuffer.put: this batch carries different keys from the buffered ones "
                    f"(missing {sorted(set().union(*self._keys) - set().union(*keys))}, "
                    f"extra {sorted(set().union(*keys) - set().union(*self._keys))}): they could not be batched together"
                )
            for gid, piece in pieces:
                vmin, vmax = _version_range(piece)
                self._groups.append(BufferedGroup(piece, gid, vmin, vmax, next(self._arrivals)))
                self._put_groups += 1
                self._put_trajs += piece.num_seqs
                self._buffered += piece.num_seqs
            self._cond.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the waiting loop has closed
                pass

    # ------------------------------------------------------------------ out
    def get(self, batch_size: int, timeout: float | None = None, group_size: int | None = None) -> PackedBatch:
        """Block until `batch_size` trajectories in whole groups can be taken; take the oldest.

        Raises TimeoutError after `timeout` seconds (nothing is taken then)."""
        _check_request(batch_size, group_size)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                picked = self._pick_locked(batch_size)
                if picked is not None:
                    return self._take_locked(picked)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"SampleBuffer.get: {batch_size} trajectories not available within {timeout}s "
                        f"({self._buffered} buffered in {len(self._groups)} groups)"
                    )
                self._cond.wait(remaining)

    async def get_async(self, batch_size: int, group_size: int | None = None, timeout: float | None = None) -> PackedBatch:
        """`get` for an event loop: waits without blocking it; cancelling takes nothing."""
        _check_request(batch_size, group_size)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            event = asyncio.Event()
            with self._lock:
                picked = self._pick_locked(batch_size)
                if picked is not None:
                    return self._take_locked(picked)
                self._async_waiters.append((loop, event))
            try:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"SampleBuffer.get_async: {batch_size} trajectories not available within {timeout}s")
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError as exc:
                raise TimeoutError(
                    f"SampleBuffer.get_async: {batch_size} trajectories not available within {timeout}s"
                ) from exc
            finally:
                with self._lock:
                    if (loop, event) in self._async_waiters:
                        self._async_waiters.remove((loop, event))

    def take_groups(self, group_ids: list[int]) -> PackedBatch | None:
        """Take exactly the groups `group_ids` (in that order) if all are buffered, else take
        nothing and return None. The controller trains groups in submission order this way,
        which is what makes its staleness bound exact (controller.py, `_next_batch`)."""
        with self._lock:
            where = {g.group_id: i for i, g in enumerate(self._groups)}
            if any(gid not in where for gid in group_ids):
                return None
            return self._take_locked([where[gid] for gid in group_ids])

    def drain(self) -> PackedBatch | None:
        """Take everything left (e.g. at the end of a run, for the report); None if empty."""
        with self._lock:
            groups = sorted(self._groups, key=BufferedGroup.sort_key)
            self._groups = []
            n = sum(g.num_seqs for g in groups)
            self._drained_trajs += n
            self._buffered -= n
        if not groups:
            return None
        log.info("sample buffer drained: %d trajectories in %d groups were never trained", n, len(groups))
        return PackedBatch.concat([g.batch for g in groups])

    # ------------------------------------------------------------------ accounting
    def size(self) -> int:
        """Trajectories currently buffered."""
        with self._lock:
            return self._buffered

    def __len__(self) -> int:
        return self.size()

    def num_groups(self) -> int:
        with self._lock:
            return len(self._groups)

    def oldest_version(self) -> int | None:
        with self._lock:
            return min((g.min_version for g in self._groups), default=None)

    def stats(self) -> BufferStats:
        with self._lock:
            return BufferStats(self._put_trajs, self._put_groups, self._taken_trajs, self._taken_batches,
                               self._drained_trajs, self._buffered, len(self._groups))

    # ------------------------------------------------------------------ internals
    def _pick_locked(self, batch_size: int) -> list[int] | None:
        """Oldest-first groups summing to exactly batch_size; a group that would overshoot is
        skipped (a younger, smaller one may fit). None when no exact batch is possible yet."""
        if self._buffered < batch_size:
            return None
        too_big = [g for g in self._groups if g.num_seqs > batch_size]
        if too_big:
            raise ValueError(
                f"SampleBuffer: group {too_big[0].group_id} has {too_big[0].num_seqs} trajectories, more than "
                f"the batch size {batch_size}: groups are never split"
            )
        order = sorted(range(len(self._groups)), key=lambda i: self._groups[i].sort_key())
        picked, total = [], 0
        for i in order:
            n = self._groups[i].num_seqs
            if total + n <= batch_size:
                picked.append(i)
                total += n
                if total == batch_size:
                    return picked
        return None

    def _take_locked(self, picked: list[int]) -> PackedBatch:
        chosen = [self._groups[i] for i in picked]  # already oldest first
        keep = set(picked)
        self._groups = [g for i, g in enumerate(self._groups) if i not in keep]
        n = sum(g.num_seqs for g in chosen)
        self._buffered -= n
        self._taken_trajs += n
        self._taken_batches += 1
        return PackedBatch.concat([g.batch for g in chosen])


def _check_request(batch_size: int, group_size: int | None) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"SampleBuffer.get: batch_size must be a positive integer, got {batch_size!r}")
    if group_size is not None and (group_size < 1 or batch_size % group_size):
        raise ValueError(f"SampleBuffer.get: batch_size {batch_size} is not a multiple of group_size {group_size}")


def _split_groups(batch: PackedBatch) -> list[tuple[int | None, PackedBatch]]:
    if "group_id" not in batch.seqs or batch.num_seqs == 0:
        return [(None, batch)] if batch.num_seqs else []
    gids = batch.seqs["group_id"].tolist()
    if len(set(gids)) == 1:
        return [(int(gids[0]), batch)]
    order: dict[int, list[int]] = {}
    for i, g in enumerate(gids):
        order.setdefault(int(g), []).append(i)
    return [(g, batch.select(idx)) for g, idx in order.items()]


def _version_range(batch: PackedBatch) -> tuple[int, int]:
    if "versions" in batch.tokens:
        v = batch.tokens["versions"].to(torch.int64)
        if "loss_mask" in batch.tokens:
            v = v[batch.tokens["loss_mask"].bool()]
        v = v[v >= 0]
        if v.numel():
            return int(v.min()), int(v.max())
    if "version" in batch.seqs and batch.num_seqs:
        v = batch.seqs["version"].to(torch.int64)
        return int(v.min()), int(v.max())
    return -1, -1
