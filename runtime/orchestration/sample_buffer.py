"""The buffer between generation and training: finished prompt groups wait here for the trainer.

Why a buffer of its own: generation finishes prompt groups in any order, while the trainer
takes exactly the groups that are due, in the order they were submitted (the controller's
`_next_batch` says why: that order is what makes the staleness bound exact). The buffer keeps
each prompt group whole (group-normalised advantages need all answers of a prompt in one
batch), refuses batches whose keys differ from what it holds (they could not be trained
together), and counts everything that entered and left, so that what a stopped run never
trained is reported (`stats()`, the run's end_state.json), never silently lost.

Thread-safe: `put` is called from the generation side, `take_groups` from the trainer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from areal_graph.data.packed import PackedBatch


@dataclass(frozen=True)
class BufferStats:
    put_trajectories: int
    put_groups: int
    taken_trajectories: int
    taken_batches: int
    buffered_trajectories: int
    buffered_groups: int

    def balanced(self) -> bool:
        """Every trajectory that entered was taken or is still buffered."""
        return self.put_trajectories == self.taken_trajectories + self.buffered_trajectories


class SampleBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[int, PackedBatch] = {}
        self._keys: tuple[frozenset, frozenset, frozenset] | None = None
        self._put_trajs = self._put_groups = 0
        self._taken_trajs = self._taken_batches = 0
        self._buffered = 0

    def put(self, batch: PackedBatch) -> None:
        """Add finished trajectories, split into whole prompt groups by the per-sequence key
        `group_id` (which every batch must carry; a group id may be put once)."""
        if batch.num_seqs == 0:
            return
        if "group_id" not in batch.seqs:
            raise ValueError("SampleBuffer.put: the batch has no per-sequence `group_id`: groups could not be taken")
        keys = (frozenset(batch.tokens), frozenset(batch.seqs), frozenset(batch.meta))
        pieces = _split_groups(batch)
        with self._lock:
            if self._keys is None:
                self._keys = keys
            elif keys != self._keys:
                raise ValueError(
                    "SampleBuffer.put: this batch carries different keys from the buffered ones "
                    f"(missing {sorted(set().union(*self._keys) - set().union(*keys))}, "
                    f"extra {sorted(set().union(*keys) - set().union(*self._keys))}): they could not be batched together"
                )
            again = [gid for gid, _ in pieces if gid in self._groups]
            if again:
                raise ValueError(f"SampleBuffer.put: group {again[0]} is already buffered")
            for gid, piece in pieces:
                self._groups[gid] = piece
                self._put_groups += 1
                self._put_trajs += piece.num_seqs
                self._buffered += piece.num_seqs

    def take_groups(self, group_ids: list[int]) -> PackedBatch | None:
        """Take exactly the groups `group_ids` (in that order) if all are buffered, else take
        nothing and return None."""
        with self._lock:
            if not group_ids or any(gid not in self._groups for gid in group_ids):
                return None
            chosen = [self._groups.pop(gid) for gid in group_ids]
            n = sum(g.num_seqs for g in chosen)
            self._buffered -= n
            self._taken_trajs += n
            self._taken_batches += 1
        return PackedBatch.concat(chosen)

    def size(self) -> int:
        """Trajectories currently buffered."""
        with self._lock:
            return self._buffered

    def __len__(self) -> int:
        return self.size()

    def stats(self) -> BufferStats:
        with self._lock:
            return BufferStats(
                self._put_trajs,
                self._put_groups,
                self._taken_trajs,
                self._taken_batches,
                self._buffered,
                len(self._groups),
            )


def _split_groups(batch: PackedBatch) -> list[tuple[int, PackedBatch]]:
    gids = [int(g) for g in batch.seqs["group_id"].tolist()]
    if len(set(gids)) == 1:
        return [(gids[0], batch)]
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(gids):
        rows.setdefault(g, []).append(i)
    return [(g, batch.select(idx)) for g, idx in rows.items()]
