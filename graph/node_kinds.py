"""The old import path of the built-in node kinds, which now live by family in `graph/kinds/`.

Kept so that code written against it keeps working (runtime/orchestration/process_executor.py
imports `adapter_sync` from here); new code imports from the family modules directly. This
module only re-exports: nothing in the package below it imports it.
"""

from __future__ import annotations

from areal_graph.graph.kinds.common import (  # noqa: F401
    HOSTS,
    IMPLICIT_ROLLOUT_KEYS,
    ROLLOUT_WRITES,
    actor_model,
    adapter_sync,
    trains_policy,
)
from areal_graph.graph.kinds.functions import ADVANTAGE, FUNCTION, AdvantageParams, FunctionParams  # noqa: F401
from areal_graph.graph.kinds.losses import LOSSES, POLICY_LOSSES, PROX_LOSSES, TrainParams  # noqa: F401
from areal_graph.graph.kinds.model import LOGPROB, TRAIN, VALUE, LogprobParams, ValueParams, fused_prox_node  # noqa: F401
from areal_graph.graph.kinds.registry import BUILTIN_KINDS, model_role  # noqa: F401
from areal_graph.graph.kinds.rewards import (  # noqa: F401
    JUDGE,
    REWARD,
    REWARD_MODEL,
    JudgeParams,
    RewardModelParams,
    RewardParams,
)
from areal_graph.graph.kinds.rollout import ROLLOUT, RolloutParams, rollout_temperature  # noqa: F401
