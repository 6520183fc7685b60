"""The online autopilot (`runtime.autopilot: true`): max concurrent rollouts adjusted during a run.

Why concurrency and why from idle shares: it is the one knob that moves the balance between
the two sides without touching the algorithm (the staleness bound stays the user's): more
rollouts in flight fill the engine's decode batch (more tokens per step, fewer steps waiting
for a straggler), fewer keep less in flight at each weight update (less to prefill again, less
staleness) and leave the cores to the trainer. Which way helps shows in the trainer's idle
share: a trainer that waits for generation wants more, one that never waits while trajectories
pile up in the buffer wants fewer.

The rule, every `window` steps: measure the trainer's idle share (time waiting for a batch over
the steps' wall time) and the trajectories trained per second. Idle above `raise_above`: one
more prompt group in flight, up to what the staleness bound allows ((eta + 1) B). Idle below
`lower_below` with a full batch already buffered at the step's start: one group fewer, down to
`floor`. A change after which throughput fell by more than `tolerance` is undone, and that
direction rests for `rest` windows (a hill climb that does not oscillate).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AutopilotDecision:
    step: int
    before: int
    after: int
    why: str


@dataclass
class ConcurrencyAutopilot:
    """See module docstring. `observe` is called once per training step."""

    batch_size: int
    group_size: int
    max_staleness: int
    start: int
    engine_rows: int = 1 << 30  # requests the inference servers decode at once (more would only queue)
    window: int = 5
    raise_above: float = 0.15
    lower_below: float = 0.03
    tolerance: float = 0.05
    rest: int = 4
    limit: int = 0
    decisions: list[AutopilotDecision] = field(default_factory=list)
    _wait: float = 0.0
    _wall: float = 0.0
    _trained: int = 0
    _full_buffer: int = 0
    _steps: int = 0
    _last: tuple[int, float, int] | None = None  # (limit before the last change, its throughput, direction)
    _resting: dict[int, int] = field(default_factory=dict)  # direction -> windows left to rest

    def __post_init__(self) -> None:
        self.limit = self.start

    @property
    def ceiling(self) -> int:
        """What the staleness bound lets run at once ((eta + 1) B) and the servers decode at once, in
        whole prompt groups (never below the limit the run started with)."""
        cap = min((self.max_staleness + 1) * self.batch_size, self.engine_rows)
        return max(cap // self.group_size * self.group_size, self.group_size, self.start)

    @property
    def floor(self) -> int:
        return self.group_size

    def observe(self, step: int, wait_s: float, step_s: float, trained: int, buffered_at_start: int) -> int | None:
        """One step's numbers; the new limit when it changes, else None."""
        self._wait += max(wait_s, 0.0)
        self._wall += max(wait_s, 0.0) + max(step_s, 0.0)
        self._trained += trained
        self._full_buffer += int(buffered_at_start >= self.batch_size)
        self._steps += 1
        if self._steps < self.window or self._wall <= 0:
            return None
        idle, rate = self._wait / self._wall, self._trained / self._wall
        full = self._full_buffer / self._steps
        self._wait = self._wall = 0.0
        self._trained = self._full_buffer = self._steps = 0
        for d in list(self._resting):
            self._resting[d] -= 1
            if self._resting[d] <= 0:
                del self._resting[d]
        if self._last is not None:
            before, before_rate, direction = self._last
            self._last = None
            if rate < before_rate * (1 - self.tolerance):  # that change made it slower: undo it, rest that way
                self._resting[direction] = self.rest
                return self._set(
                    step, before, f"throughput fell {before_rate:.1f} -> {rate:.1f} trajectories/s: undone"
                )
        if idle > self.raise_above and self.limit < self.ceiling and +1 not in self._resting:
            self._last = (self.limit, rate, +1)
            return self._set(
                step,
                min(self.limit + self.group_size, self.ceiling),
                f"the trainer waited {idle:.0%} of the time for generation",
            )
        if idle < self.lower_below and full >= 0.5 and self.limit > self.floor and -1 not in self._resting:
            self._last = (self.limit, rate, -1)
            return self._set(
                step,
                max(self.limit - self.group_size, self.floor),
                f"the trainer waited {idle:.0%} of the time and a batch was already buffered at {full:.0%} of steps",
            )
        return None

    def _set(self, step: int, limit: int, why: str) -> int | None:
        if limit == self.limit:
            return None
        self.decisions.append(AutopilotDecision(step, self.limit, limit, why))
        self.limit = limit
        return limit
