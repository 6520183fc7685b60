"""Lagged models' servers: copies of the policy that load the actor's weights every N versions.

A workflow may declare `models.<name>.lagged: {refresh_every: N, servers: S}` (graph/spec.py
`LaggedSpec`): a copy of the policy a rollout plays against (TextArenaSelfPlay's
`opponent: model:<name>`). Why servers of its own rather than a second weight set inside the
policy's engines: an engine owns one model, one KV cache, one version stamped on every token
and one swap path, and vLLM and SGLang have no second set at all; a group of ordinary
inference servers gets launch, health, restart, the checked load and the trace as they are.

The executor keeps one `LaggedGroup` per lagged model: its server names (`lagged-<name>-<i>`),
a transport of its own (weight_sync.py `choose_weight_sync(..., group=name)`: a restarted server
of the group replays the version the group committed, never a file the policy's servers have
moved past) and its `ServerWeights`. After every sync of the policy's servers to version v the
group asks `due(v)`: it loads v when v is a multiple of N. Its servers start on the actor's
path, which is version 0, so a fresh run loads nothing until version N.

A resume at version V (`areal-graph run --resume`): the servers start on the actor's path
again, and the version they held before the stop (V - V % N) is gone with the old process.
When that version is 0 they already hold it; otherwise the group loads V itself, the nearest
it can get, and stands for the refresh V - V % N until the next multiple of N. So across a
resume the copy is up to V % N versions fresher than the cadence says; between resumes it is
exact. The staleness bound and behaviour log-probs of the trained seats do not depend on it:
the copy's tokens reach them only as text (workflows/rollout/textarena_selfplay.py).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from areal_graph.graph.kinds.common import lagged_models
from areal_graph.graph.spec import WorkflowSpec
from areal_graph.runtime.orchestration.server_weights import ServerWeights
from areal_graph.runtime.orchestration.weight_sync import WeightSync

log = logging.getLogger(__name__)

PREFIX = "lagged-"  # a lagged server's process name: lagged-<model>-<i>


def lagged_server_names(spec: WorkflowSpec) -> dict[str, list[str]]:
    """Each lagged model -> its servers' process names, in file order."""
    out: dict[str, list[str]] = {}
    for name in lagged_models(spec):
        lagged = spec.models[name].lagged
        assert lagged is not None
        out[name] = [f"{PREFIX}{name}-{i}" for i in range(lagged.servers)]
    return out


@dataclasses.dataclass
class LaggedGroup:
    """One lagged model's servers and what they hold (see module docstring).

    `stands_for`: the refresh (a multiple of `every`) whose weights the servers play as;
    `version`: the version they hold, the same but after a resume."""

    model: str
    every: int
    names: list[str]
    transport: WeightSync
    weights: ServerWeights
    pool: Any = None  # a ServerPool once the servers answer (ProcessExecutor.start)
    stands_for: int = 0
    version: int = 0

    @classmethod
    def build(cls, spec: WorkflowSpec, model: str, names: list[str], transport: WeightSync) -> LaggedGroup:
        lagged = spec.models[model].lagged
        if lagged is None:
            raise ValueError(f"model '{model}' is not lagged")
        return cls(model, lagged.refresh_every, list(names), transport, ServerWeights(transport, names))

    def refresh_of(self, version: int) -> int:
        """The refresh that policy version `version` falls under (the last multiple of `every`)."""
        return version - version % self.every

    def due(self, version: int) -> bool:
        """Whether the servers load `version` once the policy's servers hold it."""
        return self.refresh_of(version) != self.stands_for

    def loaded(self, version: int) -> None:
        """Every server of the group holds `version` (checked and committed)."""
        self.stands_for, self.version = self.refresh_of(version), version
        if version != self.stands_for:
            log.warning(
                "lagged model %s: loaded version %d for refresh %d (a resume: version %d's weights are gone); "
                "the next refresh is version %d",
                self.model,
                version,
                self.stands_for,
                self.stands_for,
                self.stands_for + self.every,
            )
        else:
            log.info("lagged model %s now plays version %d", self.model, version)

    def metrics(self) -> dict[str, float]:
        """The version its servers hold, for the step's metrics (`lagged/<model>/version`)."""
        return {f"lagged/{self.model}/version": float(self.version)}
