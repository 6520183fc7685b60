"""The sample ledger: one line per event in the life of every prompt group (`ledger.jsonl`).

Why: "nothing lost, nothing trained twice" has to be checkable after the fact, across
crashes and resumes. Every group the controller submits is recorded once generated (or
dropped by a filter, or failed past its retries), once trained, and, when a resume puts its
prompt back in the queue because the checkpoint was taken before it was trained, requeued.
A "checkpoint" line is written at the moment a checkpoint's controller state is taken; a
"resumed" line names the checkpoint a run went on from, and every event between that
checkpoint's line and the resume is superseded (that work was redone). `reconcile` applies
this rule and says what was trained, how often, and what is unaccounted for.
Lines are appended and flushed one by one, so a crash loses at most the line being written.

    {"event": "generated" | "trained" | "dropped" | "failed" | "requeued" | "checkpoint" | "resumed",
     "group": GID, "pos": POSITION_IN_PROMPT_STREAM, "prompt": PROMPT_ID,
     "step": STEP, "version": POLICY_VERSION, "time": UNIX_TIME}
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_graph.api.full_disk import naming_the_file

EVENTS = ("generated", "trained", "dropped", "failed", "requeued", "checkpoint", "resumed")


class SampleLedger:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8") if self.path is not None else None
        if self._file is not None and _ends_mid_line(self.path):  # cut by a crash or a full disk:
            self._file.write("\n")  # the next event starts a line of its own, not glued to the cut one
            self._file.flush()

    def record(self, event: str, group: int, pos: int, prompt: Any, step: int, version: int) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown ledger event {event!r}; one of {EVENTS}")
        if self._file is None:
            return
        line = json.dumps(
            {
                "event": event,
                "group": group,
                "pos": pos,
                "prompt": str(prompt),
                "step": step,
                "version": version,
                "time": round(time.time(), 3),
            }
        )
        with self._lock, naming_the_file(self.path or "ledger.jsonl"):
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_mid_line(path: Path | None) -> bool:
    if path is None or not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a ledger file (a line cut off by a crash is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def effective_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events that stand after every resume: those between a checkpoint and a resume from it are cut.

    A ledger from before "checkpoint" lines existed falls back to the step numbers (events of
    steps after the checkpoint's step are cut).
    """
    kept: list[dict[str, Any]] = []
    for e in events:
        if e["event"] != "resumed":
            kept.append(e)
            continue
        marks = [i for i, k in enumerate(kept) if k["event"] == "checkpoint" and k["prompt"] == e["prompt"]]
        if marks:
            kept = kept[: marks[-1] + 1]
        else:
            kept = [k for k in kept if k["step"] <= e["step"] or k["event"] in ("checkpoint", "resumed")]
        kept.append(e)
    return kept


@dataclass(frozen=True)
class LedgerAccount:
    """What the ledger says happened to every prompt-stream position, after resumes."""

    trained: Counter  # position -> times trained (1 is right)
    dropped: frozenset[int]
    failed: frozenset[int]
    resumes: int
    trained_steps: tuple[int, ...]  # the step of every "trained" event, in order

    @property
    def trained_twice(self) -> list[int]:
        return sorted(p for p, n in self.trained.items() if n > 1)

    def unaccounted(self) -> list[int]:
        """Positions below the highest trained one that were neither trained, dropped nor failed.

        Groups are trained in submission order, so a gap is a group lost on the way.
        """
        top = max(self.trained, default=-1)
        settled = set(self.trained) | self.dropped | self.failed
        return [p for p in range(top + 1) if p not in settled]


def reconcile(events: list[dict[str, Any]]) -> LedgerAccount:
    stand = effective_events(events)
    return LedgerAccount(
        trained=Counter(e["pos"] for e in stand if e["event"] == "trained"),
        dropped=frozenset(e["pos"] for e in stand if e["event"] == "dropped"),
        failed=frozenset(e["pos"] for e in stand if e["event"] == "failed"),
        resumes=sum(e["event"] == "resumed" for e in events),
        trained_steps=tuple(e["step"] for e in stand if e["event"] == "trained"),
    )
