"""naming_the_file (api/full_disk.py): a full disk inside the block comes out as an OSError that
names the file, whichever way the writer said it; every other error passes through untouched."""

from __future__ import annotations

import errno

import pytest

from areal_graph.api.full_disk import naming_the_file


def test_a_write_error_without_a_file_gets_the_file():
    with pytest.raises(OSError) as info, naming_the_file("/run/metrics.jsonl"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, "/run/metrics.jsonl")
    assert str(info.value) == "[Errno 28] No space left on device: '/run/metrics.jsonl'"
    assert info.value.__cause__ is not None  # the original is kept


def test_an_error_that_says_so_in_words_becomes_enospc_or_edquot_naming_the_file():
    class SafetensorError(Exception):
        pass

    with pytest.raises(OSError) as info, naming_the_file("/run/weights/v000003"):
        raise SafetensorError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, "/run/weights/v000003")
    with pytest.raises(OSError) as info, naming_the_file("/q"):
        raise RuntimeError("write failed: Disk quota exceeded")
    assert (info.value.errno, info.value.filename) == (errno.EDQUOT, "/q")


def test_a_named_file_and_other_errors_pass_through():
    with pytest.raises(OSError) as info, naming_the_file("/run/metrics.jsonl"):
        raise OSError(errno.ENOSPC, "No space left on device", "/elsewhere/file")
    assert info.value.filename == "/elsewhere/file"
    with pytest.raises(PermissionError) as denied, naming_the_file("/run/x"):
        raise PermissionError(errno.EACCES, "Permission denied")
    assert denied.value.filename is None
    with pytest.raises(ValueError, match="not a disk"), naming_the_file("/run/x"):
        raise ValueError("not a disk problem")
