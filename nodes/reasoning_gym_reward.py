"""`fn: reasoning_gym`: a reasoning-gym task's own scorer as the reward.

The row's answer (data/reasoning_gym.py) holds the dataset name and the entry; the scorer gets
the model's final answer: the last `<answer>...</answer>` (reasoning-gym's convention), else the
last `\\boxed{...}` (the builtin kits' style), else nothing (None: scored as no answer, as
reasoning-gym's own pipeline scores an answer without its tag). Not the last line: many tasks'
default scorer gives partial credit to any text that contains the oracle answer, and on the
letter-counting task the tiny kit learned within 100 steps to end with a short garbled line
holding a digit ("The answer is1 + 3}.": 1/6 of the credit every time) instead of answering.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from areal_graph.nodes.math_reward import extract_final_answer


@functools.lru_cache(maxsize=64)
def _scorer(name: str) -> Callable[[str | None, dict[str, Any]], float]:
    from reasoning_gym import get_score_answer_fn

    return get_score_answer_fn(name)


def final_answer(completion: str) -> str | None:
    """The part of `completion` a reasoning-gym scorer should see (None: the completion states no
    answer in a form we read)."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    if "\\boxed" not in completion and "\\fbox" not in completion:
        return None  # extract_final_answer would also read "####" and "the answer is": not here
    found = extract_final_answer(completion)
    return found.strip() if found is not None else None


def reasoning_gym_reward(completion: str, answer: str) -> float:
    """The task's score (0..1) of the final answer in `completion`."""
    try:
        payload = json.loads(answer)
        name, entry = payload["reasoning_gym"], payload["entry"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            "fn: reasoning_gym scores rows of a reasoning_gym:<dataset> dataset; this answer is "
            f"not one: {answer[:80]!r}"
        ) from None
    return float(_scorer(name)(final_answer(completion), entry))
