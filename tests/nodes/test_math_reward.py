"""Answer extraction, math_verify scoring on tricky pairs, and the fault-tolerant RewardPool."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from areal_graph.nodes.math_reward import extract_final_answer, math_reward, resolve_reward_fn
from areal_graph.tools.reward_pool import RewardPool, RewardResult

# (completion, ground truth, expected reward)
TRICKY = [
    ("The answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{1/2}", "\\dfrac{1}{2}", 1.0),
    ("\\boxed{-3}", "-3", 1.0),
    ("\\boxed{3}", "-3", 0.0),
    ("\\boxed{-\\frac{2}{3}}", "-2/3", 1.0),
    ("\\boxed{-0.5}", "-\\frac12", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{1000}", "1,000", 1.0),
    ("\\boxed{12,345,678}", "12345678", 1.0),
    ("\\boxed{5.00}", "5", 1.0),
    ("\\boxed{0.333}", "\\frac{1}{3}", 0.0),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),
    ("\\boxed{\\frac{a+b}{\\left\\{c\\right\\}}}", "\\frac{a+b}{c}", 1.0),  # nested + escaped braces
    ("\\boxed{2^{10}}", "1024", 1.0),
    ("\\boxed{1.5\\times 10^{3}}", "1500", 1.0),
    ("\\boxed{x=5}", "5", 1.0),
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{\\$5}", "5", 1.0),
    ("\\boxed{\\pi}", "\\pi", 1.0),
    ("\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1.0),
    ("\\boxed{\\text{(B)}}", "B", 1.0),
    ("first \\boxed{3} then corrected \\boxed{4}", "4", 1.0),  # multiple boxes: the last counts
    ("first \\boxed{3} then corrected \\boxed{4}", "3", 0.0),
    ("\\boxed{7} and then some text after the box", "7", 1.0),
    ("\\boxed{7", "7", 0.0),  # unclosed box
    ("\\boxed{6} but then \\boxed{7", "6", 1.0),  # unclosed last box: the earlier closed one counts
    ("\\boxed{}", "0", 0.0),  # empty box
    ("", "7", 0.0),  # empty output
    ("no answer here, 42 maybe", "42", 0.0),  # no last-number fallback
    ("The answer is 42.", "42", 1.0),
    ("Final answer: $\\frac{3}{4}$", "0.75", 1.0),
    ("\\fbox{9}", "9", 1.0),
    ("\\boxed {12}", "12", 1.0),
    ("\\boxed{3}", "", 0.0),  # empty ground truth never matches
]


@pytest.mark.parametrize("completion,truth,expected", TRICKY)
def test_math_reward_on_tricky_pairs(completion, truth, expected):
    assert math_reward(completion, truth) == expected


def test_table_is_big_and_balanced():
    assert len(TRICKY) >= 25
    assert 5 <= sum(e == 0.0 for *_, e in TRICKY) <= len(TRICKY) - 5


@pytest.mark.parametrize(
    "text,expected",
    [
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("a \\boxed{1} b \\boxed{ {2} } c", "{2}"),
        ("\\boxed{\\}}", "\\}"),
        ("\\boxed{x", None),
        ("", None),
        ("the answer is: 17\nbut wait", "17"),
        ("I think the answer is $-4$.", "-4"),
        ("nothing", None),
        ("48 / 2 = 24 clips in May\n#### 72", "72"),  # GSM8K's marker (verl's GSM8K prompt asks for it)
        ("#### 5\nno, #### 7.", "7"),
        ("#### 3\n\\boxed{4}", "4"),  # a closed box wins
        ("####", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_math_reward_works_off_the_main_thread():
    """math_verify's SIGALRM timeouts raise in threads; math_reward must switch them off there."""
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(math_reward("\\boxed{\\frac{1}{2}}", "0.5")))
    t.start()
    t.join()
    assert out == [1.0]


# ----------------------------------------------------------------------------- user functions for the pool
def raising_reward(completion: str, answer: str) -> float:
    if completion == "boom":
        raise RuntimeError("user reward exploded")
    return 1.0 if completion == answer else 0.0


def hanging_reward(completion: str, answer: str) -> float:
    if completion == "hang":
        while True:
            time.sleep(1)
    return 0.5


def pid_reward(completion: str, answer: str) -> float:
    return float(os.getpid())


def signal_timeout_reward(completion: str, answer: str) -> float:
    """Uses math_verify's signal-based timeout inside the worker: must not raise there."""
    from math_verify import parse, verify

    gold = parse("$" + answer + "$", parsing_timeout=2)
    pred = parse("$" + completion + "$", parsing_timeout=2)
    return 1.0 if verify(gold, pred, timeout_seconds=2) else 0.0


def _fn(name: str) -> str:
    return f"{__name__}:{name}"


# ----------------------------------------------------------------------------- the pool
def test_pool_scores_with_math_verify_in_workers():
    with RewardPool("math_verify", timeout_s=10, num_workers=2) as pool:
        results = pool.score([c for c, _, _ in TRICKY], [t for _, t, _ in TRICKY])
    assert [r.status for r in results] == ["ok"] * len(TRICKY)
    assert [r.reward for r in results] == [e for *_, e in TRICKY]


def test_pool_signal_timeouts_work_in_workers():
    with RewardPool(_fn("signal_timeout_reward"), timeout_s=10, num_workers=1) as pool:
        results = pool.score(["\\frac{1}{2}", "3"], ["0.5", "4"])
    assert results == [RewardResult(1.0, "ok", ""), RewardResult(0.0, "ok", "")]


def test_pool_turns_exceptions_into_zero_and_a_warning(caplog):
    with caplog.at_level(logging.WARNING), RewardPool(_fn("raising_reward"), timeout_s=10, num_workers=2) as pool:
        results = pool.score(["a", "boom", "b"], ["a", "x", "c"])
    assert [r.reward for r in results] == [1.0, 0.0, 0.0]
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert "user reward exploded" in results[1].detail
    assert any("user reward exploded" in rec.getMessage() for rec in caplog.records)


def test_pool_kills_hung_worker_and_keeps_going(caplog):
    with caplog.at_level(logging.WARNING), RewardPool(_fn("hanging_reward"), timeout_s=1.0, num_workers=2) as pool:
        t0 = time.monotonic()
        results = pool.score(["a", "hang", "b", "c", "d"], ["", "", "", "", ""])
        elapsed = time.monotonic() - t0
        assert [r.status for r in results] == ["ok", "timeout", "ok", "ok", "ok"]
        assert [r.reward for r in results] == [0.5, 0.0, 0.5, 0.5, 0.5]
        assert pool.pools_replaced == 1
        assert elapsed < 60  # liveness: the hung call (which never returns) did not block the batch
        # the replaced pool still works
        assert pool.score(["x"], [""]) == [RewardResult(0.5, "ok", "")]
    assert any("timed out" in rec.getMessage() for rec in caplog.records)


def test_pool_scores_calls_from_several_threads_at_once(caplog):
    """The reward host serves several calls at once on one pool. A hung item in one call replaces
    the pool; before the pool was serialised, that killed the other calls' items under them, and
    a future the replaced executor had cancelled (done, but never reported done by `wait`) made
    its call spin forever: a run hung at step 192 with the reward worker at 100% CPU."""
    results: dict[int, list[RewardResult]] = {}

    def call(k: int) -> None:
        batch = ["a", "hang", "b", "c"] if k % 2 else ["a", "b", "c", "d"]
        results[k] = pool.score(batch, [""] * len(batch))

    with caplog.at_level(logging.WARNING), RewardPool(_fn("hanging_reward"), timeout_s=1.0, num_workers=2) as pool:
        threads = [threading.Thread(target=call, args=(k,), daemon=True) for k in range(6)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), "a call never returned"
        elapsed = time.monotonic() - t0
    for k in range(6):
        expected = ["ok", "timeout", "ok", "ok"] if k % 2 else ["ok"] * 4
        assert [r.status for r in results[k]] == expected, (k, results[k])
        assert [r.reward for r in results[k]] == [0.0 if s == "timeout" else 0.5 for s in expected]
    assert pool.pools_replaced == 3 and elapsed < 60


def test_pool_runs_in_other_processes():
    with RewardPool(_fn("pid_reward"), timeout_s=10, num_workers=2) as pool:
        pids = {r.reward for r in pool.score(["a"] * 6, ["a"] * 6)}
    assert os.getpid() not in pids


def test_pool_rejects_bad_arguments():
    with pytest.raises(ValueError, match="module:function"):
        RewardPool("not_a_path")
    with pytest.raises(ValueError, match="no attribute"):
        resolve_reward_fn(_fn("does_not_exist"))
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool("math_verify", timeout_s=0)
    with RewardPool(_fn("raising_reward"), timeout_s=5, num_workers=1) as pool:
        with pytest.raises(ValueError, match="answers"):
            pool.score(["a", "b"], ["a"])
        assert pool.score([], []) == []
