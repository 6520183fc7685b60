"""Where the embedded engine's time goes, as trace spans: per request, weight swaps, busy steps.

Why per request and not per token: a run serves thousands of requests and millions of
tokens; a request's life has a handful of phases, so recording costs a few clock reads and
tuple appends per request, none per decode step. The spans are built when the request
finishes and go into the server's `SpanRecorder` (the controller pulls them with
`/get_spans` into the run's trace).

Spans of one request (track "requests", category "request", every one with args.rid), nested
in a parent:

    request       submit -> finish   {rid, prompt_tokens, output_tokens, finish_reason,
                                      interruptions, version_first, version_last}
      queued      submit -> its (first) prefill starts
      prefill     its prompt's forward           {prefill_tokens}
      decode      first token -> finish or interruption   {output_tokens: made in this stretch}
      interrupted weights swapped under it -> its re-prefill starts   {version_before, version_after}
      resumed     the re-prefill of prompt + tokens so far with the new weights   {prefill_tokens, version}
      decode      ...
      paused      (inside whichever phase) the engine was paused (pause() .. resume())
      finished    a zero-length mark at the end    {finish_reason, prompt_tokens, output_tokens}

Engine-wide spans (track "weights"): `weight_swap` (generation held at a step boundary while
the weights are copied in: {version_before, version_after, interrupted, waited_s}) and
`paused` (cat "pause": pause() .. resume()).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import Any

REQUEST_TRACK = "requests"
ENGINE_TRACK = "weights"
_PAUSES_KEPT = 4096  # engine pause intervals remembered for requests still in flight
_BUSY_GAP_S = 0.002  # steps closer than this count as one busy interval
_BUSY_KEEP = 100_000  # busy intervals kept when nobody collects them


class BusyIntervals:
    """When the engine computed: its steps as perf_counter (start, end) intervals, back-to-back
    steps merged into one (a few per batch). The server ships them as "engine" compute spans."""

    def __init__(self) -> None:
        self.enabled = True  # off with tracing: nobody would collect them
        self._intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def note(self, start: float, end: float) -> None:
        if not self.enabled:
            return
        with self._lock:
            busy = self._intervals
            if busy and start - busy[-1][1] < _BUSY_GAP_S:
                busy[-1] = (busy[-1][0], end)
            else:
                busy.append((start, end))
                if len(busy) > _BUSY_KEEP:
                    del busy[: len(busy) - _BUSY_KEEP]

    def take(self) -> list[tuple[float, float]]:
        with self._lock:
            out, self._intervals = self._intervals, []
        return out


STEP_COLUMNS = ("t_us", "dur_us", "kind", "rows", "tokens", "ctx", "width", "out")  # one engine forward each
STEP_PREFILL, STEP_DECODE, STEP_VERIFY = 0, 1, 2
StepRow = tuple[float, float, int, int, int, int, int, int]  # perf_counter start and end, then STEP_COLUMNS[2:]
_STEPS_KEEP = 500_000  # forwards kept when nobody collects them


class StepLog:
    """Every forward the engine ran: a prefill chunk, a decode step or a verifying step
    (speculative decoding), when, for how long, and how big (rows = sequences in the forward;
    tokens = real tokens computed, for a verifying step every fed token: each row's last token
    and its proposal; ctx = prefill: padded tokens, decode and verify: context tokens attended
    over all rows; width = the padded attention window; out = tokens the step emitted: one per
    row of a decode step, one per request a prefill samples for, the accepted ones plus one per
    row of a verifying step).

    Why every step and not a histogram: the cost model (perfmodel/costs.py) fits step time against
    batch and context, and separates steps that ran while the trainer computed from those that
    did not, which needs each step's time. A row is eight numbers (~40 bytes in the trace)."""

    def __init__(self) -> None:
        self.enabled = True
        self._rows: list[StepRow] = []

    def note(self, start: float, end: float, kind: int, rows: int, tokens: int, ctx: int, width: int, out: int) -> None:
        if self.enabled:
            self._rows.append((start, end, kind, rows, tokens, ctx, width, out))  # atomic under the GIL
            if len(self._rows) > _STEPS_KEEP:
                del self._rows[: len(self._rows) - _STEPS_KEEP]

    def take(self) -> list[StepRow]:
        out, self._rows = self._rows, []
        return out


def step_span_args(rows: Sequence[StepRow]) -> tuple[float, float, dict[str, Any]]:
    """(start, end, args) of the one `engine_steps` span that carries `rows` (times relative to its start, in µs)."""
    t0 = rows[0][0]
    data = [[round((r[0] - t0) * 1e6), round((r[1] - r[0]) * 1e6), *r[2:]] for r in rows]
    return t0, rows[-1][1], {"columns": list(STEP_COLUMNS), "steps": data}


MAX_PENDING_TAGS = 4096  # labels waiting for their request (a client that tags and never sends)


class RequestTimeline:
    """One request's phases so far: the closed ones, and the phase it is in since when."""

    __slots__ = ("submitted", "phase", "since", "since_tokens", "args", "closed", "interruptions", "tags")

    def __init__(self, now: float, tags: dict[str, int] | None = None) -> None:
        self.tags = tags or {}  # group, episode, turn (request_tags.py), on every span of the request
        self.submitted = now
        self.phase = "queued"
        self.since = now
        self.since_tokens = 0
        self.args: dict[str, Any] | None = None
        self.closed: list[tuple[str, float, float, dict[str, Any] | None]] = []
        self.interruptions = 0

    def enter(self, phase: str, now: float, tokens_so_far: int, args: dict[str, Any] | None = None) -> None:
        """Close the current phase at `now` and start `phase`."""
        self.close(now, tokens_so_far)
        self.phase, self.since, self.since_tokens, self.args = phase, now, tokens_so_far, args

    def close(self, now: float, tokens_so_far: int) -> None:
        args = self.args
        if self.phase == "decode":
            args = dict(args or {}, output_tokens=tokens_so_far - self.since_tokens)
        self.closed.append((self.phase, self.since, now, args))


class EngineSpans:
    """The engine's hooks for request and weight-swap spans (see module docstring).

    Called from the engine with its locks held; every hook is O(requests it names).
    """

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self._pauses: list[tuple[float, float]] = []  # ended engine pauses, oldest first (the last few thousand)
        self._paused_since: float | None = None
        self._tags: dict[str, dict[str, int]] = {}  # rid -> labels, until the request is submitted

    def tag(self, rid: str, tags: dict[str, int]) -> None:
        """Labels for the next request `rid` (bounded: a tag whose request never comes is dropped)."""
        if len(self._tags) >= MAX_PENDING_TAGS:
            self._tags.pop(next(iter(self._tags)))
        self._tags[rid] = dict(tags)

    # ------------------------------------------------------------------ request hooks
    def submitted(self, req: Any) -> None:
        req.timeline = RequestTimeline(time.perf_counter(), self._tags.pop(req.rid, None))

    def prefill_started(self, reqs: Sequence[Any], now: float) -> None:
        for r in reqs:
            tl = r.timeline
            if tl is None:
                continue
            n = len(r.output_ids)
            if tl.phase == "interrupted":
                tl.enter("resumed", now, n, {"prefill_tokens": len(r.prompt) + n, "version": tl.args["version_after"]})
            else:
                tl.enter("prefill", now, n, {"prefill_tokens": len(r.prompt) + n})

    def prefill_done(self, reqs: Sequence[Any], now: float) -> None:
        """The prefill's token is sampled: requests still running decode from `now`."""
        for r in reqs:
            if r.timeline is not None and r.finish_reason is None:
                r.timeline.enter("decode", now, len(r.output_ids))

    def interrupted(self, reqs: Sequence[Any], now: float, version_before: int, version_after: int) -> None:
        """The weights changed under `reqs` (their KV cache is dropped; they re-prefill next)."""
        for r in reqs:
            tl = r.timeline
            if tl is None or not r.output_ids:
                continue  # nothing computed with the old weights yet: not an interruption
            if tl.phase == "interrupted":  # a second swap before it resumed
                tl.args = dict(tl.args, version_after=version_after)
                continue
            tl.interruptions += 1
            tl.enter(
                "interrupted",
                now,
                len(r.output_ids),
                {"version_before": version_before, "version_after": version_after},
            )

    def finished(self, req: Any, now: float | None = None, reason: str | None = None) -> None:
        """Build and record every span of `req` (its timeline is dropped)."""
        tl = req.timeline
        if tl is None:
            return
        req.timeline = None
        now = time.perf_counter() if now is None else now
        out = len(req.output_ids)
        tl.close(now, out)
        reason = reason or req.finish_reason or "abort"
        rec = self.recorder
        tags = tl.tags
        rec.record(
            "request",
            tl.submitted,
            now,
            cat="request",
            node=REQUEST_TRACK,
            rid=req.rid,
            prompt_tokens=len(req.prompt),
            output_tokens=out,
            finish_reason=reason,
            interruptions=tl.interruptions,
            version_first=req.versions[0] if req.versions else None,
            version_last=req.versions[-1] if req.versions else None,
            **tags,
        )
        rid = req.rid
        pauses = self._pauses_within(tl.submitted, now, now)  # usually none
        for name, start, end, args in tl.closed:
            rec.record(name, start, end, cat="request", node=REQUEST_TRACK, rid=rid, **(args or {}), **tags)
            for a, b in pauses:
                a, b = max(a, start), min(b, end)  # the pause as this phase saw it
                if b > a:
                    rec.record("paused", a, b, cat="request", node=REQUEST_TRACK, rid=rid)
        rec.record(
            "finished",
            now,
            now,
            cat="request",
            node=REQUEST_TRACK,
            rid=rid,
            finish_reason=reason,
            prompt_tokens=len(req.prompt),
            output_tokens=out,
            **tags,
        )

    # ------------------------------------------------------------------ engine-wide hooks
    def paused(self, now: float) -> None:
        if self._paused_since is None:
            self._paused_since = now

    def resumed(self, now: float) -> None:
        if self._paused_since is not None:
            self._pauses.append((self._paused_since, now))
            if len(self._pauses) > 2 * _PAUSES_KEPT:
                del self._pauses[:-_PAUSES_KEPT]
            self.recorder.record("paused", self._paused_since, now, cat="pause", node=ENGINE_TRACK)
            self._paused_since = None

    def weight_swap(
        self, requested: float, start: float, end: float, version_before: int, version_after: int, interrupted: int
    ) -> None:
        self.recorder.record(
            "weight_swap",
            start,
            end,
            cat="weights",
            node=ENGINE_TRACK,
            version_before=version_before,
            version_after=version_after,
            interrupted=interrupted,
            waited_s=round(start - requested, 6),
        )

    def _pauses_within(self, start: float, end: float, now: float) -> list[tuple[float, float]]:
        """Engine pauses clipped to [start, end] (a request's life), the one still open included."""
        out = []
        pauses = self._pauses
        for a, b in pauses[max(bisect.bisect_left(pauses, (start,)) - 1, 0) :]:  # pauses never overlap
            if a >= end:
                break
            a, b = max(a, start), min(b, end)
            if b > a:
                out.append((a, b))
        if self._paused_since is not None and self._paused_since < end:
            out.append((max(self._paused_since, start), min(now, end)))
        return out
