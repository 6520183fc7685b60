"""A calculator tool for agents: integer and decimal arithmetic, evaluated safely.

Why not `eval`: the expression comes from a policy being trained (or, through the
OpenAI-compatible server, from anyone), so it is untrusted text. It is parsed with `ast` and
only numbers, + - * / // % **, unary signs and parentheses are evaluated; any name,
attribute, call, subscript, comparison or other node is refused. Every way to make Python
spend unbounded time or memory on arithmetic is bounded before it happens: the text length,
the number of AST nodes, the size of every intermediate integer, and the exponent of a power
(checked from the operands' sizes, so `9**9**9` is refused without being computed).

A refused or failing expression is not an exception for the caller: `calculate` returns the
text the tool sends back to the model ("Error: ..."), which is what an agent observes.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

__all__ = ["CalculatorError", "CalculatorLimits", "evaluate_expression", "calculate", "format_number"]


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated within the limits."""


@dataclass(frozen=True)
class CalculatorLimits:
    """Bounds on what one expression may cost."""

    max_chars: int = 200  # expression text
    max_nodes: int = 64  # AST nodes
    max_int_bits: int = 256  # any integer operand or result (~77 decimal digits)
    max_abs_float: float = 1e77  # any float result


_BINARY: dict[type, Callable] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

Number = int | float


def _check_size(value: Number, limits: CalculatorLimits) -> Number:
    if isinstance(value, int):
        if value.bit_length() > limits.max_int_bits:
            raise CalculatorError("number too large")
    elif not math.isfinite(value) or abs(value) > limits.max_abs_float:
        raise CalculatorError("number too large")
    return value


def _power(base: Number, exponent: Number, limits: CalculatorLimits) -> Number:
    """base ** exponent, refused before computing when the result could exceed the limits."""
    if isinstance(exponent, float) or isinstance(base, float):
        if abs(exponent) > 1024:
            raise CalculatorError("exponent too large")
        try:
            result = float(base) ** float(exponent)
        except (OverflowError, ZeroDivisionError) as err:
            raise CalculatorError(str(err) or "overflow") from None
        if isinstance(result, complex):
            raise CalculatorError("complex result")
        return result
    if exponent < 0:
        if base == 0:
            raise CalculatorError("division by zero")
        return _power(float(base), float(exponent), limits)
    if abs(base) > 1 and (abs(base).bit_length() - 1) * exponent > limits.max_int_bits:
        raise CalculatorError("number too large")
    return base**exponent


def _binary(op: ast.operator, left: Number, right: Number, limits: CalculatorLimits) -> Number:
    kind = type(op)
    if kind not in _BINARY:
        raise CalculatorError(f"operator {kind.__name__} is not supported")
    if kind is ast.Pow:
        return _power(left, right, limits)
    if kind in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
        raise CalculatorError("division by zero")
    try:
        return _BINARY[kind](left, right)
    except OverflowError:
        raise CalculatorError("number too large") from None


def _evaluate(node: ast.AST, limits: CalculatorLimits) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, limits)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(cast(Number, node.value), limits)
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, limits)
        right = _evaluate(node.right, limits)
        return _check_size(_binary(node.op, left, right, limits), limits)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_size(_UNARY[type(node.op)](_evaluate(node.operand, limits)), limits)
    raise CalculatorError(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")


def evaluate_expression(expression: str, limits: CalculatorLimits = CalculatorLimits()) -> Number:
    """The value of an arithmetic expression; CalculatorError for anything else."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > limits.max_chars:
        raise CalculatorError(f"expression longer than {limits.max_chars} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("not a valid expression") from None
    if sum(1 for _ in ast.walk(tree)) > limits.max_nodes:
        raise CalculatorError(f"expression has more than {limits.max_nodes} parts")
    return _evaluate(tree, limits)


def format_number(value: Number) -> str:
    """An int as digits; a float as an int when it is integral, else with up to 10 significant digits."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


def calculate(expression: object, limits: CalculatorLimits = CalculatorLimits()) -> str:
    """What the tool answers: the value as text, or "Error: <why>" (never raises)."""
    try:
        return format_number(evaluate_expression(expression, limits))  # type: ignore[arg-type]
    except CalculatorError as err:
        return f"Error: {err}"
