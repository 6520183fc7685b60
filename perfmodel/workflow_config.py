"""A workflow (with its overrides) as the simulator's settings: what `simulate` and `tune` vary.

Why apart from the simulator: the simulator knows nothing of YAML or specs (it simulates
settings); this module reads them off a validated `WorkflowSpec` with the same rules the run
itself uses (runtime/orchestration/placement.py: which cores and threads each side gets).
"""

from __future__ import annotations

from typing import Any

from areal_graph.graph.plan import build_plan
from areal_graph.perfmodel.cost_model import CostModel, SidePlacement
from areal_graph.perfmodel.simulator import SimConfig
from areal_graph.runtime.orchestration.placement import plan_placement, usable_cores


def config_from_spec(spec: Any, costs: CostModel, machine_cores: list[int] | None = None) -> SimConfig:
    """The simulator's settings for `spec` on this machine (or on `machine_cores`)."""
    src = next(n for n in spec.nodes.values() if n.kind == "rollout")
    # one decode thread for models the run gives one (placement.SMALL_MODEL_PARAMS); the
    # cost model knows what the calibration run used
    places = plan_placement(spec, build_plan(spec), small_model=costs.inference.threads == 1)
    model = next((p for n, p in places.items() if p.side == "training"), None)

    def side(p: Any) -> SidePlacement:
        return SidePlacement(list(p.cores) if p.cores and spec.resources.pinned else None, p.threads)

    rt = spec.runtime
    return SimConfig(
        steps=rt.steps,
        batch_size=rt.batch_size,
        group_size=src.params.group_size,
        max_staleness=rt.max_staleness,
        max_concurrent=rt.max_concurrent_rollouts,
        max_running=spec.inference.max_running_requests,
        servers=spec.inference.servers,
        max_new_tokens=src.params.sampling.max_new_tokens,
        max_tokens_per_microbatch=rt.max_tokens_per_microbatch,
        kv_on_update=spec.inference.kv_on_update,
        machine_cores=list(machine_cores or usable_cores()),
        inference=side(places["inference-0"]),
        training=side(model) if model is not None else SidePlacement(),
        other=side(places["controller"]) if spec.resources.other.cores is not None else SidePlacement(None, 1),
        eval_every=rt.eval_every,
        eval_size=spec.data.eval_size or 0,
        autopilot=rt.autopilot,
        # the embedded engine's speculation (other backends speculate by their own arguments, unpriced)
        speculative=bool(spec.inference.speculative.enabled) and spec.inference.backend == "embedded",
        max_draft=spec.inference.speculative.max_draft,
        speculative_max_rows=spec.inference.speculative.max_rows,
        seed=rt.seed,
        label=spec.name,
    )
