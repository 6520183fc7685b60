"""The autopilot's search: which placement, max staleness, concurrency and micro-batch budget
the simulator predicts to finish a workflow's steps soonest on this machine.

Why a search over the simulator and not a rule: what is best depends on the workload (a long
tail of answers rewards concurrency; short answers reward less staleness), on the machine
(cores, what shares them) and on the costs, which the calibration run measured; the simulator
combines them, and `areal-graph tune --verify` checks its pick against a real run.

The search, coarse then fine: every combination of placement, max staleness (0 up to the
workflow's own, never above unless asked), max concurrent rollouts and, when the calibration
measured what speculation would have accepted (its shadow counts), speculative decoding on and
off (asked for: `search_speculative`) is simulated once; the best dozen are simulated again over several length draws; the best
few then try other micro-batch budgets. Every candidate is a list of KEY=VALUE overrides of the
workflow as given.

Why speculation is searched with the rest and not after: it pays where few rows decode at once
(a step of a few rows is per-call overhead, so feeding proposals is nearly free), which is
where low concurrency or a long tail leave the engine, so the best concurrency with it on can
differ from the best with it off.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_graph.perfmodel.cost_model import CostModel, SidePlacement
from areal_graph.perfmodel.simulator import SimConfig, simulate
from areal_graph.perfmodel.speculation import NO_ACCEPTANCE, CannotPriceSpeculation

BUDGETS = (1024, 2048, 4096, 8192)


@dataclass
class Candidate:
    """One configuration: how to get it (overrides) and what the simulator predicts for it."""

    overrides: list[str]
    cfg: SimConfig
    window_s: float = 0.0
    staleness: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return " ".join(self.overrides) or "(the workflow as given)"


@dataclass
class TuneResult:
    given: Candidate
    ranked: list[Candidate]
    simulated: int
    # speculative decoding was searched (on and off); else `speculation_note` says why not
    speculation_searched: bool = False
    speculation_note: str = ""


# Why the speculation search is asked for (`tune --search-speculative`), not done by default: on
# the 2-core machine it was validated on, the simulator prices a verifying step 14-40% under what
# it takes inside a run (docs/speculative_decoding.md). The whole runs came out within 14%, but a
# choice between on and off rests on exactly that price, and the measured runs were as fast or
# slower with speculation on at 64 running and 16 in flight. A default search would recommend a
# guess to everyone.
NOT_ASKED = (
    "speculative decoding not searched (ask with --search-speculative; its verifying steps are priced "
    "14-40% under what they take in a run)"
)


def speculation_options(base: SimConfig, costs: CostModel, asked: bool = False) -> list[bool]:
    """Speculative decoding's settings to try: on and off when `asked` and the calibration measured
    what it would have accepted, else only the workflow's own (which must be priceable)."""
    if base.speculative and costs.speculation is None:
        raise CannotPriceSpeculation(NO_ACCEPTANCE)
    if asked and costs.speculation is not None:
        return [base.speculative, not base.speculative]
    return [base.speculative]


def placements(cores: Sequence[int]) -> list[tuple[str, list[str], dict[str, SidePlacement | None]]]:
    """(label, overrides, sides) of the placements worth trying on these cores: everything shared
    (the default), and the inference servers on a share of the cores with training on the rest,
    the other processes beside either side or wherever the OS puts them."""
    cores = list(cores)
    out: list[tuple[str, list[str], dict[str, SidePlacement | None]]] = [("shared", [], {})]
    n = len(cores)
    if n < 2:
        return out
    splits = sorted({max(1, n // 4), max(1, n // 2), max(1, (3 * n) // 4)} - {n})
    for k in splits:
        inf, train = cores[:k], cores[k:]
        for other_label, other in (("with inference", inf), ("with training", train), ("unpinned", None)):
            ov = [f"resources.inference.cores={_list(inf)}", f"resources.training.cores={_list(train)}"]
            if other is not None:
                ov.append(f"resources.other.cores={_list(other)}")
            out.append(
                (
                    f"inference {_list(inf)}, training {_list(train)}, other {other_label}",
                    ov,
                    {
                        "inference": SidePlacement(inf, 0),
                        "training": SidePlacement(train, 0),
                        "other": SidePlacement(other, 1) if other is not None else None,
                    },
                )
            )
    return out


def _list(cores: Sequence[int]) -> str:
    return "[" + ",".join(map(str, cores)) + "]"


def concurrency_options(cfg: SimConfig, eta: int) -> list[int]:
    """Max concurrent rollouts worth trying: whole groups, from half a batch to what eta allows."""
    B, G = cfg.batch_size, cfg.group_size
    cap = (eta + 1) * B
    options = {max(G, (B // 2) // G * G), B, (3 * B // 2) // G * G, 2 * B, 3 * B, 4 * B, cap, cfg.max_concurrent}
    return sorted(c for c in options if G <= c <= cap)


def search(
    base: SimConfig,
    costs: CostModel,
    max_staleness: int,
    top: int = 5,
    seeds: int = 3,
    progress: Callable[[int, int], None] | None = None,
    search_speculative: bool = False,
) -> TuneResult:
    """Rank configurations of `base` (see module docstring); `max_staleness` bounds eta;
    `search_speculative`: try speculative decoding on and off too (NOT_ASKED says why it is asked for)."""

    def run(cfg: SimConfig, k: int, passes: int) -> tuple[float, float, dict[str, float], list[str]]:
        results = [simulate(dataclasses.replace(cfg, seed=cfg.seed + j), costs, passes=passes) for j in range(k)]
        return (
            statistics.fmean(r.steps_window_s for r in results),
            statistics.fmean(r.staleness_mean for r in results),
            {p: statistics.fmean(r.busy[p] for r in results) for p in results[0].busy},
            results[0].notes,
        )

    speculative = speculation_options(base, costs, search_speculative)
    grid: list[Candidate] = []
    for _label, pin_overrides, sides in placements(base.machine_cores):
        for eta in range(0, max_staleness + 1):
            for conc in concurrency_options(base, eta):
                for spec in speculative:
                    cfg = dataclasses.replace(
                        base,
                        max_staleness=eta,
                        max_concurrent=conc,
                        max_running=max(base.max_running, conc),
                        speculative=spec,
                        **_sides(base, sides),
                    )
                    ov = list(pin_overrides)
                    if eta != base.max_staleness:
                        ov.append(f"runtime.max_staleness={eta}")
                    if conc != base.max_concurrent:
                        ov.append(f"runtime.max_concurrent_rollouts={conc}")
                    if cfg.max_running != base.max_running:
                        ov.append(f"inference.max_running_requests={cfg.max_running}")
                    if spec != base.speculative:
                        ov.append(f"inference.speculative.enabled={str(spec).lower()}")
                    grid.append(Candidate(ov, cfg))
    total = len(grid) + min(12, len(grid)) + min(top, len(grid)) * len(BUDGETS) + 1
    done = 0
    for cand in grid:
        cand.window_s, cand.staleness, cand.busy, cand.notes = run(cand.cfg, 1, 1)
        done += 1
        if progress:
            progress(done, total)
    finalists = sorted(grid, key=lambda c: c.window_s)[:12]
    for cand in finalists:
        cand.window_s, cand.staleness, cand.busy, cand.notes = run(cand.cfg, seeds, 2)
        done += 1
        if progress:
            progress(done, total)
    best = sorted(finalists, key=lambda c: c.window_s)[:top]
    more: list[Candidate] = []
    for cand in best:
        for budget in BUDGETS:
            if budget == cand.cfg.max_tokens_per_microbatch:
                continue
            cfg = dataclasses.replace(cand.cfg, max_tokens_per_microbatch=budget)
            other = Candidate([*cand.overrides, f"runtime.max_tokens_per_microbatch={budget}"], cfg)
            other.window_s, other.staleness, other.busy, other.notes = run(cfg, seeds, 2)
            if other.window_s < cand.window_s * (1 - 1e-6):  # a budget that changes nothing is not worth saying
                more.append(other)
            done += 1
            if progress:
                progress(done, total)
    given = Candidate([], base)
    given.window_s, given.staleness, given.busy, given.notes = run(base, seeds, 2)
    ranked = sorted(best + more, key=lambda c: (c.window_s, len(c.overrides)))
    searched = len(speculative) > 1
    return TuneResult(
        given,
        ranked[:top],
        len(grid) + len(finalists) * seeds + top * len(BUDGETS) * seeds + seeds,
        searched,
        ""
        if searched
        else (NOT_ASKED if not search_speculative else "speculative decoding not searched: " + NO_ACCEPTANCE),
    )


def _sides(base: SimConfig, sides: dict[str, SidePlacement | None]) -> dict[str, Any]:
    """The SimConfig fields for a placement: threads follow the cores (the engine keeps its own count)."""
    if not sides:
        return {}
    out: dict[str, Any] = {}
    for name in ("inference", "training", "other"):
        side = sides.get(name)
        if side is None:
            out[name] = SidePlacement(None, getattr(base, name).threads)
            continue
        threads = getattr(base, name).threads if name == "inference" else max(len(side.cores or ()), 1)
        if name == "inference":
            threads = min(threads, len(side.cores or ())) or 1
        if name == "other":
            threads = 1
        out[name] = SidePlacement(list(side.cores or ()), threads)
    return out
