"""perfmodel/fits.py: non-negative linear fits that recover known costs and report their error."""

from __future__ import annotations

import numpy as np
import pytest

from areal_graph.perfmodel.fits import LinearFit, fit_linear


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_fit_recovers_the_costs_it_was_made_from(seed):
    rng = np.random.default_rng(seed)
    rows = [
        {"rows": float(b), "rows_x_width_k": b * w / 1e3}
        for b, w in zip(rng.integers(1, 65, 400), rng.integers(20, 300, 400))
    ]
    truth = {"1": 1.5, "rows": 0.06, "rows_x_width_k": 0.3}
    y = [
        (truth["1"] + truth["rows"] * r["rows"] + truth["rows_x_width_k"] * r["rows_x_width_k"]) * rng.lognormal(0, 0.1)
        for r in rows
    ]
    fit = fit_linear(rows, y, ["1", "rows", "rows_x_width_k"])
    for term, coef in zip(fit.terms, fit.coef):
        assert coef == pytest.approx(truth[term], rel=0.15), term
    assert 0.02 < fit.median_rel_err < 0.15 and abs(fit.total_rel_err) < 0.03 and fit.n == 400


def test_costs_never_come_out_negative_and_the_fit_round_trips():
    rows = [{"x": float(i)} for i in range(20)]
    y = [10.0 - 0.1 * i for i in range(20)]  # falls with x: a cost that cannot, so x gets 0
    fit = fit_linear(rows, y, ["1", "x"])
    assert fit.coef[1] == 0.0 and fit.coef[0] == pytest.approx(np.mean(y))
    again = LinearFit(**{k: getattr(fit, k) for k in fit.__dataclass_fields__})
    assert again.predict(x=3) == fit.predict(x=3)


def test_too_few_samples_give_the_mean_and_the_range_says_what_extrapolates():
    fit = fit_linear([{"x": 1.0}], [4.0], ["1", "x"])
    assert fit.predict(x=100) == 4.0
    fit = fit_linear([{"x": float(i)} for i in range(1, 11)], [2.0 * i for i in range(1, 11)], ["1", "x"])
    assert fit.outside(x=5) == [] and fit.outside(x=40) == ["x=40 (fitted on 1..10)"]
