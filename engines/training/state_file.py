"""Writing a trainer's state file so that a full disk is an OSError(ENOSPC), not torch's riddle.

Why: `torch.save` on a filesystem that fills mid-write raises RuntimeError("[enforce fail at
inline_container.cc] unexpected pos 704 vs 598"), which names neither the disk nor the path;
the run's controller recognises a full disk by its errno (runtime/observability/disk_full.py).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch

_ROOM = 4 << 20  # a failed save with less than this left free is taken as the disk being full


def save_state(state: Any, path: str | os.PathLike) -> None:
    """torch.save(state, path); a failure on a (nearly) full filesystem is re-raised as ENOSPC."""
    path = Path(path)
    try:
        torch.save(state, path)
    except RuntimeError as err:
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            raise err from None
        if free >= _ROOM:
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
