"""The math reward: pull the final answer out of a completion and check it with math_verify.

Pure functions. They run inside `tools/reward_pool.py`'s worker processes, which bound their
time: sympy-based verification can take unbounded time on adversarial output.
"""

from __future__ import annotations

import logging
import re
import threading

# The builtin-name table and the resolver live in api/reward_fns.py; re-exported for old imports.
from areal_graph.api.reward_fns import BUILTIN_REWARD_FNS as BUILTIN_FNS  # noqa: F401
from areal_graph.api.reward_fns import resolve_reward_fn  # noqa: F401

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- answer extraction
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*\$?([^\n$]*?)\$?\s*(?:\.\s*)?$", re.IGNORECASE)


def _braced(text: str, open_index: int) -> str | None:
    """Content of the brace group opening at text[open_index] ('{'); None if never closed."""
    depth = 0
    i = open_index
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2  # an escaped brace \{ or \} is content, not structure
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None


def extract_final_answer(text: str) -> str | None:
    """The final answer of a completion, or None if it states none.

    1. The content of the LAST closed `\\boxed{...}` (or `\\fbox{...}`), nested braces allowed.
       An unclosed last box is skipped in favour of an earlier closed one.
    2. Without a closed box: the text after the last "####" on its line (GSM8K's marker, which
       verl's GSM8K prompt asks for: "output the final answer after '####'").
    3. Else the text after the last "answer is" / "answer:" on its line (models asked to
       "state the answer" often write it that way).
    2 and 3 strip surrounding `$` and a final full stop.
    There is deliberately no "last number in the text" fallback: it rewards answers the
    model never committed to (e.g. an intermediate result), which RL quickly learns to exploit.
    """
    if not text:
        return None
    for match in reversed(list(_BOXED.finditer(text))):
        content = _braced(text, match.end() - 1)
        if content is not None:
            content = content.strip()
            return content or None
    marked = [line.rsplit("####", 1)[1] for line in text.splitlines() if "####" in line]
    if marked:
        answer = marked[-1].strip().strip("$").strip().rstrip(".").strip()
        return answer or None
    last_line_hits = [m for line in text.splitlines() if (m := _ANSWER_IS.search(line.strip()))]
    if last_line_hits:
        answer = last_line_hits[-1].group(1).strip().rstrip(".").strip()
        return answer or None
    return None


def _as_latex(answer: str) -> str:
    """Wrap a bare answer in $...$ so math_verify's LaTeX parser reads it (it then also reads
    plain forms such as 1/2, 0.5, -3, 1,000)."""
    answer = answer.strip()
    if _UNESCAPED_DOLLAR.search(answer) or "\\boxed" in answer or "\\(" in answer or "\\[" in answer:
        return answer
    return f"${answer}$"


def _math_verify_timeout() -> int | None:
    # SIGALRM only works in the main thread; elsewhere run without math_verify's own timeout
    # (the RewardPool's per-item timeout still bounds the time).
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_reward(completion: str, ground_truth: str) -> float:
    """1.0 if the completion's final answer (see `extract_final_answer`) equals `ground_truth`
    mathematically (math_verify: fractions, decimals, LaTeX, sets, intervals, percent), else 0.0."""
    from math_verify import parse, verify

    answer = extract_final_answer(completion)
    if answer is None or not ground_truth or not ground_truth.strip():
        return 0.0
    t = _math_verify_timeout()
    gold = parse(_as_latex(ground_truth), parsing_timeout=t)
    pred = parse(_as_latex(answer), parsing_timeout=t)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=t) else 0.0
