"""A full disk, said as such: which write failed, where, how much room there is and how much is needed.

Why its own module: a long run fills its disk sooner or later (checkpoints, the trace, weights
written for the servers), and the write that hits it can be in any process (a model worker
saving a checkpoint, the controller appending metrics, the tracer's flush thread). Each of
those would surface as a different exception, some as a remote traceback. The run stops at the
first one, as a `DiskFull` naming the path and the space, with the last complete checkpoint
untouched (a checkpoint is complete only once its marker is written, after everything else),
so that after space is freed `areal-graph run --resume RUN` goes on with nothing lost.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from areal_graph.runtime.observability.run_dir import RunDir

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_TEXTS = ("No space left on device", "Disk quota exceeded", "[Errno 28]", "[Errno 122]")


class DiskFull(OSError):
    """A write failed because the filesystem is full; the message says where and what to do."""


def is_disk_full(err: BaseException | None) -> bool:
    """True for ENOSPC/EDQUOT here, in its causes, or in a worker's remote error text."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            return True
        if isinstance(err, DiskFull):
            return True
        if any(t in str(err) for t in _TEXTS):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def dir_bytes(path: str | os.PathLike[str]) -> int:
    total = 0
    for root, _, files in os.walk(str(path)):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def disk_full_message(
    what: str,
    path: str | os.PathLike,
    run_dir: str | os.PathLike,
    need_bytes: int | None = None,
    resumable: bool = True,
) -> str:
    """The console's words for a full disk: the write, the path, the room left and the room needed."""
    free = free_bytes(path)
    text = f"the disk is full: {what} could not be written to {path} (No space left on device)"
    if free is not None:
        text += f"; {_mb(free)} free on that filesystem"
    if need_bytes:
        text += f", about {_mb(need_bytes)} needed"
    if resumable:
        text += (
            f". The last complete checkpoint is intact: free space, then continue with "
            f"`areal-graph run --resume {run_dir}`"
        )
    else:
        text += ". Free space and run again"
    return text


def checkpoint_need(run_dir: str | os.PathLike) -> int | None:
    """Room one more checkpoint needs: the size of the newest complete one (None before the first)."""
    done = RunDir(run_dir, tensorboard=False).checkpoints()
    return dir_bytes(done[-1][1]) if done else None
