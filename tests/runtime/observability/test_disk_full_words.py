"""Recognising a full disk wherever the write happened, and saying it with the path and the room."""

from __future__ import annotations

import errno
import os

from areal_graph.runtime.observability.disk_full import checkpoint_need, disk_full_message, free_bytes, is_disk_full
from areal_graph.runtime.rpc.worker_client import WorkerError


def test_a_full_disk_is_recognised_by_errno_in_a_cause_and_in_a_remote_error():
    assert is_disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x"))
    assert is_disk_full(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    remote = WorkerError(
        "model-actor",
        "ModelHost",
        "save_checkpoint",
        "Traceback ...\nsafetensors_rust.SafetensorError: Error while serializing: I/O error: "
        "No space left on device (os error 28)",
    )
    assert is_disk_full(remote)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("unexpected pos 704 vs 598"))
    assert not is_disk_full(None)


def test_the_message_names_the_write_the_path_the_room_and_how_to_go_on(tmp_path):
    msg = disk_full_message(
        "checkpoint step_00000006", tmp_path / "checkpoints" / "step_00000006", tmp_path, need_bytes=3 << 20
    )
    assert msg.startswith(f"the disk is full: checkpoint step_00000006 could not be written to {tmp_path}")
    assert "MB free on that filesystem, about 3.0 MB needed" in msg
    assert msg.endswith(f"continue with `areal-graph run --resume {tmp_path}`")
    assert free_bytes(tmp_path / "not" / "there") == free_bytes(tmp_path)  # the nearest existing parent
    assert "run again" in disk_full_message("metrics", tmp_path / "m", tmp_path, resumable=False)


def test_the_room_a_checkpoint_needs_is_the_size_of_the_newest_complete_one(tmp_path):
    assert checkpoint_need(tmp_path) is None
    old, new, partial = (tmp_path / "checkpoints" / n for n in ("step_2", "step_4", "step_6"))
    for d, size in ((old, 100), (new, 5000), (partial, 7)):
        d.mkdir(parents=True)
        (d / "w.bin").write_bytes(b"x" * size)
    (old / "COMPLETE").write_text("{}")
    os.utime(old, (1, 1))
    (new / "COMPLETE").write_text("{}")
    assert checkpoint_need(tmp_path) == 5000 + 2
