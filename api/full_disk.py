"""A write that fails because the disk is full names the file it was writing.

Why: the OSError a `write()` raises on a full filesystem carries no file name ("[Errno 28] No
space left on device"), and neither do safetensors' and torch's errors; the run's controller,
which says a full disk as such (runtime/observability/disk_full.py), could then name only the
run folder. The writes of a run's files (metrics, the ledger, the run's JSON and YAML files,
weights exported for the servers) go through `naming_the_file(path)`, which raises such an
error again as OSError(ENOSPC, ..., path): its text, "[Errno 28] No space left on device:
'PATH'", names the file even where it crosses a process boundary as text (a model worker's
error reaches the controller as a message). Free of torch: the runtime and the training
engine both use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_TEXTS = ("No space left on device", "Disk quota exceeded")


@contextlib.contextmanager
def naming_the_file(path: str | os.PathLike[str]) -> Iterator[None]:
    """Run the block; a full disk inside it (an OSError without a file name, or another error
    whose text says so) comes out as OSError(ENOSPC or EDQUOT, its words, `path`)."""
    try:
        yield
    except OSError as err:
        if err.errno in NO_SPACE_ERRNOS and not err.filename:
            raise OSError(err.errno, os.strerror(err.errno), str(path)) from err
        raise
    except Exception as err:
        text = str(err)
        if any(t in text for t in NO_SPACE_TEXTS):
            code = errno.EDQUOT if "quota" in text else errno.ENOSPC
            raise OSError(code, os.strerror(code), str(path)) from err
        raise
