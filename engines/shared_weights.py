"""Weights through shared memory: the trainer writes them into a file in RAM, inference servers copy them out.

Why: for the models that run on one machine, serialising weights (disk, HTTP bodies, gRPC)
costs far more than the copy itself. Here the trainer's process copies each tensor into
one file-backed buffer (in /dev/shm) that stays mapped between syncs, and returns a small
manifest (name, dtype, shape, byte offset); a server maps the same file and loads views of
it straight into its model. One memcpy on each side, no pickling, nothing on the wire but
the manifest.

Consistency: the controller publishes, then tells the servers to load, then trains again,
and it publishes into the one of two files that the version servers were last given does
not occupy (runtime/orchestration/weight_sync.py: SharedMemorySync), so a file is never
written while a server reads it, a server restarted in the middle of a sync included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

_ALIGN = 64  # byte alignment of each tensor in the file

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


class _Mapping:
    """A file of `nbytes` mapped as a uint8 tensor, reused while its size holds."""

    def __init__(self, path: str, nbytes: int, create: bool) -> None:
        if create:
            with open(path, "wb") as f:
                f.truncate(nbytes)
        elif os.path.getsize(path) < nbytes:
            raise ValueError(
                f"shared weights file {path} holds {os.path.getsize(path)} bytes, the manifest needs {nbytes}"
            )
        self.path, self.nbytes = path, nbytes
        self.buf = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


_writers: dict[str, _Mapping] = {}
_readers: dict[str, _Mapping] = {}


def publish(path: str, state: Mapping[str, torch.Tensor]) -> list[dict]:
    """Copy `state` into the shared file at `path` (created or grown as needed); return the manifest."""
    manifest: list[dict] = []
    todo: list = []
    seen: dict[tuple, dict] = {}
    offset = 0
    for name, t in state.items():
        if t.dtype not in _DTYPES.values():
            raise TypeError(f"weight {name!r} has dtype {t.dtype}, which shared weights do not carry")
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        if key in seen:  # a tied weight: one copy, two names
            manifest.append({**seen[key], "name": name})
            continue
        nbytes = t.numel() * t.element_size()
        entry = seen[key] = {
            "name": name,
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "offset": offset,
            "nbytes": nbytes,
        }
        manifest.append(entry)
        todo.append((entry, t))
        offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    m = _writers.get(path)
    if m is None or m.nbytes < offset:
        m = _writers[path] = _Mapping(path, max(offset, 1), create=True)
    for entry, t in todo:
        m.buf[entry["offset"] : entry["offset"] + entry["nbytes"]].view(t.dtype).copy_(t.detach().reshape(-1))
    return manifest


def read(path: str, manifest: list[dict]) -> dict[str, torch.Tensor]:
    """Views (no copies) of the weights in the shared file; valid until the next publish."""
    end = max((int(e["offset"]) + int(e["nbytes"]) for e in manifest), default=1)
    m = _readers.get(path)
    if m is None or m.nbytes < end or not Path(path).exists():
        m = _readers[path] = _Mapping(path, end, create=False)
    out = {}
    for e in manifest:
        dtype = _DTYPES.get(e["dtype"])
        if dtype is None:
            raise ValueError(f"manifest entry {e['name']!r}: unknown dtype {e['dtype']!r}")
        raw = m.buf[int(e["offset"]) : int(e["offset"]) + int(e["nbytes"])]
        out[e["name"]] = raw.view(dtype).view(tuple(e["shape"]))
    return out
