"""The reasoning-gym kit's teacher (data/reasoning_gym_teacher.py): every worked solution is
arithmetic that holds line by line and ends at reasoning-gym's own answer, for every phrasing."""

from __future__ import annotations

import pytest

from areal_graph.data import reasoning_gym_teacher as teacher
from support.ci import optional


@pytest.mark.parametrize("seed", [3, 4])
def test_worked_solutions_reach_reasoning_gyms_answers(seed):
    optional("reasoning_gym", "pip install 'reasoning-gym>=0.1.25,<0.2' (in the dev extra)")
    rows = teacher.worked_rows(teacher.BASIC_ARITHMETIC, 400, seed)
    assert len(rows) == 400  # none left out: the teacher solves every problem of the kit's query
    starts = {row["question"].split()[0] for row in rows}
    assert {"What", "Solve", "Compute", "Evaluate:"} <= starts  # all four phrasings are taught
    for row in rows:
        *steps, last = row["solution"].splitlines()
        assert last == f"The answer is \\boxed{{{row['answer']}}}."
        for line in steps:
            left, right = line.split(" = ")
            a, op, b = left.split()
            assert int(right) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert steps[0].split()[0] == next(t for t in row["question"].replace(".", " ").split() if t.isdigit())


def test_what_is_not_a_chain_is_refused():
    assert teacher.worked_solution("What is 2 * 3?") is None
    assert teacher.worked_solution("Solve 4.") is None
    assert teacher.worked_solution("Compute 9 + 8 + 10.") == (
        "9 + 8 = 17\n17 + 10 = 27\nThe answer is \\boxed{27}.",
        27,
    )
