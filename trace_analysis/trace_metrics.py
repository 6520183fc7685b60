"""What a run's metrics (and span args) say beside the timeline: staleness of what was trained,
micro-batch packing, and the learning curve.

Why separate from trace_stats: these come from `metrics.jsonl` first and from the trace only
when it carries them, and each answer names its source, because the sources differ in what
they can say. The controller logs staleness per *step* (the mean and max over the B
trajectories trained); a per-trajectory histogram needs per-sample values, which only span
args can carry (`staleness` on a span, or versions on both ends of a flow from a trajectory's
generation to the step that trained it). When the better source is absent, the answer says so.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from areal_graph.runtime.observability.flows import FLOW_NAME
from areal_graph.trace_analysis.trace_model import Timeline

STALENESS_MEAN, STALENESS_MAX = "staleness/mean", "staleness/max"
TOKENS, MICROBATCHES = "train/tokens", "train/n_microbatches"
ACCURACY, REWARD = "eval/accuracy", "reward/mean"
STEP_MEAN_BIN = 0.5  # histogram bin width for per-step mean staleness (per-trajectory values are integers)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def staleness_histogram(tl: Timeline | None, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """{"source", "unit", "counts": {staleness: n}, "mean", "max", "note"}; counts empty when nothing records it."""
    per_sample = _from_span_args(tl) if tl is not None else []
    source, unit = "span args 'staleness'", "trajectories"
    if not per_sample and tl is not None:
        per_sample, source = (
            _from_flows(tl),
            "flow arrows (policy version at the consuming span minus at the producing one)",
        )
        unit = "prompt groups" if {f.name for f in tl.flows} == {FLOW_NAME} else "flows"
    if per_sample:
        note = (
            None
            if unit == "trajectories"
            else ("one count per arrow: the version its generation was called with to the version that trained it")
        )
        return _histogram(per_sample, source, unit, note)
    step_means = [v for m in metrics if (v := _number(m.get(STALENESS_MEAN))) is not None]
    if step_means:
        maxes = [v for m in metrics if (v := _number(m.get(STALENESS_MAX))) is not None]
        out = _histogram(
            [math.floor(v / STEP_MEAN_BIN) * STEP_MEAN_BIN for v in step_means],
            f"metrics.jsonl '{STALENESS_MEAN}'",
            "steps",
            f"per-step means of the trajectories trained, in bins of {STEP_MEAN_BIN}; per-trajectory "
            "values are not recorded (neither span args nor flows with versions on both ends)",
        )
        out["mean"] = statistics.fmean(step_means)
        out["max"] = max(maxes) if maxes else out["max"]
        return out
    return {
        "source": None,
        "unit": None,
        "counts": {},
        "mean": None,
        "max": None,
        "note": "no staleness recorded: metrics.jsonl lacks 'staleness/mean' and no span carries it",
    }


def _histogram(values: list[float], source: str, unit: str, note: str | None) -> dict[str, Any]:
    counts = Counter(values)
    return {
        "source": source,
        "unit": unit,
        "counts": {k: counts[k] for k in sorted(counts)},
        "mean": statistics.fmean(values),
        "max": max(values),
        "note": note,
    }


def _from_span_args(tl: Timeline) -> list[float]:
    out: list[float] = []
    for s in tl.spans:
        v = s["args"].get("staleness")
        if isinstance(v, list):
            out.extend(x for x in map(_number, v) if x is not None)
        elif (x := _number(v)) is not None:
            out.append(x)
    return out


def _from_flows(tl: Timeline) -> list[float]:
    """Staleness per flow whose first and last spans both carry a policy version."""
    out: list[float] = []
    for f in tl.flows:
        a, b = f.points[0].span, f.points[-1].span
        if a is None or b is None or a == b:
            continue
        va = _version(tl.spans[a]["args"], low=True)
        vb = _version(tl.spans[b]["args"], low=False)
        if va is not None and vb is not None:
            out.append(vb - va)
    return out


def _version(args: dict[str, Any], low: bool) -> float | None:
    for key in ("version_min", "version") if low else ("version",):
        if (v := _number(args.get(key))) is not None:
            return v
    versions = args.get("versions")
    if isinstance(versions, list) and versions:
        nums = [x for x in map(_number, versions) if x is not None]
        if nums:
            return min(nums) if low else max(nums)
    return None


def packing_efficiency(metrics: list[dict[str, Any]], budget: int | None, ranks: int = 1) -> dict[str, Any]:
    """How full the training micro-batches were: tokens / (micro-batches x budget), and how often the
    count met its lower bound ranks x ceil(tokens / (ranks x budget))."""
    rows = [
        (t, n)
        for m in metrics
        if (t := _number(m.get(TOKENS))) is not None and (n := _number(m.get(MICROBATCHES))) is not None and n > 0
    ]
    missing = []
    if not rows:
        missing.append(f"metrics.jsonl has no '{TOKENS}' and '{MICROBATCHES}'")
    if not budget:
        missing.append("the micro-batch token budget is unknown (no loadable config.yaml)")
    if missing or budget is None:
        return {"available": False, "missing": "; ".join(missing)}
    fills = [t / (n * budget) for t, n in rows]
    bounds = [ranks * math.ceil(t / (ranks * budget)) for t, _ in rows]
    at_bound = sum(1 for (t, n), lb in zip(rows, bounds) if n <= lb)
    return {
        "available": True,
        "steps": len(rows),
        "budget": budget,
        "ranks": ranks,
        "fill_median": statistics.median(fills),
        "fill_min": min(fills),
        "microbatches_median": statistics.median(n for _, n in rows),
        "at_lower_bound": at_bound,
        "extra_microbatches": sum(n - lb for (_, n), lb in zip(rows, bounds)),
        "note": "step averages: per-micro-batch token counts are not recorded",
    }


def learning_curve(metrics: Iterable[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) series for accuracy, reward and staleness, each where logged."""
    keys = {"accuracy": ACCURACY, "reward": REWARD, "staleness_mean": STALENESS_MEAN, "staleness_max": STALENESS_MAX}
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    for m in metrics:
        for name, key in keys.items():
            if (v := _number(m.get(key))) is not None:
                out[name].append((int(m["step"]), v))
    return out
