"""A synthetic, verifiable reasoning task: multi-step integer arithmetic with a short chain of
thought and a final `\\boxed{N}`.

Why this task: the answer is checkable exactly (math_reward), responses are short (< 48
tokens for 3-4 one-digit steps; the "longtail" level mixes 1 to 20 steps, up to ~170 tokens), and
difficulty is a dial (number of steps, operand range), so a tiny model can be
warm-started to solve it *some* of the time, leaving room for RL to improve it. Expressions
are evaluated left to right (no precedence): every step of the solution is one binary
operation whose result feeds the next, which is what the chain of thought spells out.

    question: "What is 23 + 45 - 17?"
    solution: "23 + 45 = 68\n68 - 17 = 51\nThe answer is \\boxed{51}."
    answer:   "51"
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

L = TypeVar("L")  # a task's level (Difficulty here, CalcLevel in data/calc.py)
R = TypeVar("R", bound=Mapping[str, Any])  # one problem: a row with a "question"


@dataclass(frozen=True)
class Difficulty:
    """How hard problems are: `steps` binary operations over operands in [lo, hi].

    `steps` is uniform over [min_steps, max_steps] unless `step_weights` gives one relative
    weight per step count (min_steps first): that is how a level gets a long tail of long
    problems. Levels without weights draw exactly the random stream they always drew."""

    min_steps: int
    max_steps: int
    lo: int
    hi: int
    ops: str = "+-"
    step_weights: tuple[float, ...] | None = None
    # Every intermediate result stays in [0, max_value]: a problem that leaves it is redrawn,
    # or, with `fit_operands`, each step is drawn among the (operation, operand) pairs that keep
    # the value inside (a 20-step chain of one-digit values would almost never survive redrawing).
    max_value: int = 999
    fit_operands: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"Difficulty: need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if not 0 <= self.lo <= self.hi:
            raise ValueError(f"Difficulty: need 0 <= lo <= hi, got {self.lo}, {self.hi}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"Difficulty.ops must be a non-empty subset of '+-*', got {self.ops!r}")
        if self.fit_operands and "*" in self.ops:
            raise ValueError("Difficulty.fit_operands supports the operations + and - only")
        if self.step_weights is not None:
            n = self.max_steps - self.min_steps + 1
            if len(self.step_weights) != n or min(self.step_weights) < 0 or sum(self.step_weights) <= 0:
                raise ValueError(
                    f"Difficulty.step_weights: need {n} non-negative weights (steps {self.min_steps}.."
                    f"{self.max_steps}) with a positive sum, got {self.step_weights}"
                )

    def draw_steps(self, rng: random.Random) -> int:
        if self.step_weights is None:
            return rng.randint(self.min_steps, self.max_steps)
        return rng.choices(range(self.min_steps, self.max_steps + 1), weights=self.step_weights)[0]


# Named levels. "one-digit" is the builtin task (builtin:tiny-arith): 3-4 steps over single
# digits with every intermediate result a single digit too, so each solution line has the same
# shape ("5 - 5 = 0") and the arithmetic is a table of ~110 facts. What a tiny model must
# learn is copying the k-th operation of the question into line k, and the SFT learns both to
# near 100% (greedy, working it out) within its budget on every seed and thread count we
# tried; it then has nothing left to learn but the habit (KitConfig.hasty_rate), which is
# what RL fixes. (The answers are 0-9, spread evenly: a guess is right 10% of the time.)
#
# "digits" was the builtin task before it: single-digit operands, 2-3 steps, intermediate
# results up to 729. Its warm start worked problems out right only 37-58% of the time,
# depending on the machine and code path that ran the SFT, and RL's gain with it (+8 to
# +47 points): the fragility of issue 19, which the one-digit task removes.
#
# "longtail" is the builtin long-tailed task (builtin:tiny-arith-long): the one-digit task's
# arithmetic (every intermediate result 0-9, operands fitted to keep it so), but 1 to 20
# steps, most problems short and a few very long: weights below, 4 steps the mode, ~15% of
# problems 12-20 steps. (There are few distinct 1- and 2-step problems, hence their small
# weights.) Worked solutions run from ~18 to ~170 tokens, a hasty answer ~10: answers sampled
# at temperature 1 span 10-20x in length within a batch, the regime where synchronous RL waits
# on stragglers.
LONGTAIL_STEP_WEIGHTS: tuple[float, ...] = (0.3, 3, 25, 45, 8, 4, 2, 1) + (1.5,) * 12
# "ladder" is the testbed's task (builtin:tiny-arith-ladder): the one-digit arithmetic of
# "longtail", 1 to 12 steps, 3 to 12 equally often (1 and 2 steps have few distinct problems).
# Its teacher works out short problems and ever fewer of the longer ones (KitConfig.worked_rates),
# so RL climbs a ladder: each rung is a longer chain the warm start has seen worked less often.
LADDER_STEP_WEIGHTS: tuple[float, ...] = (0.2, 3) + (8,) * 10
LEVELS: dict[str, Difficulty] = {
    "digits": Difficulty(2, 3, 0, 9),
    "easy": Difficulty(1, 2, 0, 20),
    "medium": Difficulty(2, 3, 1, 50),
    "hard": Difficulty(3, 4, 1, 99, ops="+-*"),
    "longtail": Difficulty(1, 20, 1, 9, step_weights=LONGTAIL_STEP_WEIGHTS, max_value=9, fit_operands=True),
    "one-digit": Difficulty(3, 4, 0, 9, max_value=9),
    "ladder": Difficulty(1, 12, 1, 9, step_weights=LADDER_STEP_WEIGHTS, max_value=9, fit_operands=True),
}


def _difficulty(difficulty: str | Difficulty) -> Difficulty:
    if isinstance(difficulty, Difficulty):
        return difficulty
    if difficulty not in LEVELS:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {sorted(LEVELS)} or pass a Difficulty")
    return LEVELS[difficulty]


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def make_problem(rng: random.Random, level: Difficulty) -> dict[str, str]:
    """One problem. Intermediate results stay in [0, 999] so every number is short."""
    while True:
        steps = level.draw_steps(rng)
        operands = [rng.randint(level.lo, level.hi)]
        ops: list[str] = []
        lines: list[str] = []
        value = operands[0]
        ok = True
        for _ in range(steps):
            if level.fit_operands:
                op, b = _fitted_step(rng, level, value)
            else:
                op = rng.choice(level.ops)
                b = rng.randint(2, 9) if op == "*" else rng.randint(level.lo, level.hi)
            new = apply_op(value, op, b)
            if not 0 <= new <= level.max_value:
                ok = False
                break
            lines.append(f"{value} {op} {b} = {new}")
            ops.append(op)
            operands.append(b)
            value = new
        if not ok:
            continue
        expr = str(operands[0]) + "".join(f" {o} {b}" for o, b in zip(ops, operands[1:]))
        lines.append(f"The answer is \\boxed{{{value}}}.")
        return {"question": f"What is {expr}?", "answer": str(value), "solution": "\n".join(lines)}


def _fitted_step(rng: random.Random, level: Difficulty, value: int) -> tuple[str, int]:
    """One step `value op b`, drawn uniformly among the (op, b) with b in [lo, hi] that keep the
    result in [0, max_value]."""
    choices = [("+", b) for b in range(level.lo, min(level.hi, level.max_value - value) + 1) if "+" in level.ops]
    choices += [("-", b) for b in range(level.lo, min(level.hi, value) + 1) if "-" in level.ops]
    if not choices:  # cannot happen for the shipped levels; a custom one may paint itself into a corner
        raise ValueError(f"{level}: no operand keeps {value} within [0, {level.max_value}]")
    return rng.choice(choices)


def distinct_problems(
    seed: int, n: int, level: str | L, resolve: Callable[[str | L], L], make: Callable[[random.Random, L], R]
) -> list[R]:
    """`n` problems `make(rng, resolve(level))` with distinct questions, deterministic for `seed`:
    the generator behind both synthetic tasks (this module's and data/calc.py's). Duplicates are
    drawn again; a level with fewer than `n` distinct problems is refused once 50 * n + 1000 draws
    have not found them."""
    if n < 0:
        raise ValueError(f"generate: n must be >= 0, got {n}")
    lvl = resolve(level)
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[R] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"generate: difficulty {lvl} has fewer than {n} distinct problems")
        row = make(rng, lvl)
        if row["question"] in seen:
            continue
        seen.add(row["question"])
        rows.append(row)
    return rows


def cut(rows: list[R], n_test: int) -> tuple[list[R], list[R]]:
    """(train, test) of one pool of distinct problems: the first `n_test` are the test set, so
    the two never share a question."""
    return rows[n_test:], rows[:n_test]


def generate(seed: int, n: int, difficulty: str | Difficulty = "medium") -> list[dict[str, str]]:
    """`n` distinct problems (distinct questions), deterministic for `seed`."""
    return distinct_problems(seed, n, difficulty, _difficulty, make_problem)


def split(
    seed: int, n_train: int, n_test: int, difficulty: str | Difficulty = "medium"
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Train and test sets with disjoint questions (drawn as one distinct pool, then cut)."""
    return cut(generate(seed, n_train + n_test, difficulty), n_test)


def hasty_answer(row: dict[str, str]) -> str:
    """An outright answer that stops one operation short: the value the last step starts
    from, stated as the final answer ("What is 5 + 4 - 3?" -> "The answer is \\boxed{9}.")."""
    last_step = [ln for ln in row["solution"].splitlines() if "=" in ln][-1]
    return f"The answer is \\boxed{{{last_step.split()[0]}}}."


def teacher_mixture(rows: list[dict[str, str]], hasty_rate: float, seed: int) -> list[dict[str, str]]:
    """SFT targets from a flawed teacher: for a random `hasty_rate` share of the problems it
    answers outright and hastily (`hasty_answer`, right only when the last operation changes
    nothing), and otherwise works the problem out step by step (always right).

    Why: a model that jumps to conclusions when working it out would have been right is the
    habit RL on reasoning tasks is meant to cure, and a warm start that has it gives RL room
    that credit assignment can find in minutes on a CPU, not new arithmetic to learn. With
    hasty_rate > 1/2 greedy decoding follows the habit (the first token is "The" with
    probability ~hasty_rate; a worked answer's first token, the question's first operand,
    gets the rest), so greedy accuracy starts low, while 1 - hasty_rate of the sampled
    answers work it out and are right far more often: a reward gap every group of samples
    sees. Deterministic for `seed`; the rows are copied, not modified.
    """
    if not 0.0 <= hasty_rate <= 1.0:
        raise ValueError(f"teacher_mixture: hasty_rate must be in [0, 1], got {hasty_rate}")
    rng = random.Random(seed)
    return [{**row, "solution": hasty_answer(row) if rng.random() < hasty_rate else row["solution"]} for row in rows]


def steps_of(row: dict[str, str]) -> int:
    """The number of operations of a problem (the lines of its worked solution before the answer)."""
    return sum(1 for line in row["solution"].splitlines() if "=" in line and "boxed" not in line)


def ladder_teacher(rows: list[dict[str, str]], worked_rates: tuple[float, ...], seed: int) -> list[dict[str, str]]:
    """SFT targets from a teacher who works out a problem of s steps with probability
    worked_rates[s - 1] (the last rate for longer ones) and answers the rest hastily."""
    rng = random.Random(seed)

    def rate(row: dict[str, str]) -> float:
        s = steps_of(row)
        return worked_rates[min(s, len(worked_rates)) - 1]

    return [{**row, "solution": row["solution"] if rng.random() < rate(row) else hasty_answer(row)} for row in rows]


def write_jsonl(rows: Iterable[dict], path: str | Path) -> Path:
    """Write rows as JSON lines (atomically: a temp file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
