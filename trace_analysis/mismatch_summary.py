"""The train/inference mismatch of a run, from its metrics.jsonl: over the run and by token position.

Every policy train step logs `<node>/mismatch/<group>/<stat>` (nodes/off_policy.py
`mismatch_stats`): the gap |log pi_prox - log pi_behav| on the tokens trained, split into
fresh tokens (sampled by the very weights being trained: the gap is engine-vs-trainer
numerics alone) and stale ones (sampled by an older version: numerics plus policy change).
This module folds those per-step numbers into windows of the run and a by-position table,
which `areal-graph trace` prints; plain data, so the text and --json views agree.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

GROUPS = ("all", "fresh", "stale")
STATS = ("abs_mean", "abs_max", "k3", "share", "past_tis", "past_token_mask", "past_seq_mask", "past_icepop")
WINDOWS = 8
# fp32 log-probs of the same numbers computed in another order differ by about this much; a
# fresh-token gap this small is float rounding, not a different policy.
ROUNDING = 1e-5


def _node_prefix(metrics: list[dict[str, Any]]) -> str | None:
    for m in metrics:
        for k in m:
            if k.endswith("/mismatch/all/abs_mean"):
                return k[: -len("mismatch/all/abs_mean")]
    return None


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _fold(rows: list[dict[str, Any]], prefix: str) -> dict[str, dict[str, float | None]]:
    """Per group: the mean of each stat over the steps that had tokens in the group (the max of
    `abs_max`); `share` over all steps."""
    out: dict[str, dict[str, float | None]] = {}
    for g in GROUPS:
        key = f"{prefix}mismatch/{g}/".__add__
        had = [r for r in rows if g == "all" or (r.get(key("share")) or 0) > 0]
        cell: dict[str, float | None] = {}
        for s in STATS:
            vals = _finite([r.get(key(s)) for r in (rows if s == "share" else had)])
            cell[s] = (max(vals) if s == "abs_max" else statistics.fmean(vals)) if vals else None
        out[g] = cell
    return out


def mismatch_summary(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """{"node", "steps", "overall", "windows": [{"first", "last", ...groups}], "positions", "verdict", "note"}."""
    prefix = _node_prefix(metrics)
    if prefix is None:
        return {
            "node": None,
            "steps": 0,
            "overall": {},
            "windows": [],
            "positions": {},
            "verdict": None,
            "note": "no mismatch recorded: metrics.jsonl has no '<train node>/mismatch/...' keys "
            "(a run from before they were logged, or no policy train node)",
        }
    rows = [m for m in metrics if f"{prefix}mismatch/all/abs_mean" in m]
    size = max(1, math.ceil(len(rows) / WINDOWS))
    windows = []
    for i in range(0, len(rows), size):
        part = rows[i : i + size]
        windows.append({"first": part[0].get("step"), "last": part[-1].get("step"), **_fold(part, prefix)})
    positions: dict[str, float] = {}
    pos_prefix = f"{prefix}mismatch/pos/"
    for key in dict.fromkeys(k for r in rows for k in r if k.startswith(pos_prefix) and k.endswith("/abs_mean")):
        vals = _finite([r.get(key) for r in rows])
        if vals:
            positions[key[len(pos_prefix) : -len("/abs_mean")]] = statistics.fmean(vals)
    overall = _fold(rows, prefix)
    return {
        "node": prefix.rstrip("/"),
        "steps": len(rows),
        "overall": overall,
        "windows": windows,
        "positions": dict(sorted(positions.items(), key=lambda kv: int(kv[0].split("-")[0].rstrip("+")))),
        "verdict": _verdict(overall),
        "note": None,
    }


def _verdict(overall: dict[str, dict[str, float | None]]) -> str:
    fresh, stale = overall.get("fresh", {}), overall.get("stale", {})
    f, s = fresh.get("abs_mean"), stale.get("abs_mean")
    parts = []
    if f is not None:
        parts.append(
            f"fresh tokens (staleness 0): mean |gap| {f:.2e}, "
            + (
                "float rounding: engine and trainer agree"
                if f <= ROUNDING
                else "more than float rounding: engine and trainer compute different numbers "
                "(kernels, precision, sampling settings)"
            )
        )
    if s is not None:
        ratio = f"{s / f:.0f}x the fresh gap" if f else "no fresh tokens to compare"
        parts.append(f"stale tokens: mean |gap| {s:.2e} ({ratio}): the policy moved since they were sampled")
    if not parts:
        a = overall.get("all", {}).get("abs_mean")
        parts.append(
            f"mean |gap| {a:.2e} (no versions in the batch: fresh and stale not told apart)"
            if a is not None
            else "nothing recorded"
        )
    return "; ".join(parts)
