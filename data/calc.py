"""A tool-use task: multiplication a tiny model cannot do in its head, trivial with a calculator.

    question: "What is 347 * 58?"            (level "products-plus" adds "+ c" to some)
    answer:   "20126"

A model of about a million parameters does not learn to multiply a 2-3 digit number by a
2-3 digit number from a short SFT, but it does learn to copy the question's expression into a
calculator call and the calculator's result into its answer. The task therefore rewards one
decision above all: call the tool or not.

The warm-start teacher (`teacher_conversations`) has a habit: it reaches for the calculator
only some of the time, more often when the numbers look big (one rate per factor size, the
kit's `direct_rates`), and otherwise answers outright with a hasty estimate (`hasty_estimate`:
the factors' leading digits multiplied, 347 * 58 -> 300 * 50 = 15000), almost always wrong.
Greedy decoding inherits the habit (it calls the tool only where the teacher mostly did), so
greedy accuracy starts low, while sampled answers call the tool often enough that most groups
of samples see calling pay: RL has to discover from reward alone that the calculator is worth
its tokens. (The estimate rather than the true product as the outright answer: a product the
student cannot learn would fill the SFT loss with noise and slow down what it can learn,
copying numbers; the estimate is learnable and just as wrong.)

The conversations are in the Hermes / Qwen2.5 tool convention (api/tool_calls.py);
`encode_conversation` lays them out token for token as the multi-turn rollout
(workflows/rollout/calculator_agent.py) does during RL, with the tool's messages masked.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_graph.api.tool_calls import render_tool_call, tool_turn_text
from areal_graph.data.arith import cut, distinct_problems
from areal_graph.data.datasets import format_prompt

TOOL_NAME = "calculator"
IGNORE = -100


@dataclass(frozen=True)
class CalcLevel:
    """Problems `a * b` (+ `c` in a share `add_rate` of them) with operands of `digits` digits.

    The digit count of each operand is drawn uniformly from `digits`, then the operand
    uniformly among numbers of that many digits."""

    digits: tuple[int, ...] = (2, 3)
    add_rate: float = 0.3

    def __post_init__(self) -> None:
        if not self.digits or min(self.digits) < 1 or max(self.digits) > 6:
            raise ValueError(f"CalcLevel.digits must be counts in 1..6, got {self.digits}")
        if not 0.0 <= self.add_rate <= 1.0:
            raise ValueError(f"CalcLevel.add_rate must be in [0, 1], got {self.add_rate}")

    @property
    def factor_sizes(self) -> list[int]:
        """The digit counts two factors can have together, smallest first."""
        return list(range(2 * min(self.digits), 2 * max(self.digits) + 1))


# "products" is the builtin task (builtin:tiny-calc): a tiny model copies two numbers into a
# call reliably after a short SFT; a third (the "+ c" of "products-plus") it copies far less
# often, which would leave the tool path itself unreliable.
LEVELS: dict[str, CalcLevel] = {"products": CalcLevel(add_rate=0.0), "products-plus": CalcLevel(add_rate=0.3)}


def _level(level: str | CalcLevel) -> CalcLevel:
    if isinstance(level, CalcLevel):
        return level
    if level not in LEVELS:
        raise ValueError(f"unknown calc level {level!r}; choose one of {sorted(LEVELS)} or pass a CalcLevel")
    return LEVELS[level]


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def make_problem(rng: random.Random, level: CalcLevel) -> dict[str, Any]:
    """One problem: question, answer, the expression to compute, and its factors' digit count."""
    da, db = rng.choice(level.digits), rng.choice(level.digits)
    a, b = _number(rng, da), _number(rng, db)
    expression = f"{a} * {b}"
    value = a * b
    if rng.random() < level.add_rate:
        c = _number(rng, rng.choice(level.digits))
        expression += f" + {c}"
        value += c
    return {
        "question": f"What is {expression}?",
        "answer": str(value),
        "expression": expression,
        "factor_digits": da + db,
    }


def generate(seed: int, n: int, level: str | CalcLevel = "products") -> list[dict[str, Any]]:
    """`n` problems with distinct questions, deterministic for `seed`."""
    return distinct_problems(seed, n, level, _level, make_problem)


def split(
    seed: int, n_train: int, n_test: int, level: str | CalcLevel = "products"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and test sets with disjoint questions (one distinct pool, cut)."""
    return cut(generate(seed, n_train + n_test, level), n_test)


def final_answer(value: str) -> str:
    return f"The answer is \\boxed{{{value}}}."


def tool_conversation(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant's side of a solved problem with the calculator, as chat messages."""
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": row["expression"]}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": row["answer"]},
        {"role": "assistant", "content": final_answer(row["answer"])},
    ]


def hasty_estimate(expression: str) -> int:
    """The factors' leading digits times their powers of ten, multiplied (any "+ c" dropped):
    "347 * 58" -> 300 * 50 = 15000. Right only when both factors are round (about 1 in 100
    for two 2-digit factors, far rarer otherwise)."""
    terms = expression.split()
    a, b = terms[0], terms[2]
    return int(a[0]) * 10 ** (len(a) - 1) * int(b[0]) * 10 ** (len(b) - 1)


def direct_conversation(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant's side of a problem answered outright, with a hasty estimate."""
    return [{"role": "assistant", "content": final_answer(str(hasty_estimate(row["expression"])))}]


def teacher_conversations(
    rows: Sequence[dict[str, Any]], direct_rates: Sequence[float], seed: int, level: str | CalcLevel = "products"
) -> list[dict[str, Any]]:
    """SFT rows {question, answer, messages}: a problem whose two factors have
    `level.factor_sizes[k]` digits in all is answered outright with probability
    `direct_rates[k]`, otherwise solved with one calculator call. Deterministic for `seed`;
    the input rows are not modified."""
    sizes = _level(level).factor_sizes
    if len(direct_rates) != len(sizes) or not all(0.0 <= r <= 1.0 for r in direct_rates):
        raise ValueError(
            f"teacher_conversations: need {len(sizes)} direct rates in [0, 1] (factor digits "
            f"{sizes[0]}..{sizes[-1]}), got {tuple(direct_rates)}"
        )
    rng = random.Random(seed)
    out = []
    for row in rows:
        direct = rng.random() < direct_rates[sizes.index(int(row["factor_digits"]))]
        out.append({**row, "messages": direct_conversation(row) if direct else tool_conversation(row)})
    return out


def uses_tool(messages: Sequence[dict[str, Any]]) -> bool:
    return any(m.get("tool_calls") for m in messages)


def assistant_text(message: dict[str, Any]) -> str:
    """What the model writes for one assistant message (its EOS excluded)."""
    calls = [c.get("function", c) for c in message.get("tool_calls") or []]
    parts = [message["content"]] if message.get("content") else []
    parts += [render_tool_call(c["name"], c["arguments"]) for c in calls]
    return "\n".join(parts)


def encode_conversation(
    tokenizer: Any, question: str, messages: Sequence[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of prompt + conversation, laid out as the calculator rollout lays
    out an episode: each assistant turn is its text + EOS (trained on), the tool results and
    the next assistant header are one masked span (`tool_turn_text`). Labels are IGNORE on
    the prompt and the tool spans."""
    ids = tokenizer(format_prompt(tokenizer, question), add_special_tokens=False).input_ids
    labels = [IGNORE] * len(ids)
    pending: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            pending.append(str(message["content"]))
            continue
        if message["role"] != "assistant":
            raise ValueError(f"encode_conversation: unexpected role {message['role']!r}")
        if pending:
            obs = tokenizer(tool_turn_text(pending), add_special_tokens=False).input_ids
            ids += obs
            labels += [IGNORE] * len(obs)
            pending = []
        turn = tokenizer(assistant_text(message), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        ids += turn
        labels += turn
    if pending:
        raise ValueError("encode_conversation: a conversation must end with an assistant message")
    return ids, labels


def encode_teacher_row(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """`encode_conversation` of one `teacher_conversations` row (the SFT encoder of the calc kit)."""
    return encode_conversation(tokenizer, row["question"], row["messages"])


def tokenizer_corpus(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Texts to train the BPE on: questions and everything the assistant and tool write, so
    the tool-call boilerplate gets merges (a call costs ~20 tokens, not ~50)."""
    texts = []
    for row in rows:
        texts.append(row["question"])
        texts.extend(assistant_text(m) if m["role"] == "assistant" else str(m["content"]) for m in row["messages"])
        texts.append(assistant_text(tool_conversation(row)[0]))
    return texts
