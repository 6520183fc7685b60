"""A validated spec back to workflow YAML, the form `load_workflow` reads.

Run directories store the workflow they ran this way (`config.yaml`): every default filled
in, `builtin:` names kept, so `areal-graph run --resume RUN_DIR` continues from exactly what
ran, and `areal-graph run RUN_DIR/config.yaml` repeats it. `load_workflow_text(dump(spec))`
gives `spec` back (tests/graph/test_dump.py holds every shipped workflow to that).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from areal_graph.graph.spec import WorkflowSpec


def _plain(value: Any) -> Any:
    """Dataclasses, tuples and dicts as the mappings, lists and scalars YAML writes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def workflow_mapping(spec: WorkflowSpec) -> dict[str, Any]:
    """The workflow file's mapping for `spec` (sections in the usual order)."""
    models = {}
    for name, m in spec.models.items():
        # every field the file can set (a new one is written without touching this): a field left
        # out (LoRA, bf16, a lagged copy) would make `run --resume` continue a different run
        models[name] = {
            f.name: _plain(getattr(m, f.name))
            for f in dataclasses.fields(m)
            if f.name != "name" and getattr(m, f.name) is not None
        }
    nodes = {}
    for name, n in spec.nodes.items():
        entry: dict[str, Any] = {"kind": n.kind}
        if n.model is not None:
            entry["model"] = n.model
        entry.update(_plain(n.params))
        entry["reads"] = list(n.reads)
        entry["writes"] = list(n.writes)
        nodes[name] = entry
    return {
        "name": spec.name,
        **({"python_path": list(spec.python_path)} if spec.python_path else {}),
        "models": models,
        "data": _plain(spec.data),
        "inference": _plain(spec.inference),
        "nodes": nodes,
        "runtime": _plain(spec.runtime),
        **({"resources": _plain(spec.resources)} if spec.resources.pinned else {}),
    }


def dump_workflow(spec: WorkflowSpec, header: str = "") -> str:
    """YAML text of `spec` as a workflow file; `header` lines become leading comments."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.safe_dump(workflow_mapping(spec), sort_keys=False, allow_unicode=True, width=120)
