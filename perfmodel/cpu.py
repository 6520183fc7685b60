"""How much slower work runs when processes share cores: a fluid model of the CPU.

Why a model at all: on a small machine the inference engine, the trainer and the Python
processes around them (controller, rollout and reward workers, the servers' HTTP handling)
compete for the same few cores, and where each is placed (`resources`) decides who waits.
The cost model (costs.py) divides every measured time by the slowdown this module says it
ran under, so the fitted costs are what the work would take alone; the simulator multiplies
them back by the slowdown of the placement and moment it simulates.

The model, deliberately simple:
- a *job* is work that computes with `threads` threads on a set of cores (None: not pinned:
  the OS spreads it over every core); a *load* is background CPU demand (cores' worth, e.g.
  0.3) on a set of cores;
- pinned demand stays on its cores, each thread's share spread evenly over them; unpinned
  demand is poured onto the least loaded cores (the OS balances runnable threads);
- a core asked for more than it has (load L > 1) gives everyone on it 1/L of what they asked;
  a job's slowdown is its threads over the capacity it receives.

It ignores caches, memory bandwidth and SMT, and treats a job's threads as perfectly
parallel; the validation benchmark (benchmarks/bench_simulator.py) says how far that goes.

One effect the fluid model misses is added on top (`preemption`): the Python processes' work
comes in short bursts, and the OS runs a woken thread at once on whatever core it lands on,
so a compute job loses the light load that lands on its cores even when the machine has room
on average. Measured on the 2-core machine (shipped kit, 15 asynchronous runs at 8 to 64
requests running): the engine's decode steps ran 1.2-1.8x their time alone, and that times
(1 - light load / 2) stayed within 0.82-1.12, where the fluid model said 1.0 for all of them
(runs at 8 running measured later came out at 1.2-1.4: bench_simulator's worst miss).
Four synchronous runs came out at 0.69-0.90: their generation has the trainer's core free for
the bursts while the trainer waits, which this rule does not see (it over-prices them ~15%).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    """CPU asked for: `cores` worth of demand (a job: its threads) on `where` (None: anywhere)."""

    amount: float
    where: frozenset[int] | None = None


def core_loads(demands: Iterable[Demand], cores: Sequence[int]) -> dict[int, float]:
    """Per core, the demand placed on it (pinned first, then unpinned poured onto the least loaded)."""
    load = {c: 0.0 for c in cores}
    free = 0.0
    for d in demands:
        if d.amount <= 0:
            continue
        where = [c for c in (d.where or ()) if c in load]
        if d.where is None or not where:
            free += d.amount
            continue
        for c in where:
            load[c] += d.amount / len(where)
    return _pour(load, free)


def _pour(load: dict[int, float], amount: float) -> dict[int, float]:
    """Water-filling: raise the least loaded cores to a common level until `amount` is placed."""
    if amount <= 0 or not load:
        return load
    levels = sorted(load.values())
    n = len(levels)
    left = amount
    level = levels[0]
    for i in range(n):
        nxt = levels[i + 1] if i + 1 < n else float("inf")
        room = (nxt - level) * (i + 1)
        if left <= room:
            level += left / (i + 1)
            break
        left -= room
        level = nxt
    return {c: max(v, level) for c, v in load.items()}


def slowdown(job: Demand, others: Iterable[Demand], cores: Sequence[int]) -> float:
    """How many times longer `job` takes beside `others` than alone (>= 1)."""
    demands = [job, *others]
    load = core_loads(demands, cores)
    if job.where is None or not [c for c in job.where if c in load]:
        # unpinned: it runs wherever the OS finds room; the machine's average load is what it sees
        return max(1.0, sum(load.values()) / max(len(load), 1))
    where = [c for c in job.where if c in load]
    per_core = job.amount / len(where)
    received = sum(per_core / max(1.0, load[c]) for c in where)
    return max(1.0, job.amount / received) if received > 0 else float("inf")


def preemption(job: Demand, light: Iterable[Demand], cores: Sequence[int]) -> float:
    """How many times longer `job` takes because `light` (bursty background work) preempts it on
    its cores: 1 / (1 - the light load per core there), the load capped at 0.8 of a core."""
    load = core_loads([d for d in light if d.amount > 0], cores)
    if not load:
        return 1.0
    mine = [c for c in (job.where or ()) if c in load] or list(load)
    per_core = sum(load[c] for c in mine) / len(mine)
    return 1.0 / (1.0 - min(max(per_core, 0.0), 0.8))
