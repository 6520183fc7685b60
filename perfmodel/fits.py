"""Small least-squares fits that report their own error: the cost model's building block.

Why not numpy.polyfit or a regression library: every cost the model fits is a handful of
named, non-negative terms (a fixed cost, per row, per token, per token x window), the fit must
say how wrong it is on the data it came from (the issue's "fit error on the run it came
from"), and it must serialise to JSON and back for `areal-graph simulate --calibrate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LinearFit:
    """y = sum(coef[i] * x[term_i]), coefficients >= 0 (a cost never shrinks with more work).

    `median_rel_err`: median |prediction - y| / y over the samples (one item's error);
    `total_rel_err`: (sum of predictions - sum of y) / sum of y (what a simulation that adds
    many items up inherits); `n`: samples; `lo`/`hi`: each term's range in the data, so a
    prediction outside it can say that it extrapolates."""

    terms: list[str]
    coef: list[float]
    n: int = 0
    median_rel_err: float = 0.0
    total_rel_err: float = 0.0
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)

    def predict(self, **x: float) -> float:
        return float(sum(c * float(x.get(t, 1.0 if t == "1" else 0.0)) for t, c in zip(self.terms, self.coef)))

    def outside(self, **x: float) -> list[str]:
        """The terms whose value lies more than 25% outside what the fit saw."""
        out = []
        for t, lo, hi in zip(self.terms, self.lo, self.hi):
            if t == "1" or t not in x:
                continue
            v = float(x[t])
            if v > hi * 1.25 + 1e-9 or v < lo * 0.75 - 1e-9:
                out.append(f"{t}={v:g} (fitted on {lo:g}..{hi:g})")
        return out

    @classmethod
    def constant(cls, value: float, n: int = 0, median_rel_err: float = 0.0) -> LinearFit:
        return cls(["1"], [max(float(value), 0.0)], n, median_rel_err, 0.0, [1.0], [1.0])


def fit_linear(
    rows: Sequence[Mapping[str, float]],
    y: Sequence[float],
    terms: Sequence[str],
    weights: Sequence[float] | None = None,
    robust: bool = True,
) -> LinearFit:
    """Non-negative least squares of `y` on `terms` (a term "1" is the constant).

    Samples are weighted by `weights` (default 1); with fewer samples than terms, or a
    degenerate design, it falls back to a constant (the mean).

    robust: a few samples far off (a forward that a garbage collection or the scheduler held up
    for 50 ms) would otherwise bend the shape of the fit, e.g. give every prefill a 20 ms fixed
    cost. The shape is fitted with Huber weights (samples more than ~3 deviations off count
    less), then every coefficient is scaled so the fit's total equals the measured total: the
    time those outliers took is still paid, spread over every item, which is what a simulation
    that adds many items up needs."""
    y_arr = np.asarray(y, dtype=float)
    if len(y_arr) == 0:
        return LinearFit.constant(0.0)
    X = np.array([[1.0 if t == "1" else float(r.get(t, 0.0)) for t in terms] for r in rows], dtype=float)
    w = np.sqrt(np.asarray(weights, dtype=float)) if weights is not None else np.ones(len(y_arr))
    coef = _nnls(X * w[:, None], y_arr * w) if len(y_arr) > len(terms) else None
    if coef is not None and robust:
        coef = _huber(X, y_arr, w, coef)
    if coef is None:
        fit = LinearFit.constant(float(y_arr.mean()))
        fit.terms, fit.coef = list(terms), [float(y_arr.mean()) if t == "1" else 0.0 for t in terms]
        coef = np.array(fit.coef)
    pred = X @ coef
    denom = np.where(y_arr > 0, y_arr, np.nan)
    rel = np.abs(pred - y_arr) / denom
    total = float((pred.sum() - y_arr.sum()) / y_arr.sum()) if y_arr.sum() > 0 else 0.0
    return LinearFit(
        list(terms),
        [float(c) for c in coef],
        int(len(y_arr)),
        float(np.nanmedian(rel)) if np.isfinite(rel).any() else 0.0,
        total,
        [float(v) for v in X.min(axis=0)],
        [float(v) for v in X.max(axis=0)],
    )


def _huber(X: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray, rounds: int = 4) -> np.ndarray:
    """Re-fit with Huber weights (threshold 3 x the residuals' median absolute deviation), then scale
    the coefficients so the predictions add up to the measured total."""
    for _ in range(rounds):
        r = y - X @ coef
        mad = float(np.median(np.abs(r - np.median(r)))) or 1e-12
        k = 3.0 * 1.4826 * mad
        hub = np.where(np.abs(r) <= k, 1.0, k / np.maximum(np.abs(r), 1e-300))
        ww = w * np.sqrt(hub)
        got = _nnls(X * ww[:, None], y * ww)
        if got is None:
            break
        coef = got
    total = float((X @ coef).sum())
    return coef * (float(y.sum()) / total) if total > 0 else coef


def _nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Non-negative least squares by active-set elimination: solve, drop the most negative
    coefficient's term, repeat (a handful of terms: a few solves)."""
    active = list(range(A.shape[1]))
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], b, rcond=None)
        if np.all(sol >= -1e-12):
            out = np.zeros(A.shape[1])
            out[active] = np.clip(sol, 0.0, None)
            return out
        active.pop(int(np.argmin(sol)))
    return None


def median(values: Sequence[float], default: float = 0.0) -> float:
    return float(np.median(values)) if len(values) else default


def median_rel_err(pred: Sequence[float], y: Sequence[float]) -> float:
    p, t = np.asarray(pred, dtype=float), np.asarray(y, dtype=float)
    ok = t > 0
    return float(np.median(np.abs(p[ok] - t[ok]) / t[ok])) if ok.any() else 0.0
