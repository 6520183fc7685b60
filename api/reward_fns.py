"""Reward functions by name: the builtin names a reward node's `fn:` accepts, and the resolver.

One table, read by validation (`graph/kinds/rewards.py`), the reward pool (`tools/reward_pool.py`)
and evaluation, so adding a builtin reward is one line here. It lives in api/ (which imports
nothing else of areal_graph) so that graph/ and tools/ can read it without importing the
reward implementations, which may themselves use tools/ (the code reward runs the sandbox).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from areal_graph.api.imports import import_object

BUILTIN_REWARD_FNS: dict[str, str] = {
    "math_verify": "areal_graph.nodes.math_reward:math_reward",
    "code": "areal_graph.nodes.code_reward:code_reward",  # all-or-nothing over the tests (DeepCoder)
    "code_fraction": "areal_graph.nodes.code_reward:code_reward_fraction",  # fraction of tests passed
    "agent": "areal_graph.nodes.agent_reward:agent_reward",  # the reward the agent gave its episode
    "reasoning_gym": "areal_graph.nodes.reasoning_gym_reward:reasoning_gym_reward",  # the task's own scorer
}


def resolve_reward_fn(path: str) -> Callable[..., float]:  # (completion, answer[, episode=])
    """A reward function from a builtin name (see BUILTIN_REWARD_FNS) or an import path "module:function"."""
    path = BUILTIN_REWARD_FNS.get(path, path)
    if ":" not in str(path):
        raise ValueError(
            f"reward fn {path!r}: expected a builtin name {sorted(BUILTIN_REWARD_FNS)} or 'module:function'"
        )
    fn = import_object(path, what="reward fn")
    if not callable(fn):
        raise ValueError(f"reward fn {path!r} is not callable")
    return fn  # type: ignore[return-value]


def wants_episode(fn: Callable) -> bool:
    """Whether a reward fn takes the episode (a parameter named `episode`, or **kwargs): see api/episode.py."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(p.name == "episode" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
