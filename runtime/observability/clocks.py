"""Aligning the clocks of the run's processes, so their spans line up in one trace.

Every process stamps its spans with its own wall clock. On one host that is the same clock;
processes on other hosts (Ray, SLURM) can be off by milliseconds to seconds, which would
draw a worker's forward before the call that caused it. So when the controller connects to
a process it estimates that process's clock offset the way NTP does: it reads its own clock
(t0), asks the process for its clock (r), reads its clock again (t1), and takes

    offset = r - (t0 + t1) / 2        known to within +- (t1 - t0) / 2

keeping the probe with the shortest round trip of a few. An offset no larger than its own
uncertainty cannot be told from zero and is not applied (the same-host case: applying a
noisy estimate there would only add error). Spans from a process are shifted by its offset
(`align_spans`) before the controller's Tracer merges them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

PROBES = 5


@dataclass(frozen=True)
class ClockEstimate:
    """A process's clock minus ours, from the probe with the shortest round trip."""

    offset_s: float
    rtt_s: float

    @property
    def uncertainty_s(self) -> float:
        return self.rtt_s / 2

    @property
    def correction_s(self) -> float:
        """What to subtract from that process's timestamps: the offset when it is measurable, else 0."""
        return self.offset_s if abs(self.offset_s) > self.uncertainty_s else 0.0


def _best(samples: list[tuple[float, float, float]]) -> ClockEstimate:
    t0, remote, t1 = min(samples, key=lambda s: s[2] - s[0])
    return ClockEstimate(offset_s=remote - (t0 + t1) / 2, rtt_s=t1 - t0)


def estimate_offset(
    probe: Callable[[], float], probes: int = PROBES, clock: Callable[[], float] = time.time
) -> ClockEstimate:
    """Offset of the clock `probe()` reads (a remote process's, in seconds) against `clock`."""
    if probes < 1:
        raise ValueError(f"probes must be >= 1, got {probes}")
    samples = []
    for _ in range(probes):
        t0 = clock()
        remote = float(probe())
        samples.append((t0, remote, clock()))
    return _best(samples)


def span_source(span: Mapping[str, Any]) -> str | None:
    """The process that recorded a span dict: `process` (SpanRecorder.take) or `worker` (worker_server)."""
    return span.get("process") or span.get("worker")


def align_spans(spans: Iterable[dict[str, Any]], corrections: Mapping[str, float]) -> list[dict[str, Any]]:
    """Spans with start/end moved to our clock: each minus its recording process's correction."""
    out = []
    for s in spans:
        c = corrections.get(span_source(s) or "", 0.0)
        out.append(dict(s, start=float(s["start"]) - c, end=float(s["end"]) - c) if c else s)
    return out


class ProcessClocks:
    """The clock corrections of a run's processes, by process name (what spans name as their source)."""

    def __init__(self) -> None:
        self.estimates: dict[str, ClockEstimate] = {}

    def set(self, name: str, estimate: ClockEstimate) -> None:
        self.estimates[name] = estimate
        level = logging.INFO if estimate.correction_s else logging.DEBUG
        log.log(
            level,
            "clock of %s: offset %+.3f ms (+- %.3f ms)%s",
            name,
            estimate.offset_s * 1e3,
            estimate.uncertainty_s * 1e3,
            ", applied to its spans" if estimate.correction_s else "",
        )

    def probe(self, name: str, read_remote_clock: Callable[[], float], probes: int = PROBES) -> None:
        """Measure `name`'s offset with a synchronous probe; a failing probe is logged, never raised
        (a trace drawn a little off is no reason to stop a run)."""
        try:
            self.set(name, estimate_offset(read_remote_clock, probes))
        except Exception as err:  # noqa: BLE001 - see docstring
            log.warning("could not measure the clock of %s (%s); its spans are not shifted", name, err)

    def corrections(self) -> dict[str, float]:
        return {n: e.correction_s for n, e in self.estimates.items() if e.correction_s}

    def align(self, spans: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return align_spans(spans, self.corrections())
