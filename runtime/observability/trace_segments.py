"""A trace bounded in size by design: full detail for the first steps, the last steps, and a sample between.

Why: a trace grows with the run (~76 KB per step for the main job), so a run of 100,000 steps
would write gigabytes that no viewer opens. The questions a trace answers are mostly about how
the run started (warm-up, first weight syncs), how it is going now (the last steps) and whether
anything changed on the way (a sample of the middle), so that is what is kept, within
`runtime.trace_max_mb`:

- the *head*: `trace.json`, written as always, until it holds a fifth of the budget;
- then *segments*: `trace_segments/seg-000001.json`, ... each a twentieth of the budget and each
  a complete Chrome trace of its own (it names every process and thread), so any one opens in
  Perfetto. The newest `TAIL_SEGMENTS` are kept, and of the older ones an evenly spaced sample
  of at most `SAMPLE_SEGMENTS`: when the sample would grow past that, every other one is
  deleted (the spacing doubles), so the kept middle stays evenly spread over the whole run.

What was dropped is said in the trace: `trace_segments/index.json` lists every segment ever
written (steps, time, spans, bytes) and whether it is kept, and readers
(trace_analysis/trace_read.py) turn the dropped ones into notes. Head + 4 + 8 segments = 0.8 of the budget; each file may run over
by one flush (the tracer flushes about a quarter of a segment at a time), which the rest covers.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SEGMENTS_DIRNAME = "trace_segments"
INDEX_FILENAME = "index.json"
HEAD_SHARE = 5  # the head is 1/HEAD_SHARE of the budget
SEGMENT_SHARE = 20  # a segment is 1/SEGMENT_SHARE of the budget
TAIL_SEGMENTS = 4  # the newest segments, always kept: the last steps in full
SAMPLE_SEGMENTS = 8  # at most this many older segments, evenly spaced


class TraceBudgetTooSmall(ValueError):
    """runtime.trace_max_mb cannot hold one step of this run's trace."""


@dataclass
class Segment:
    """One segment file's account (an entry of index.json)."""

    index: int
    file: str
    bytes: int = 0
    spans: int = 0
    first_step: int | None = None
    last_step: int | None = None
    start_us: float | None = None
    end_us: float | None = None
    kept: bool = True

    def add(self, n_bytes: int, spans: int, steps: tuple[int, int] | None, times: tuple[float, float] | None) -> None:
        self.bytes += n_bytes
        self.spans += spans
        if steps is not None:
            self.first_step = steps[0] if self.first_step is None else min(self.first_step, steps[0])
            self.last_step = steps[1] if self.last_step is None else max(self.last_step, steps[1])
        if times is not None:
            self.start_us = times[0] if self.start_us is None else min(self.start_us, times[0])
            self.end_us = times[1] if self.end_us is None else max(self.end_us, times[1])


def kept_segments(closed: int, tail: int = TAIL_SEGMENTS, sample: int = SAMPLE_SEGMENTS) -> set[int]:
    """Which of the closed segments 1..`closed` to keep: the newest `tail`, and of the older ones
    those whose index is a multiple of the smallest power of two that leaves at most `sample`.

    Pure, and monotone: a segment dropped for `closed` = n is dropped for every later n (the
    stride only grows), so a segment once deleted is never wanted back."""
    older = max(closed - tail, 0)
    stride = 1
    while older // stride > sample:
        stride *= 2
    return {i for i in range(1, older + 1) if i % stride == 0} | set(range(older + 1, closed + 1))


def segment_bytes(max_bytes: int) -> int:
    return max(max_bytes // SEGMENT_SHARE, 1)


def head_bytes(max_bytes: int) -> int:
    return max(max_bytes // HEAD_SHARE, 1)


class SegmentedTrace:
    """Where the tracer's flushes go when the trace has a size budget (see module docstring).

    The tracer formats; this decides the file. `target(body_so_far)` says which file the next
    flush appends to (the head, or the current segment); `wrote(...)` accounts a flush and,
    when the file is full, closes it: the next flush starts a new segment and the old ones
    the policy no longer keeps are deleted (and marked dropped in the index).
    """

    def __init__(self, head: Path, max_bytes: int) -> None:
        self.head = Path(head)
        self.max_bytes = int(max_bytes)
        self.dir = self.head.parent / SEGMENTS_DIRNAME
        self.segments: list[Segment] = []
        self.head_steps: set[int] = set()
        self.head_full = False
        self._current_full = False

    # ------------------------------------------------------------------ resume
    def resume(self) -> Path | None:
        """Carry on after a restart: the segments so far come from the index; returns the newest
        segment file (whose metadata names the processes), or None when only the head exists."""
        index = self.dir / INDEX_FILENAME
        if not index.is_file():
            return None
        data = json.loads(index.read_text(encoding="utf-8"))
        self.segments = [Segment(**s) for s in data.get("segments", [])]
        self.head_full = True
        self._current_full = True  # a resumed run starts a new segment
        kept = [s for s in self.segments if s.kept and (self.dir / s.file).is_file()]
        return self.dir / kept[-1].file if kept else None

    # ------------------------------------------------------------------ writing
    def target(self) -> tuple[Path, bool]:
        """(the file the next flush appends to, whether it is a new file)."""
        if not self.head_full:
            return self.head, False
        if not self.segments or self._current_full:
            index = self.segments[-1].index + 1 if self.segments else 1
            self.segments.append(Segment(index, f"seg-{index:06d}.json"))
            self._current_full = False
            self.dir.mkdir(parents=True, exist_ok=True)
            self.write_index()  # at once: a run killed now resumes after this segment, never over it
            return self.dir / self.segments[-1].file, True
        return self.dir / self.segments[-1].file, False

    def wrote(
        self,
        size_now: int,
        n_bytes: int,
        spans: int,
        steps: tuple[int, int] | None,
        step_marks: set[int],
        times: tuple[float, float] | None,
    ) -> None:
        """Account one flush of `n_bytes` into the target file, now `size_now` bytes long.

        `step_marks`: the steps whose whole-step span this flush wrote (how many steps a file holds)."""
        if not self.head_full:
            self.head_steps |= step_marks
            if size_now >= head_bytes(self.max_bytes):
                self._check_holds_a_step(size_now)
                self.head_full = True
            return
        seg = self.segments[-1]
        seg.add(n_bytes, spans, steps, times)
        if size_now >= segment_bytes(self.max_bytes):
            self._current_full = True
            self._retire()
            self.write_index()

    def _check_holds_a_step(self, size: int) -> None:
        """The budget must hold one step in a segment, or the segments would be slices of steps."""
        per_step = size / len(self.head_steps) if self.head_steps else float(size)
        if per_step > segment_bytes(self.max_bytes):
            need_mb = per_step * SEGMENT_SHARE / 2**20
            held = (
                f"~{per_step / 2**20:.2f} MB per step"
                if self.head_steps
                else f"{size / 2**20:.2f} MB before the first step ended"
            )
            raise TraceBudgetTooSmall(
                f"runtime.trace_max_mb: {self.max_bytes / 2**20:g} MB is too small to hold one step of this run's "
                f"trace ({held}; a segment is 1/{SEGMENT_SHARE} of the budget): set runtime.trace_max_mb to at "
                f"least {max(int(need_mb) + 1, 1)}, or null for no limit"
            )

    def _retire(self) -> None:
        """Delete the closed segments the policy no longer keeps; rewrite the index."""
        closed = len(self.segments)
        keep = kept_segments(closed)
        for pos, seg in enumerate(self.segments, start=1):
            if seg.kept and pos not in keep:
                seg.kept = False
                try:
                    (self.dir / seg.file).unlink()
                except FileNotFoundError:
                    pass
                log.debug(
                    "trace budget: dropped %s (steps %s-%s, %d bytes)",
                    seg.file,
                    seg.first_step,
                    seg.last_step,
                    seg.bytes,
                )

    def write_index(self) -> None:
        if not self.segments:
            return
        data = {
            "max_bytes": self.max_bytes,
            "head": self.head.name,
            "head_bytes": head_bytes(self.max_bytes),
            "segment_bytes": segment_bytes(self.max_bytes),
            "tail_segments": TAIL_SEGMENTS,
            "sample_segments": SAMPLE_SEGMENTS,
            "segments": [asdict(s) for s in self.segments],
        }
        tmp = self.dir / (INDEX_FILENAME + ".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, self.dir / INDEX_FILENAME)


def read_index(run_dir: Path) -> dict[str, Any] | None:
    """A run's segment index, or None (no budget, or it never filled its head)."""
    path = Path(run_dir) / SEGMENTS_DIRNAME / INDEX_FILENAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
