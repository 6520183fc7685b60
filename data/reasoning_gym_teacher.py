"""Worked solutions for reasoning-gym's basic_arithmetic: the SFT teacher of the kit `tiny-rg-arith`.

Why a kit for reasoning-gym: the arithmetic kits know one phrasing ("What is 3 + 4 - 2?") and
values 0 to 9; reasoning-gym asks the same sums four ways ("Solve ...", "Compute ...",
"Evaluate: ...") with answers from -18 to 27, and the tiny kit does not learn them by RL alone
(3.9% -> 4.3% in 300 steps, docs/agents.md). This teacher writes each of reasoning-gym's own
problems out as the arithmetic kit's teacher does (one line per operation, left to right, then
`The answer is \\boxed{N}.`), checked against reasoning-gym's answer; data/arith.teacher_mixture
then makes it hasty on a share of them, as for tiny-arith.
"""

from __future__ import annotations

import re
from typing import Any

from areal_graph.data import reasoning_gym

# The sums reasoning_gym_arith.yaml trains on: 2-3 one-digit terms, + and -, four phrasings.
BASIC_ARITHMETIC = (
    "basic_arithmetic?min_terms=2&max_terms=3&max_digits=1&operators=+,-&allow_parentheses=false"
    "&allow_negation=false&format_style=natural"
)
TERMS = re.compile(r"(\d+)|([+-])")


def worked_solution(question: str) -> tuple[str, int] | None:
    """("6 - 5 = 1\\n1 + 1 = 2\\nThe answer is \\boxed{2}.", 2) for "Evaluate: 6 - 5 + 1."; None when
    the question is not a chain of + and - over non-negative integers."""
    tokens = [m.group(0) for m in TERMS.finditer(question)]
    if (
        len(tokens) < 3
        or len(tokens) % 2 == 0
        or any(t in "+-" for t in tokens[::2])
        or any(t not in "+-" for t in tokens[1::2])
    ):
        return None
    value, lines = int(tokens[0]), []
    for op, num in zip(tokens[1::2], tokens[2::2]):
        new = value + int(num) if op == "+" else value - int(num)
        lines.append(f"{value} {op} {num} = {new}")
        value = new
    return "\n".join(lines + [f"The answer is \\boxed{{{value}}}."]), value


def worked_rows(query: str, size: int, seed: int) -> list[dict[str, Any]]:
    """Rows {question, answer, solution} of `reasoning_gym:<query>&size=&seed=` whose worked
    solution reaches reasoning-gym's own answer (the others are left out)."""
    rows = []
    for entry in reasoning_gym.entries(f"{reasoning_gym.SCHEME}{query}&size={size}&seed={seed}"):
        worked = worked_solution(entry["question"])
        if worked is not None and str(worked[1]) == str(entry["answer"]).strip():
            rows.append({"question": entry["question"], "answer": str(worked[1]), "solution": worked[0]})
    return rows
