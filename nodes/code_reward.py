"""The code reward: run the completion's Python against the problem's tests, contained.

Pure functions, like `math_reward`: `code_reward(completion, answer) -> float` is what the
reward node calls (`fn: code`, in a `tools/reward_pool.py` worker), with the row's tests as
`answer`. Every test runs in its own `tools/sandbox.py` sandbox (no network, private
read-only filesystem, unprivileged uid, rlimits), and the judging happens out here: code
that prints a forged verdict or returns an object with a rigged `__eq__` gains nothing.

Accepted test formats (a JSON string, a Python-literal string, or already decoded):

- LiveCodeBench / DeepCoder `lcbv5`, `codeforces`: a list of
  `{"input": str, "output": str, "testtype": "stdin" | "functional", "metadata": {"func_name": f}}`;
  a functional input holds one JSON value per line (the arguments), its output one JSON value.
- DeepCoder `primeintellect`: a list of `{"type": "stdin_stdout", "input", "output"}` or
  `{"type": "function_call", "fn_name": f, "input": [args], "output": [ret]}`.
- APPS / TACO / code_contests: `{"inputs": [...], "outputs": [...], "fn_name": f (optional)}`.

stdin tests compare stdout whitespace-normalised (lines stripped, runs of blanks collapsed,
numbers equal as decimals, `1.0` == `1`); function tests call `f(*args)` (or
`Solution().f(*args)`, LeetCode style) and compare the JSON of the return value, a tuple
being a list; as in APPS, an expected `[ret]` also accepts `ret`. Scoring is all-or-nothing
by default (DeepCoder: 1.0 only if every test passes, stopping at the first failure) or the
fraction passed (`code_reward_fraction`). Timeouts and crashes score 0 and are counted by
reason (`CodeScore.outcomes`, and `reason_counts()` per process).
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import math
import re
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from areal_graph.tools.sandbox import SandboxLimits, SandboxResult, run_python

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.S)
_PYTHON_TAGS = ("python", "py", "python3")
_REASONS: Counter = Counter()


@dataclass(frozen=True)
class CodeTest:
    """One test: stdin -> expected stdout, or fn_name(*args) -> expected return value."""

    stdin: str = ""
    expected_stdout: str | None = None
    fn_name: str | None = None
    args: list = field(default_factory=list)
    expected: Any = None
    wrapped_ok: bool = False  # APPS style: an expected [ret] also accepts ret


@dataclass(frozen=True)
class CodeRewardConfig:
    all_or_nothing: bool = True  # DeepCoder: 1.0 only if every test passes; else passed / total
    max_tests: int = 15  # DeepCoder keeps the tests with the longest inputs
    wall_s: float = 5.0  # per test
    cpu_s: int = 4
    memory_mb: int = 512
    max_processes: int = 4
    max_output_bytes: int = 1 << 20  # per stream, raised to fit twice the expected output
    require_isolation: bool = False  # score 0 (reason "sandbox_error") rather than run uncontained

    def __post_init__(self) -> None:
        for name in ("max_tests", "wall_s", "cpu_s", "memory_mb", "max_processes", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CodeRewardConfig.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class CodeScore:
    reward: float
    passed: int
    total: int
    outcomes: tuple[str, ...]  # one per test run: passed, wrong_answer, timeout, runtime_error, ...
    reason: str  # "passed", "no_code", or the first failing test's outcome


# ------------------------------------------------------------------------------- extraction
def extract_code(completion: str) -> str | None:
    """The last ```python (or ```py) block of a completion, else its last fenced block of any
    language; None when it has no closed block."""
    blocks = [(tag.strip().lower(), body) for tag, body in _FENCE.findall(completion or "")]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    chosen = python or [body for _, body in blocks]
    if not chosen or not chosen[-1].strip():
        return None
    return chosen[-1].strip("\n")


# ------------------------------------------------------------------------------- test formats
def _decode(answer: Any) -> Any:
    if not isinstance(answer, str):
        return answer
    try:
        return json.loads(answer)
    except RecursionError:
        raise ValueError("tests are JSON nested too deeply") from None
    except json.JSONDecodeError:
        try:  # a row whose tests were stored as a Python literal (str() of a list)
            return ast.literal_eval(answer)
        except (ValueError, SyntaxError, RecursionError, MemoryError) as err:
            raise ValueError(f"tests are neither JSON nor a Python literal: {err}") from None


def _text(value: Any) -> str:
    return "\n".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _json_lines(value: Any) -> list:
    """LiveCodeBench functional input: one JSON value per line (the arguments)."""
    if isinstance(value, list):
        return value
    return [json.loads(line) for line in str(value).split("\n") if line.strip()]


def _json_value(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _test_from_dict(item: dict) -> CodeTest:
    kind = str(item.get("testtype", item.get("type", ""))).lower()
    meta = item.get("metadata") or {}
    if isinstance(meta, str):
        meta = json.loads(meta) if meta.strip() else {}
    fn_name = item.get("fn_name") or meta.get("func_name")
    if kind == "functional":
        if not fn_name:
            raise ValueError("a functional test needs metadata.func_name")
        return CodeTest(fn_name=fn_name, args=_json_lines(item["input"]), expected=_json_value(item["output"]))
    if kind == "function_call" or fn_name:
        args = item["input"] if isinstance(item["input"], list) else _json_lines(item["input"])
        return CodeTest(fn_name=fn_name, args=args, expected=item["output"], wrapped_ok=True)
    return CodeTest(stdin=_text(item["input"]), expected_stdout=_text(item["output"]))


def parse_tests(answer: Any) -> list[CodeTest]:
    """The tests of one problem in any of the accepted formats; ValueError if unreadable."""
    data = _decode(answer)
    try:
        if isinstance(data, dict) and "inputs" in data:
            fn_name = data.get("fn_name")
            pairs = list(zip(data["inputs"], data["outputs"], strict=True))
            if fn_name:
                return [
                    CodeTest(fn_name=fn_name, args=list(i) if isinstance(i, list) else [i], expected=o, wrapped_ok=True)
                    for i, o in pairs
                ]
            return [CodeTest(stdin=_text(i), expected_stdout=_text(o)) for i, o in pairs]
        if isinstance(data, list) and data and all(isinstance(t, dict) for t in data):
            return [_test_from_dict(t) for t in data]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"malformed tests: {type(err).__name__}: {err}") from None
    raise ValueError(
        f"tests must be a non-empty list of test objects or an {{inputs, outputs}} object, got {type(data).__name__}"
    )


def select_tests(tests: list[CodeTest], max_tests: int) -> list[CodeTest]:
    """At most `max_tests`, the ones with the longest inputs (as DeepCoder), in their order."""
    if len(tests) <= max_tests:
        return tests
    size = [len(t.stdin) if t.fn_name is None else len(json.dumps(t.args, default=str)) for t in tests]
    keep = sorted(sorted(range(len(tests)), key=lambda i: -size[i])[:max_tests])
    return [tests[i] for i in keep]


# ------------------------------------------------------------------------------- judging
def _normal_lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.strip().splitlines()]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def stdout_matches(got: str, expected: str) -> bool:
    """Equal after whitespace normalisation, numbers compared as decimals (1.0 == 1)."""
    got_lines, want_lines = _normal_lines(got), _normal_lines(expected)
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for a, b in zip(got_lines, want_lines):
        if a != b:
            da, db = _decimals(a), _decimals(b)
            if da is None or db is None or da != db:
                return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """JSON values equal, floats within 1e-9 (relative or absolute), tuples already lists."""
    if isinstance(got, float) or isinstance(expected, float):
        return (
            isinstance(got, (int, float))
            and isinstance(expected, (int, float))
            and not isinstance(got, bool)
            and not isinstance(expected, bool)
            and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
        )
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(values_match(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected  # True is not 1, "1" is not 1


_DRIVER = """import json as _json, sys as _sys
_solution = {{"__name__": "solution", "__builtins__": __builtins__}}
exec(compile({code!r}, "solution.py", "exec"), _solution)
_name = {fn_name!r}
if callable(_solution.get(_name)):
    _fn = _solution[_name]
elif isinstance(_solution.get("Solution"), type) and hasattr(_solution["Solution"], _name):
    _fn = getattr(_solution["Solution"](), _name)
else:
    raise NameError("no function " + repr(_name) + " (nor Solution." + _name + ")")
_result = _fn(*_json.loads({args!r}))
_sys.stdout.flush()
_sys.stdout.write("\\n" + {marker!r} + _json.dumps(_result, default=repr) + "\\n")
"""


def _failure(result: SandboxResult) -> str | None:
    """The outcome of a run that did not end normally; None if it did."""
    if result.error is not None:
        return "sandbox_error"
    if result.limit in ("wall_time", "cpu_time"):
        return "timeout"
    if result.limit == "output":
        return "output_limit"
    if result.limit == "memory":
        return "memory"
    if result.returncode != 0:
        return "runtime_error"
    return None


def _limits(config: CodeRewardConfig, expected_size: int) -> SandboxLimits:
    return SandboxLimits(
        wall_s=config.wall_s,
        cpu_s=config.cpu_s,
        memory_mb=config.memory_mb,
        max_processes=config.max_processes,
        require_isolation=config.require_isolation,
        max_output_bytes=max(config.max_output_bytes, 2 * expected_size + 1024),
    )


async def run_test(code: str, test: CodeTest, config: CodeRewardConfig) -> str:
    """One test's outcome: passed, wrong_answer, timeout, runtime_error, memory, output_limit,
    no_result (the function never returned) or sandbox_error."""
    if test.fn_name is None:
        assert test.expected_stdout is not None
        result = await run_python(code, _limits(config, len(test.expected_stdout)), stdin=test.stdin)
        failed = _failure(result)
        if failed:
            return failed
        return "passed" if stdout_matches(result.stdout, test.expected_stdout) else "wrong_answer"
    marker = f"<<areal-result-{secrets.token_hex(8)}>>"
    program = _DRIVER.format(code=code, fn_name=test.fn_name, args=json.dumps(test.args), marker=marker)
    result = await run_python(program, _limits(config, len(json.dumps(test.expected, default=str))), stdin="")
    failed = _failure(result)
    if failed:
        return failed
    _, found, tail = result.stdout.rpartition(marker)
    if not found:
        return "no_result"
    try:
        got = json.loads(tail.strip())
    except json.JSONDecodeError:
        return "wrong_answer"
    expected = test.expected
    ok = values_match(got, expected) or (
        test.wrapped_ok and isinstance(expected, list) and len(expected) == 1 and values_match(got, expected[0])
    )
    return "passed" if ok else "wrong_answer"


async def score_code(
    code: str | None, tests: list[CodeTest], config: CodeRewardConfig = CodeRewardConfig()
) -> CodeScore:
    """Run `code` on `tests` (at most config.max_tests of them) and score it."""
    tests = select_tests(tests, config.max_tests)
    if code is None:
        return CodeScore(0.0, 0, len(tests), (), "no_code")
    outcomes: list[str] = []
    for test in tests:
        outcomes.append(await run_test(code, test, config))
        if config.all_or_nothing and outcomes[-1] != "passed":
            break
    passed = outcomes.count("passed")
    failures = [o for o in outcomes if o != "passed"]
    if config.all_or_nothing:
        reward = 1.0 if passed == len(tests) else 0.0
    else:
        reward = passed / len(tests)
    return CodeScore(reward, passed, len(tests), tuple(outcomes), failures[0] if failures else "passed")


def score_completion(completion: str, answer: Any, config: CodeRewardConfig = CodeRewardConfig()) -> CodeScore:
    """`score_code` on the completion's extracted code, from synchronous code (runs an event loop;
    from async code await `score_code` instead). ValueError if the tests are unreadable."""
    tests = parse_tests(answer)
    return asyncio.run(score_code(extract_code(completion), tests, config))


def make_code_reward(config: CodeRewardConfig) -> Callable[[str, str], float]:
    """A reward fn `(completion, answer) -> float` with `config`; the reason of every score is
    counted in `reason_counts()` and logged at debug level."""

    def reward(completion: str, answer: str) -> float:
        score = score_completion(completion, answer, config)
        _REASONS[score.reason] += 1
        log.debug("code reward %.3f (%d/%d passed; %s)", score.reward, score.passed, score.total, score.reason)
        return score.reward

    return reward


def reason_counts() -> dict[str, int]:
    """How many completions this process scored, by reason (passed, no_code, timeout, ...)."""
    return dict(_REASONS)


code_reward = make_code_reward(CodeRewardConfig())
code_reward.__doc__ = "All-or-nothing code reward (DeepCoder): 1.0 if the code passes every test, else 0.0."
code_reward_fraction = make_code_reward(CodeRewardConfig(all_or_nothing=False))
code_reward_fraction.__doc__ = "Fraction of the tests the code passes (every test is run)."
