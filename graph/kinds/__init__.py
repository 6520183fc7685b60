"""The built-in node kinds, by family, and the registry that resolves a node's `kind:`.

Each family module holds its kinds' parameter dataclasses and `NodeKind` entries (see
`graph/kind.py`) side by side. Field names, types and defaults live only there; the loader
reads them (via `dataclasses.fields` and type hints) to validate YAML, so adding a field is
all it takes to make it configurable. Range rules travel in each field's metadata (`check`),
so the rule sits next to the default it constrains. Defaults follow the AReaL paper where it
gives one.

    losses.py     LOSSES (one entry per train loss) and TrainParams
    common.py     shared key names, rule helpers, the actor queries (actor_model, adapter_sync)
    registry.py   BUILTIN_KINDS, resolve_kind, kind_of, model_role
    rollout.py    rollout
    rewards.py    reward, reward_model, judge
    model.py      logprob, value, train
    functions.py  advantage, function

Imports point down that list and never back (tests/test_layout.py checks it, counting imports
inside functions): a family may ask for any node's kind through the registry, and this
`__init__` fills the registry's table, as the package's first act (Python runs it before any
of the package's modules can be used). Adding a built-in kind means adding it to a family (or
a new family module) and to the tuple below; a kind of one's own needs no change here at all:
any module-level `NodeKind`, named in YAML as `kind: package.module:NAME`.

Everything here stays free of torch and gRPC: the CLI validates workflows without them.
"""

from areal_graph.graph.kinds.functions import ADVANTAGE, FUNCTION
from areal_graph.graph.kinds.model import LOGPROB, TRAIN, VALUE
from areal_graph.graph.kinds.registry import BUILTIN_KINDS
from areal_graph.graph.kinds.rewards import JUDGE, REWARD, REWARD_MODEL
from areal_graph.graph.kinds.rollout import ROLLOUT

BUILTIN_KINDS.update(
    {k.name: k for k in (ROLLOUT, REWARD, REWARD_MODEL, JUDGE, LOGPROB, VALUE, ADVANTAGE, TRAIN, FUNCTION)}
)
