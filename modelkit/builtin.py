"""`builtin:` names: the models and datasets a workflow may name without a path.

`builtin:tiny-arith` (and the other kits of modelkit/recipes.py) resolves to a kit's model
directory, built on first use (modelkit/kit_cache.py); `builtin:tiny-arith-rm` to the reward
model's (modelkit/reward_model.py); `builtin:arith/train` and the like to a kit's data files;
`builtin:code-demo` to a file shipped in the package. `resolve_builtin_paths` is the one place
a workflow's builtin paths resolve: everything after it sees ordinary directories and files.

This module is also the face of the kit machinery for the rest of the package: the CLI,
benchmarks and tests import recipes and the cache from here (the names below).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

import areal_graph.data
from areal_graph.data import generated
from areal_graph.modelkit.kit_cache import Kit, cache_root, ensure_kit, kit_dir, load_kit  # noqa: F401
from areal_graph.modelkit.recipes import (  # noqa: F401
    BUILTIN_DATASETS,
    BUILTIN_KITS,
    PREFIX,
    SHIPPED_DATASETS,
    KitConfig,
    Progress,
    build_kit,
)
from areal_graph.modelkit.reward_model import BUILTIN_REWARD_MODELS, ensure_reward_model


def _builtin_name(spec: str, known: dict, what: str) -> str | None:
    """The entry name of a `builtin:` spec (ValueError naming the builtins if there is no such
    entry); None for any other path."""
    if not str(spec).startswith(PREFIX):
        return None
    name = str(spec)[len(PREFIX) :]
    if name not in known and not (what == "dataset" and name in SHIPPED_DATASETS):
        names = [PREFIX + n for n in (*known, *(SHIPPED_DATASETS if what == "dataset" else ()))]
        near = difflib.get_close_matches(str(spec), names, n=1)
        raise ValueError(
            f"unknown builtin {what} {spec!r}; builtin {what}s: "
            + ", ".join(names)
            + (f" (did you mean {near[0]}?)" if near else "")
        )
    return name


def path_fields(spec: Any) -> list[tuple[str, str, str]]:
    """(field, path, "model" or "dataset") for every model and dataset path `spec` (a
    WorkflowSpec) names."""
    fields = [(f"models.{m.name}.path", str(m.path), "model") for m in spec.models.values()]
    return fields + [
        (f"data.{k}", str(v), "dataset") for k, v in (("train", spec.data.train), ("eval", spec.data.eval)) if v
    ]


def builtin_path_problems(spec: Any) -> list[str]:
    """Every `builtin:` model or dataset path of `spec` (a WorkflowSpec) that names no builtin,
    with its field (and the nearest name), without building anything: a run checks this before
    it makes its folder."""
    known: dict[str, dict[str, Any]] = {"model": {**BUILTIN_KITS, **BUILTIN_REWARD_MODELS}, "dataset": BUILTIN_DATASETS}
    problems = []
    for field, path, what in path_fields(spec):
        try:
            _builtin_name(path, known[what], what)
        except ValueError as err:
            problems.append(f"{field}: {err}")
    return problems


def model_head_dim(path: str) -> int | None:
    """The attention head width of the model at `path` (a `builtin:` kit, whose recipe says it
    without building it, or a directory with config.json); None when it cannot be read."""
    if str(path).startswith(PREFIX):
        kit = BUILTIN_KITS.get(str(path)[len(PREFIX) :])
        return kit.model.hidden_size // kit.model.num_heads if kit is not None else None
    try:
        config = json.loads((Path(path) / "config.json").read_text())
        return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def model_context(path: str) -> int | None:
    """The context (max_position_embeddings) of the model at `path`: a `builtin:` kit's recipe says
    it without building; a directory's config.json; None when neither says."""
    if str(path).startswith(PREFIX):
        kit = BUILTIN_KITS.get(str(path)[len(PREFIX) :])
        return kit.model.max_position_embeddings if kit is not None else None
    try:
        config = json.loads((Path(path) / "config.json").read_text())
        return int(config["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def built_model_dir(path: str) -> Path | None:
    """The local directory of model `path` without building anything: a `builtin:` kit's once
    built (None before), a directory as it is; None for anything else (a hub id)."""
    if str(path).startswith(PREFIX):
        name = str(path)[len(PREFIX) :]
        if name in BUILTIN_REWARD_MODELS or name not in BUILTIN_KITS:
            return None
        kit = load_kit(BUILTIN_KITS[name])
        return kit.model_dir if kit is not None else None
    return Path(path) if Path(path).is_dir() else None


def built_dataset_path(spec: str) -> Path | None:
    """The local file of dataset `spec` without building or generating anything: a shipped file, a
    built kit's split, a path as it is; None for a kit not built yet or a generated dataset."""
    if generated.source_of(spec) is not None:
        return None
    if not str(spec).startswith(PREFIX):
        return Path(spec)
    name = str(spec)[len(PREFIX) :]
    if name in SHIPPED_DATASETS:
        return Path(areal_graph.data.__file__).parent / SHIPPED_DATASETS[name]
    if name not in BUILTIN_DATASETS:
        return None
    kit_name, split = BUILTIN_DATASETS[name]
    kit = load_kit(BUILTIN_KITS[kit_name])
    return kit.data_path(split) if kit is not None else None


def _builtin_kit(spec: str, known: dict, what: str, progress: Progress | None) -> tuple[Kit, str] | None:
    """(built kit, entry name) for a `builtin:` spec; None for any other path."""
    name = _builtin_name(spec, known, what)
    if name is None:
        return None
    kit_name = known[name][0] if what == "dataset" else name
    return ensure_kit(BUILTIN_KITS[kit_name], progress=progress), name


def resolve_model_path(path: str, progress: Progress | None = None) -> Path:
    """`builtin:tiny-arith` -> the kit's model directory (built on first use); `builtin:tiny-arith-rm`
    -> the reward model's (modelkit/reward_model.py); any other path unchanged."""
    name = _builtin_name(path, {**BUILTIN_KITS, **BUILTIN_REWARD_MODELS}, "model")
    if name in BUILTIN_REWARD_MODELS:
        return ensure_reward_model(BUILTIN_REWARD_MODELS[name], progress=progress)
    found = _builtin_kit(path, BUILTIN_KITS, "model", progress)
    return Path(path) if found is None else found[0].model_dir


def resolve_dataset_path(spec: str, progress: Progress | None = None) -> Path:
    """`builtin:arith/train` -> the kit's JSONL file (built on first use); `builtin:code-demo` ->
    the file shipped in the package; `reasoning_gym:<task>?...`, `textarena:<game>?...` -> their rows,
    generated into the kit cache on first use (data/generated.py); any other path unchanged."""
    if generated.source_of(spec) is not None:  # generated once into the kit cache, then an ordinary file
        return generated.materialize(str(spec), cache_root())
    name = str(spec)[len(PREFIX) :] if str(spec).startswith(PREFIX) else None
    if name in SHIPPED_DATASETS:
        return Path(areal_graph.data.__file__).parent / SHIPPED_DATASETS[name]
    found = _builtin_kit(spec, BUILTIN_DATASETS, "dataset", progress)
    return Path(spec) if found is None else found[0].data_path(BUILTIN_DATASETS[found[1]][1])


def resolve_builtin_paths(spec: Any, progress: Progress | None = None) -> Any:
    """`spec` (a WorkflowSpec) with every `builtin:` model and dataset path replaced by the
    local path of its kit, building kits on first use. The one place builtin paths resolve:
    everything after it (executor, workers, servers) sees ordinary directories and files."""
    models = {
        name: dataclasses.replace(m, path=str(resolve_model_path(m.path, progress))) for name, m in spec.models.items()
    }
    data = dataclasses.replace(
        spec.data,
        train=str(resolve_dataset_path(spec.data.train, progress)),
        eval=str(resolve_dataset_path(spec.data.eval, progress)) if spec.data.eval else None,
    )
    return dataclasses.replace(spec, models=models, data=data)
