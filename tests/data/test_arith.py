"""data/arith.py `distinct_problems` and `cut`: the generator and split behind both synthetic
tasks (data/arith.py's levels and data/calc.py's)."""

from __future__ import annotations

import random

import pytest

from areal_graph.data import arith, calc
from areal_graph.data.arith import cut, distinct_problems


def _pick(rng: random.Random, level: int) -> dict[str, str]:
    value = rng.randint(0, level)
    return {"question": f"q{value}", "answer": str(value)}


def test_distinct_problems_skips_repeats_and_is_deterministic():
    rows = distinct_problems(7, 5, 9, int, _pick)
    assert len({r["question"] for r in rows}) == 5
    assert rows == distinct_problems(7, 5, "9", int, _pick)  # the level is resolved first


def test_distinct_problems_refuses_a_level_too_small_for_n():
    with pytest.raises(ValueError, match="fewer than 4 distinct"):
        distinct_problems(0, 4, 2, int, _pick)
    # the calculator task keeps the same bound (before, an exhausted level drew forever)
    with pytest.raises(ValueError, match="fewer than 100 distinct"):
        calc.generate(0, 100, calc.CalcLevel(digits=(1,), add_rate=0.0))
    with pytest.raises(ValueError, match="n must be >= 0"):
        distinct_problems(0, -1, "not a level", int, _pick)  # n is checked before the level


def test_cut_takes_the_test_set_first_and_both_tasks_split_through_it():
    rows = [{"question": str(i)} for i in range(5)]
    assert cut(rows, 2) == (rows[2:], rows[:2])
    assert arith.split(3, 4, 2, "easy") == cut(arith.generate(3, 6, "easy"), 2)
    assert calc.split(3, 4, 2) == cut(calc.generate(3, 6), 2)
