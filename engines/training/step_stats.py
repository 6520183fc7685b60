"""How the stats of one train step's pieces (micro-batches, data-parallel ranks, PPO updates) combine.

A loss function returns each micro-batch's *share* of a batch-level mean, so shares add up;
a key ending in `_max` (the largest train/inference log-prob gap, say) is a maximum, and
maxima do not add. One rule, used by the engine, the data-parallel gather and the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

MAX_SUFFIX = "_max"


def add_stats(into: dict[str, float], part: Mapping[str, float]) -> dict[str, float]:
    """Fold one piece's stats into `into` (sum, or max for `_max` keys); returns `into`."""
    for k, v in part.items():
        v = float(v)
        if k not in into:
            into[k] = v
        else:
            into[k] = max(into[k], v) if k.endswith(MAX_SUFFIX) else into[k] + v
    return into


def combine_pieces(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in parts:
        add_stats(out, p)
    return out


def mean_over_updates(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One batch's stats from its optimizer updates: means (max for `_max` keys)."""
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return {
        k: (
            max(r.get(k, 0.0) for r in runs) if k.endswith(MAX_SUFFIX) else sum(r.get(k, 0.0) for r in runs) / len(runs)
        )
        for k in keys
    }
