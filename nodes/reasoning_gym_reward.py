"""`fn: reasoning_gym`: a reasoning-gym task's own scorer as the reward.

The row's answer (data/reasoning_gym.py) holds the dataset name and the entry; the scorer gets
the model's final answer: the last `<answer>...</answer>` (reasoning-gym's convention), else
the last `\\boxed{...}` or "the answer is ..." (the builtin kits' style), else the last line.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

from areal_graph.nodes.math_reward import extract_final_answer


@functools.lru_cache(maxsize=64)
def _scorer(name: str) -> Callable[[str | None, dict[str, Any]], float]:
    from reasoning_gym import get_score_answer_fn

    return get_score_answer_fn(name)


def final_answer(completion: str) -> str:
    """The part of `completion` a reasoning-gym scorer should see."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    found = extract_final_answer(completion)
    if found is not None:
        return found.strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def reasoning_gym_reward(completion: str, answer: str) -> float:
    """The task's score (0..1) of the final answer in `completion`."""
    try:
        payload = json.loads(answer)
        name, entry = payload["reasoning_gym"], payload["entry"]
    except (ValueError, TypeError, KeyError):
        raise ValueError("fn: reasoning_gym scores rows of a reasoning_gym:<dataset> dataset; this answer is "
                         f"not one: {answer[:80]!r}") from None
    return float(_scorer(name)(final_answer(completion), entry))
