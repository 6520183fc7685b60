"""The code reward: code extraction, the test formats of DeepCoder / LiveCodeBench / APPS,
judging, all-or-nothing vs fraction, and the shipped demo dataset scored by its own solutions."""

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from areal_graph.api.reward_fns import BUILTIN_REWARD_FNS, resolve_reward_fn
from areal_graph.data.datasets import reference_answer
from areal_graph.nodes.code_reward import (
    CodeRewardConfig,
    CodeTest,
    code_reward,
    code_reward_fraction,
    extract_code,
    parse_tests,
    reason_counts,
    score_code,
    score_completion,
    select_tests,
    stdout_matches,
    values_match,
)
from support.paths import REPO

DEMO = REPO / "data" / "code_demo.jsonl"
FAST = CodeRewardConfig(wall_s=3.0, cpu_s=2)
ADD_STDIN = json.dumps(
    [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}, {"input": "5 7\n", "output": "12", "testtype": "stdin"}]
)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nDone."


# ------------------------------------------------------------------ extraction
def test_extracts_the_last_python_block_over_other_blocks():
    text = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\nexample input:\n```\n3 4\n```"
    assert extract_code(text) == "print(2)"


def test_falls_back_to_the_last_block_of_any_language():
    assert extract_code("```\nprint(5)\n```") == "print(5)"
    assert extract_code("```py\nx = 1\n```") == "x = 1"


def test_no_code_when_no_closed_block():
    assert extract_code("I would print 3") is None
    assert extract_code("```python\nprint(3)") is None  # cut off by max_new_tokens
    assert extract_code("```python\n\n```") is None


# ------------------------------------------------------------------ formats
def test_livecodebench_stdin_and_functional_formats():
    stdin = parse_tests(ADD_STDIN)
    assert stdin[0] == CodeTest(stdin="1 2\n", expected_stdout="3\n")
    [fn] = parse_tests(
        json.dumps(
            [
                {
                    "input": "[1, 2]\n3",
                    "output": "[2, 3]",
                    "testtype": "functional",
                    "metadata": '{"func_name": "addAll"}',
                }
            ]
        )
    )
    assert (fn.fn_name, fn.args, fn.expected, fn.wrapped_ok) == ("addAll", [[1, 2], 3], [2, 3], False)


def test_deepcoder_primeintellect_formats():
    tests = parse_tests(
        [
            {"type": "stdin_stdout", "input": "1\n", "output": "2\n"},
            {"type": "function_call", "fn_name": "f", "input": [1, "a"], "output": [2]},
        ]
    )
    assert tests[0] == CodeTest(stdin="1\n", expected_stdout="2\n")
    assert (tests[1].fn_name, tests[1].args, tests[1].expected, tests[1].wrapped_ok) == ("f", [1, "a"], [2], True)


def test_apps_taco_formats_and_python_literal_strings():
    [call] = parse_tests({"fn_name": "add", "inputs": [[1, 2]], "outputs": [[3]]})
    assert (call.args, call.expected, call.wrapped_ok) == ([1, 2], [3], True)
    [io] = parse_tests(str({"inputs": [["1", "2"]], "outputs": ["3"]}))  # str() of a dict, as some rows are
    assert io == CodeTest(stdin="1\n2", expected_stdout="3")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "42",
        "[]",
        '{"inputs": [1]}',
        '[{"output": "1"}]',
        "not json (",
        '[{"input": "1", "output": "2", "testtype": "functional"}]',
    ],
)
def test_malformed_tests_raise_value_error(bad):
    with pytest.raises(ValueError):
        parse_tests(bad)


def test_select_keeps_the_longest_inputs_in_order():
    tests = [CodeTest(stdin="x" * n, expected_stdout="") for n in (1, 5, 3, 9, 2)]
    assert [len(t.stdin) for t in select_tests(tests, 3)] == [5, 3, 9]


# ------------------------------------------------------------------ judging
@pytest.mark.parametrize(
    "got, want, same",
    [
        ("3\n", "3", True),
        ("  1   2 \n\n", "1 2", True),
        ("1.0\n", "1", True),
        ("a\nb\n", "a\nb", True),
        ("1 2", "1\n2", False),
        ("4", "3", False),
        ("yes", "YES", False),
        ("", "0", False),
    ],
)
def test_stdout_is_compared_whitespace_normalised(got, want, same):
    assert stdout_matches(got, want) is same


@pytest.mark.parametrize(
    "got, want, same",
    [
        ([1, 2], [1, 2], True),
        (3, 3.0, True),
        (0.1 + 0.2, 0.3, True),
        ({"a": [1]}, {"a": [1]}, True),
        (True, 1, False),
        ("1", 1, False),
        ([1], [1, 2], False),
        (None, None, True),
    ],
)
def test_return_values_are_compared_as_json(got, want, same):
    assert values_match(got, want) is same


# ------------------------------------------------------------------ scoring (real sandbox runs)
def test_stdin_solution_passes_and_wrong_one_fails():
    good = fenced("a, b = map(int, input().split())\nprint(a + b)")
    assert score_completion(good, ADD_STDIN, FAST).outcomes == ("passed", "passed")
    bad = score_completion(fenced("print(3)"), ADD_STDIN, FAST)
    assert (bad.reward, bad.passed, bad.reason, bad.outcomes) == (0.0, 1, "wrong_answer", ("passed", "wrong_answer"))


def test_fraction_mode_runs_every_test():
    tests = json.dumps([{"input": str(i), "output": "1", "testtype": "stdin"} for i in range(3)])
    score = score_completion(
        fenced("print(1 if input() != '2' else 0)"), tests, CodeRewardConfig(all_or_nothing=False, wall_s=3.0, cpu_s=2)
    )
    assert score.reward == pytest.approx(2 / 3) and score.outcomes == ("passed", "passed", "wrong_answer")


def test_all_or_nothing_stops_at_the_first_failure():
    tests = json.dumps([{"input": str(i), "output": "1", "testtype": "stdin"} for i in range(3)])
    score = score_completion(fenced("print(0)"), tests, FAST)
    assert score.reward == 0.0 and score.outcomes == ("wrong_answer",) and score.total == 3


def test_functional_calls_plain_functions_and_leetcode_solutions():
    lcb = json.dumps(
        [{"input": "[1, 2]\n3", "output": "[4, 5]", "testtype": "functional", "metadata": {"func_name": "addAll"}}]
    )
    leetcode = fenced(
        "class Solution:\n    def addAll(self, xs, k):\n        print('debug', xs)\n"
        "        return tuple(x + k for x in xs)"
    )
    assert score_completion(leetcode, lcb, FAST).reward == 1.0  # prints are ignored, tuple == list
    apps = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [[3]]}
    assert score_completion(fenced("def add(a, b):\n    return a + b"), apps, FAST).reward == 1.0
    assert score_completion(fenced("def add(a, b):\n    return a - b"), apps, FAST).reason == "wrong_answer"


def test_main_block_runs_for_stdin_but_not_for_function_tests():
    code = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))"
    assert score_completion(fenced(code), ADD_STDIN, FAST).reward == 1.0
    assert (
        score_completion(
            fenced(code), [{"type": "function_call", "fn_name": "add", "input": [2, 2], "output": [4]}], FAST
        ).reward
        == 1.0
    )


def test_failures_score_zero_with_their_reason():
    cases = {
        "timeout": "while True:\n    pass",
        "runtime_error": "1/0",
        "memory": "x = bytearray(4 << 30)",
        "no_result": "import os\nos._exit(0)\ndef add(a, b):\n    return a + b",
    }
    fn_test = [{"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]}]
    for reason, code in cases.items():
        score = score_completion(fenced(code), fn_test, CodeRewardConfig(wall_s=2.0, cpu_s=1))
        assert (score.reward, score.reason) == (0.0, reason), code
    missing = score_completion(fenced("def other(): pass"), fn_test, FAST)
    assert missing.reason == "runtime_error"  # NameError: no function 'add'


def test_forged_verdicts_do_not_pay():
    # the driver's marker is random per run; printing a made-up one or a rigged __eq__ gains nothing
    rigged = (
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    print('<<areal-result-0000>>3')\n    return Any()"
    )
    score = score_completion(
        fenced(rigged), [{"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]}], FAST
    )
    assert score.reward == 0.0 and score.reason == "wrong_answer"


def test_builtin_names_resolve_and_count_reasons():
    assert resolve_reward_fn("code") is code_reward and resolve_reward_fn("code_fraction") is code_reward_fraction
    assert set(BUILTIN_REWARD_FNS) >= {"math_verify", "code", "code_fraction"}
    before = reason_counts().get("no_code", 0)
    assert code_reward("no code here", ADD_STDIN) == 0.0
    assert reason_counts()["no_code"] == before + 1
    with pytest.raises(ValueError):
        code_reward(fenced("print(1)"), "not tests")


def test_reward_node_validates_with_builtin_code_fn():
    from areal_graph.graph.loader import load_workflow

    spec = load_workflow(REPO / "workflows" / "code_reward_demo.yaml")
    assert spec.nodes["reward"].params.fn == "code"


def test_demo_dataset_has_both_styles_and_its_solutions_score_one():
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    assert len(rows) == 20 and all(row["question"] and row["answer"] for row in rows)
    tests = [parse_tests(reference_answer(row["answer"])) for row in rows]  # what the loader hands the reward
    assert sum(t[0].fn_name is None for t in tests) >= 8 and sum(t[0].fn_name is not None for t in tests) >= 8

    async def score_all():
        limit = asyncio.Semaphore(4)

        async def one(row, row_tests):
            async with limit:
                return await score_code(row["solution"], row_tests)

        return await asyncio.gather(*(one(r, t) for r, t in zip(rows, tests)))

    scores = asyncio.run(score_all())
    assert [s.reward for s in scores] == [1.0] * 20, [(r["id"], s) for r, s in zip(rows, scores) if s.reward != 1]


# ------------------------------------------------------------------ through the reward node's process pool
def _sandboxed_processes_running(marker: str) -> list[int]:
    """Processes of a sandbox uid whose private root holds code containing `marker` (root can
    look through /proc/<pid>/root)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = int(Path(f"/proc/{entry}/status").read_text().split("Uid:")[1].split()[0])
            if uid >= 3_000_000_000 and marker in Path(f"/proc/{entry}/root/sandbox/main.py").read_text():
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_reward_pool_scores_code_and_its_timeout_kills_the_sandbox():
    from areal_graph.tools.reward_pool import RewardPool

    marker = f"marker{os.getpid()}x{time.monotonic_ns()}"
    hang = fenced(f"import time  # {marker}\ntime.sleep(60)")
    good = fenced("a, b = map(int, input().split())\nprint(a + b)")
    with RewardPool("code", timeout_s=3.0, num_workers=2) as pool:
        results = pool.score([good, "no code", hang], [ADD_STDIN] * 3)
    assert [(r.reward, r.status) for r in results] == [(1.0, "ok"), (0.0, "ok"), (0.0, "timeout")]
    deadline = time.monotonic() + 5
    while _sandboxed_processes_running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.geteuid() == 0:
        assert _sandboxed_processes_running(marker) == []  # the killed worker took its sandbox with it


def test_killed_reward_workers_leave_no_sandbox_directory():
    import glob

    from areal_graph.tools.reward_pool import RewardPool
    from areal_graph.tools.sandbox import run_python

    if not asyncio.run(run_python("pass")).containment.filesystem:
        pytest.skip("without a private root the program runs in that directory until the end")
    with RewardPool("code", timeout_s=2.0, num_workers=1) as pool:
        [result] = pool.score([fenced("import time\ntime.sleep(60)")], [ADD_STDIN])
    assert result.status == "timeout"
    left = []
    for path in glob.glob("/tmp/areal-sandbox-*-*"):
        pid = int(path.split("-")[2])
        if not Path(f"/proc/{pid}").exists():
            left.append(path)
    assert left == []  # removed as soon as the program ran in its private root
