"""Read back what a W&B offline run wrote: the records of its run-<id>.wandb file.

Why our own walk of the file: wandb 0.31 writes the file from its Go service (wandb-core) and
no longer ships the Python reader (`wandb.sdk.internal.datastore`). The file is a LevelDB log
(a 7-byte header ':W&B', magic 0xBEE1, version 0, then 32 KiB blocks of checksummed chunks);
each record is wandb's own protobuf, `wandb.proto.wandb_internal_pb2.Record`, parsed here with
wandb's generated class. The CRC of every chunk is checked, so a format change fails loudly.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
CHUNK_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, hex(magic), version)
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if (crc, length, kind) == (0, 0, 0):  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"{path}: bad checksum at byte {pos}"
        pos += CHUNK_HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


@dataclass
class OfflineRun:
    """What a .wandb file says: the run's name and project, its config (JSON-decoded values),
    its history rows by step, and its summary (last value of each key)."""

    name: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_offline_run(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    out = OfflineRun()
    for raw in raw_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.name, out.project = record.run.display_name, record.run.project
            out.config.update({_key(u): json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            out.config.update({_key(u): json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            out.history.setdefault(record.history.step.num, {}).update(row)
        elif kind == "summary":
            out.summary.update({_key(u): json.loads(u.value_json) for u in record.summary.update})
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    return out
