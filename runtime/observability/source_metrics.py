"""Reward and accuracy per data source: a mixed dataset (verl's `data_source`: gsm8k, MATH, ...)
learns unevenly, and one mean hides which part moves.

Keys: `<prefix>/by_source/<source>/<name>`, the source with anything but letters, digits, '_',
'.' and '-' written as '_' ("openai/gsm8k" -> "openai_gsm8k"), so the key stays one level deep
in TensorBoard and in `areal-graph trace`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def source_tag(source: str) -> str:
    return re.sub(r"[^\w.-]", "_", source) or "_"


def means_by_source(prefix: str, name: str, values: Sequence[float], sources: Sequence[str]) -> dict[str, float]:
    """`{prefix/by_source/<source>/name: mean of its values}` for the sources of `sources` (one per
    value); empty when no value has a source (a dataset without them logs nothing extra)."""
    if len(values) != len(sources):
        raise ValueError(f"{len(values)} values for {len(sources)} sources")
    if not any(sources):
        return {}
    sums: dict[str, list[float]] = {}
    for value, source in zip(values, sources):
        total = sums.setdefault(source_tag(source or "(none)"), [0.0, 0.0])
        total[0] += float(value)
        total[1] += 1.0
    return {f"{prefix}/by_source/{tag}/{name}": s / n for tag, (s, n) in sorted(sums.items())}
