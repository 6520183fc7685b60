"""How often a process that died may be started again: at most N restarts within any window of W seconds.

Why a rate and not a count: a count over the whole run (what `runtime.max_restarts` was) ends a
run of days on its fourth unrelated death (a server that dies once a day stops a week-long
run on day four), while a rate still stops a process that keeps dying at once: a crash
loop spends the window's restarts in seconds. `runtime.restart_window_s` is the window (null:
the whole run, the old count).

Why its own module: every restart of a run's processes goes through this one rule, whichever
launcher runs them (the executor asks it before it has the local or the Ray launcher start a
process again: runtime/orchestration/process_executor.py); it is pure (the clock is given),
so its behaviour over days is tested in microseconds.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartVerdict:
    """Whether the process may be restarted, and the words that say so."""

    allowed: bool
    recent: int  # restarts within the window, this one included when allowed
    total: int  # restarts over the run, this one included when allowed
    reason: str


class RestartBudget:
    """At most `max_restarts` restarts of each process within any `window_s` seconds (None: over
    the whole run); `clock` gives seconds (monotonic)."""

    def __init__(self, max_restarts: int, window_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if window_s is not None and window_s <= 0:
            raise ValueError(f"window_s must be > 0 (or None: the whole run), got {window_s}")
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.clock = clock
        self._times: dict[str, collections.deque[float]] = {}
        self.totals: dict[str, int] = {}  # process name -> restarts over the run

    def rule(self) -> str:
        """The rule in the workflow's words."""
        if self.window_s is None:
            return f"runtime.max_restarts is {self.max_restarts} over the whole run (runtime.restart_window_s is null)"
        return f"runtime.max_restarts is {self.max_restarts} within any runtime.restart_window_s of {self.window_s:g} s"

    def spend(self, name: str) -> RestartVerdict:
        """Process `name` died now: whether it may be restarted (and if so, the restart is counted)."""
        now = self.clock()
        times = self._times.setdefault(name, collections.deque())
        if self.window_s is not None:
            while times and times[0] <= now - self.window_s:
                times.popleft()
        total = self.totals.get(name, 0)
        if len(times) >= self.max_restarts:
            if self.max_restarts == 0:
                reason = "not restarted: runtime.max_restarts is 0"
            elif self.window_s is None:
                reason = f"not restarted again: restarted {total} times already; {self.rule()}"
            else:
                reason = (
                    f"not restarted again: it keeps dying, restarted {len(times)} times in the last "
                    f"{now - times[0]:.0f} s; {self.rule()}"
                )
            return RestartVerdict(False, len(times), total, reason)
        times.append(now)
        self.totals[name] = total + 1
        within = "over the run" if self.window_s is None else f"within {self.window_s:g} s"
        reason = f"restart {len(times)} of at most {self.max_restarts} {within}; {total + 1} over the run"
        return RestartVerdict(True, len(times), total + 1, reason)
