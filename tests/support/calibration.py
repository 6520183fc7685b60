"""The recorded calibration run (tests/fixtures/calibration_run: 12 steps of ppo_async.yaml on a
2-core machine, trace and metrics gzipped) unpacked into a run directory for a test."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from support.paths import REPO

FIXTURE = REPO / "tests" / "fixtures" / "calibration_run"


def unpack_calibration_run(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE / "config.yaml", dest / "config.yaml")
    for name in ("trace.json", "metrics.jsonl"):
        (dest / name).write_bytes(gzip.decompress((FIXTURE / f"{name}.gz").read_bytes()))
    return dest
