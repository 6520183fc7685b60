"""The sample ledger: one line per event in the life of every prompt group (`ledger.jsonl`).

Why: "nothing lost, nothing trained twice" has to be checkable after the fact, across
crashes and resumes. Every group the controller submits is recorded once generated (or
dropped by a filter, or failed past its retries), once trained, and, when a resume puts its
prompt back in the queue because the checkpoint was taken before it was trained, requeued
(after a "resumed" line naming the checkpoint; events of steps after that checkpoint, from
before the resume, are superseded: those steps ran again).
Lines are appended and flushed one by one, so a crash loses at most the line being written.

    {"event": "generated" | "trained" | "dropped" | "failed" | "requeued" | "resumed",
     "group": GID, "pos": POSITION_IN_PROMPT_STREAM, "prompt": PROMPT_ID,
     "step": STEP, "version": POLICY_VERSION, "time": UNIX_TIME}
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

EVENTS = ("generated", "trained", "dropped", "failed", "requeued", "resumed")


class SampleLedger:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8") if self.path is not None else None

    def record(self, event: str, group: int, pos: int, prompt: Any, step: int, version: int) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown ledger event {event!r}; one of {EVENTS}")
        if self._file is None:
            return
        line = json.dumps({"event": event, "group": group, "pos": pos, "prompt": str(prompt), "step": step,
                           "version": version, "time": round(time.time(), 3)})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a ledger file (a line cut off by a crash is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
