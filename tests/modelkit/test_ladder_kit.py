"""The testbed kit builtin:tiny-arith-ladder: its task level (1-12 steps), its teacher (worked
rates per number of steps), its lesson plan and its registration. No test here builds the kit."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from areal_graph.data.arith import LADDER_STEP_WEIGHTS, generate, hasty_answer, ladder_teacher, steps_of
from areal_graph.modelkit.builtin import BUILTIN_DATASETS, BUILTIN_KITS
from areal_graph.modelkit.kit_tasks import kit_task
from areal_graph.nodes.math_reward import math_reward

LADDER = BUILTIN_KITS["tiny-arith-ladder"]


@pytest.fixture(scope="module")
def rows():
    return generate(seed=0, n=6000, difficulty="ladder")


def test_ladder_problems_are_right_and_span_1_to_12_steps(rows):
    assert len({r["question"] for r in rows}) == len(rows)
    counts = Counter(steps_of(r) for r in rows)
    assert set(counts) <= set(range(1, 13)) and set(range(3, 13)) <= set(counts)
    # 3 to 12 steps equally likely (weight 8 each): each within 25% of the mean of those levels
    mid = statistics.fmean(counts[s] for s in range(3, 13))
    assert all(abs(counts[s] - mid) < 0.25 * mid for s in range(3, 13))
    assert len(LADDER_STEP_WEIGHTS) == 12
    for r in rows[:500]:  # the worked solution's boxed answer is right; the hasty one is one operation short
        answer = r["solution"].rsplit("boxed{", 1)[1].split("}")[0]
        assert math_reward(r["solution"], answer) == 1.0
        if steps_of(r) >= 2:
            assert math_reward(hasty_answer(r), answer) == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_the_teacher_works_out_each_length_at_its_rate(rows, seed):
    """Each row keeps its worked solution with probability worked_rates[steps - 1], else is hasty:
    the measured share per length is within 4 standard errors of the rate."""
    rates = LADDER.worked_rates
    taught = ladder_teacher(rows, rates, seed)
    assert [t["question"] for t in taught] == [r["question"] for r in rows]
    by_len: dict[int, list[bool]] = {}
    for r, t in zip(rows, taught):
        assert t["solution"] in (r["solution"], hasty_answer(r))
        by_len.setdefault(steps_of(r), []).append(t["solution"] == r["solution"])
    for s, worked in by_len.items():
        if len(worked) < 50:
            continue
        p, n = rates[min(s, len(rates)) - 1], len(worked)
        se = max((p * (1 - p) / n) ** 0.5, 1 / n)
        assert abs(statistics.fmean(worked) - p) <= 4 * se, (s, statistics.fmean(worked), p)
    # ever fewer long chains are worked out: the rates never rise with length
    assert list(rates) == sorted(rates, reverse=True) and rates[-1] > 0


def test_the_ladder_kit_is_registered_with_its_data_and_a_lesson_of_worked_rows_only():
    assert BUILTIN_DATASETS["arith-ladder/train"] == ("tiny-arith-ladder", "train")
    assert BUILTIN_DATASETS["arith-ladder/test"] == ("tiny-arith-ladder", "test")
    assert LADDER.difficulty == "ladder" and LADDER.model.max_position_embeddings >= 512
    # the recipe's fingerprint changes with its rates; older kits' recipes leave the field out
    assert "worked_rates" in LADDER.recipe() and "worked_rates" not in BUILTIN_KITS["tiny-arith"].recipe()
    assert LADDER.fingerprint() != type(LADDER)(**{**LADDER.__dict__, "worked_rates": (1.0,)}).fingerprint()
    task = kit_task(LADDER.task)
    train, test, lessons = task.rows(LADDER)
    assert len(test) == LADDER.n_test and [lesson.name for lesson in lessons] == ["method", "habit"]
    method, habit = lessons[0].rows, lessons[1].rows
    worked = {r["question"] for r in habit if "=" in r["solution"].split("boxed")[0]}
    assert {r["question"] for r in method} == worked  # the method: exactly the rows the teacher works out
    assert 0.1 < len(method) / len(habit) < 0.25  # ~16%: most long chains are answered hastily
    assert "works out" in task.describe(LADDER)
