"""A digest of a model's weights from a few values of each tensor, cheap enough to take after every load.

Why: a server told to load version v can end up holding something else (a file rewritten
while it read, a load that half happened) and still say v; nothing downstream would notice,
since every token it generates would carry v and log-probs of other weights. After a load
the server reports a digest of what it holds (`EmbeddedEngine.weights_digest`), and the
executor compares it with the digest of what was published for v, read from the published
file itself (runtime/orchestration/server_weights.py).

What is hashed: for each tensor, by name, its name, its shape and `SAMPLES` values at fixed
positions spread over it (the first and the last included, so a copy that stopped part-way
shows), cast to the dtype the server holds its weights in (a trainer publishing float32 to a
bfloat16 server: both sides round the same values the same way). Sampling reads a few
hundred bytes per tensor wherever the weights are (a tensor, a shared-memory file, a
safetensors file), whatever the model's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

SAMPLES = 16  # values hashed per tensor
DIGEST_BYTES = 16

# A tensor's name -> (its shape, its sampled values as a 1-D CPU tensor of its own dtype)
Samples = dict[str, tuple[tuple[int, ...], torch.Tensor]]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def dtype_named(name: str) -> torch.dtype:
    """torch's dtype for 'float32', 'bfloat16', ... (what a server reports); a ValueError otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown weights dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def positions(numel: int, k: int = SAMPLES) -> list[int]:
    """`k` positions spread evenly over `numel` elements, the first and the last included (all of them when fewer)."""
    if numel <= k:
        return list(range(numel))
    return [(i * (numel - 1)) // (k - 1) for i in range(k)]


def sample_tensors(state: Mapping[str, torch.Tensor]) -> Samples:
    """The sampled values of each tensor of `state` (copied: valid after the tensors change)."""
    out: Samples = {}
    for name, t in state.items():
        flat = t.detach().reshape(-1)
        idx = torch.tensor(positions(flat.numel()), dtype=torch.long, device=flat.device)
        out[name] = (tuple(t.shape), flat.index_select(0, idx).cpu())
    return out


def _sample_file(
    fd: int, offset: int, dtype: torch.dtype, shape: Iterable[int]
) -> tuple[tuple[int, ...], torch.Tensor]:
    """The sampled values of one tensor lying at `offset` in the open file `fd` (one small read each)."""
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    size = dtype.itemsize
    raw = bytearray(b"".join(os.pread(fd, size, offset + p * size) for p in positions(numel)))
    return shape, (torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype))


def sample_shared_file(path: str | Path, manifest: list[dict]) -> Samples:
    """The sampled values of every tensor a shared-weights manifest (engines/shared_weights.py) describes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return {e["name"]: _sample_file(fd, int(e["offset"]), dtype_named(e["dtype"]), e["shape"]) for e in manifest}
    finally:
        os.close(fd)


def sample_safetensors(directory: str | Path) -> Samples:
    """The sampled values of every tensor in the directory's *.safetensors files (read from the
    files' headers and a few bytes each: the weights are not loaded)."""
    out: Samples = {}
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {directory}")
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            (header_len,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header = json.loads(os.pread(fd, header_len, 8))
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                dtype = _SAFETENSORS_DTYPES.get(meta["dtype"])
                if dtype is None:
                    raise ValueError(
                        f"{path}: tensor {name!r} has dtype {meta['dtype']}, which weights digests do not read"
                    )
                out[name] = _sample_file(fd, 8 + header_len + int(meta["data_offsets"][0]), dtype, meta["shape"])
        finally:
            os.close(fd)
    return out


def digest(samples: Samples, dtype: torch.dtype) -> str:
    """The digest of sampled weights as a server holding them in `dtype` would have them."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(dtype_name(dtype).encode())
    for name in sorted(samples):
        shape, values = samples[name]
        h.update(f"\0{name}\0{list(shape)}\0".encode())
        h.update(values.to(dtype).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
