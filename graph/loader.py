"""Load a workflow YAML into a validated `WorkflowSpec`, reporting every problem at once.

Why collect instead of raising on the first problem: a user fixing a workflow wants the
whole list in one go, each entry naming file, YAML line, node and field. Line numbers come
from composing the YAML node tree (which keeps marks) rather than from `safe_load`.

The schema is not written down here: it is read from the dataclasses in `spec.py` and
`kinds/` (field names, type hints, defaults, `check` metadata) by `typed_yaml.py`;
the rules across fields, nodes and this machine are `workflow_rules.py`. This module reads
the file, applies overrides, and runs the two in order.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from areal_graph.api.imports import add_import_roots, import_root_of
from areal_graph.graph import spec as S
from areal_graph.graph.kinds.registry import BUILTIN_KINDS, UnknownKind, resolve_kind
from areal_graph.graph.overrides import apply_overrides, parse_override  # noqa: F401  (parse_override re-exported)
from areal_graph.graph.problems import Problem, WorkflowError, suggest
from areal_graph.graph.spec import REQUIRED_SECTIONS, SECTIONS
from areal_graph.graph.typed_yaml import Validator, described
from areal_graph.graph.workflow_rules import check_graph, check_import, check_resources, check_runtime
from areal_graph.graph.yaml_lines import MAX_FILE_BYTES, Path_, compose_with_lines, decode_text

__all__ = ["Problem", "WorkflowError", "load_workflow", "load_workflow_text", "parse_override"]

log = logging.getLogger(__name__)

# Keys of a node mapping that are not kind parameters.
NODE_KEYS = ("kind", "model", "reads", "writes")


# ============================================================================ the workflow
def _validate(raw: Any, v: Validator) -> S.WorkflowSpec | None:
    if not isinstance(raw, dict):
        v.report((), f"a workflow must be a mapping with sections {', '.join(SECTIONS)}, got {described(raw)}")
        return None
    for key in raw:
        if key not in SECTIONS:
            v.report((key,), f"unknown section '{key}'{suggest(key, SECTIONS)}; allowed: {', '.join(SECTIONS)}")
    for key in REQUIRED_SECTIONS:
        if key not in raw or raw[key] is None:
            v.report((key,), f"missing required section '{key}'")

    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        v.report(("name",), f"expected a string, got {described(name)}")
    elif isinstance(name, str) and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        # it names files and folders (the run directory, `graph` outputs): no path of its own
        v.report(("name",), f"must be letters, digits, '_', '.' and '-' (a file name), got {name!r}")

    python_path = _python_path(raw.get("python_path"), v)

    def section(key: str, cls: type) -> Any:
        value = raw.get(key)
        if value is None:
            return cls() if key not in REQUIRED_SECTIONS else None
        if not isinstance(value, dict):
            v.report((key,), f"expected a mapping, got {described(value)}")
            return None
        return v.build(cls, value, (key,))

    data = section("data", S.DataSpec)
    inference = section("inference", S.InferenceSpec)
    runtime = section("runtime", S.RuntimeSpec)
    resources = section("resources", S.ResourcesSpec)
    models = _models(raw.get("models"), v)
    declared = list(raw["models"]) if isinstance(raw.get("models"), dict) else None
    nodes, complete = _nodes(raw.get("nodes"), declared, v)
    # Graph rules need every node (a partial set gives bogus "nobody writes" problems); they
    # run against defaults for sections that had problems of their own (already reported).
    draft = S.WorkflowSpec(
        name=name if isinstance(name, str) else "?",
        models=models or {},
        data=data or S.DataSpec(train="?"),
        inference=inference or S.InferenceSpec(),
        nodes=nodes,
        runtime=runtime or S.RuntimeSpec(),
        resources=resources or S.ResourcesSpec(),
        source=v.file,
        python_path=python_path,
    )
    if complete:
        check_graph(draft, models is not None, v)
    check_runtime(draft, runtime is not None, v)
    if resources is not None:
        check_resources(draft, v)
    if v.problems:
        return None
    # `auto` settings resolved here, once: nothing past the loader sees them
    kv = S.resolve_kv_on_update(draft.inference.kv_on_update, draft.inference.backend, draft.runtime.max_staleness)
    return dataclasses.replace(draft, inference=dataclasses.replace(draft.inference, kv_on_update=kv))


def _python_path(raw: Any, v: Validator) -> tuple[str, ...]:
    """The folders user code is imported from (the workflow's own folder first, then `python_path`,
    relative to the workflow file), put on the import path now, before any import is checked."""
    from_file = Path(v.file).is_file()  # else YAML text given directly (tests): no folder of its own
    here = Path(v.file).parent if from_file else Path.cwd()
    own = import_root_of(here) if from_file else None
    folders: list[Path] = [own] if own is not None else []
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
            v.report(
                ("python_path",), f"expected a list of folders (relative to the workflow file), got {described(raw)}"
            )
        else:
            for entry in raw:
                folder = (here / entry).resolve()
                if not folder.is_dir():
                    v.report(("python_path",), f"{entry!r} is not a folder ({folder})")
                elif folder not in folders:
                    folders.append(folder)
    add_import_roots(folders)
    return tuple(str(f) for f in folders)


def _models(raw: Any, v: Validator) -> dict[str, S.ModelSpec] | None:
    """The models that parsed; None when the section itself is unusable (skip model checks)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        v.report(("models",), f"expected a non-empty mapping of model name -> {{path, train}}, got {described(raw)}")
        return None
    models: dict[str, S.ModelSpec] = {}
    for name, body in raw.items():
        if not isinstance(body, dict):
            v.report(
                ("models", name),
                f"model '{name}' must be a mapping with 'path' (and optional 'train'), got {described(body)}",
            )
            continue
        model = v.build(S.ModelSpec, body, ("models", name), inject={"name": name})
        if model is not None:
            models[name] = model
    return models


def _nodes(raw: Any, models: list[str] | None, v: Validator) -> tuple[dict[str, S.NodeSpec], bool]:
    """The nodes that parsed, and whether all of them did."""
    if raw is None:
        return {}, False
    if not isinstance(raw, dict) or not raw:
        v.report(("nodes",), f"expected a non-empty mapping of node name -> node, got {described(raw)}")
        return {}, False
    nodes: dict[str, S.NodeSpec] = {}
    complete = True
    for name, body in raw.items():
        path = ("nodes", name)
        if not isinstance(body, dict):
            v.report(path, f"node '{name}' must be a mapping with a 'kind', got {described(body)}")
            complete = False
            continue
        node = _node(str(name), body, models, v)
        if node is None:
            complete = False
        else:
            nodes[node.name] = node
    return nodes, complete


# Fields of a section that now live elsewhere: (section, field) -> where, and how to write it.
MOVED_FIELDS = {
    ("runtime", "dp_size"): "data parallelism is set per model, as models.<name>.dp_size (e.g. models.actor.dp_size: 2)"
}
# Fields that were renamed: the old name gets a message saying what it is now.
RENAMED = {"workflow": "rollout_class", "workflow_args": "rollout_args"}


def _node(name: str, body: dict, models: list[str] | None, v: Validator) -> S.NodeSpec | None:
    path = ("nodes", name)
    before = len(v.problems)
    kind_name = body.get("kind")
    if kind_name is None:
        v.report(
            path + ("kind",),
            f"missing required field 'kind' (one of {', '.join(BUILTIN_KINDS)}, "
            "or 'package.module:NAME' of a NodeKind)",
        )
        return None
    try:
        kind = resolve_kind(kind_name)
    except UnknownKind as err:
        v.report(path + ("kind",), str(err))
        return None

    model = body.get("model")
    if model is not None and not isinstance(model, str):
        v.report(path + ("model",), f"expected a model name (string), got {described(model)}")
    elif kind.model == "required" and model is None:
        v.report(path + ("model",), f"a {kind.name} node needs 'model' (one of: {', '.join(models or {}) or 'none'})")
    elif kind.model == "forbidden" and model is not None:
        v.report(path + ("model",), f"a {kind.name} node takes no 'model'")
    elif model is not None and models is not None and model not in models:
        v.report(path + ("model",), f"unknown model '{model}'{suggest(model, models)}; models: {', '.join(models)}")

    def keys(field: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = body.get(field)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            v.report(path + (field,), f"expected a list of key names, got {described(value)}")
            return default
        if len(set(value)) != len(value):
            v.report(path + (field,), f"lists a key twice: {value}")
        return tuple(value)

    reads = keys("reads", ())
    writes = keys("writes", kind.default_writes)
    for old, new in RENAMED.items():
        if old in body:
            v.report(
                path + (old,),
                f"'{old}' was renamed to '{new}' (the YAML file is the workflow; "
                f"the Python class is the rollout class)",
            )
    param_raw = {k: val for k, val in body.items() if k not in NODE_KEYS and k not in RENAMED}
    params = v.build(kind.params, param_raw, path, also_allowed=NODE_KEYS)
    if params is None or len(v.problems) > before:
        return None
    node = S.NodeSpec(
        name=name, kind=str(kind_name), model=model, reads=reads, writes=writes, params=params, line=v.line(path)
    )
    for ref in kind.imports(node):
        why = check_import(ref)
        if why:
            v.report(path + (ref.field,), why)
    return node


# ============================================================================ entry points
def load_workflow_text(text: str, overrides: Iterable[str] = (), file: str = "<string>") -> S.WorkflowSpec:
    """Like `load_workflow`, from YAML text (tests, and specs stored in run directories)."""
    raw, lines = compose_with_lines(text, file)
    problems: list[Problem] = []
    origins: dict[Path_, str] = {}
    overrides = list(overrides)
    if overrides:
        if isinstance(raw, dict):
            problems, origins = apply_overrides(raw, overrides, file)
    v = Validator(file, lines, origins, moved=MOVED_FIELDS)
    v.problems.extend(problems)
    spec = _validate(raw, v)
    if v.problems:
        raise WorkflowError(sorted(v.problems, key=lambda p: (p.line is None, p.line or 0)))
    assert spec is not None
    return spec


def load_workflow(path: str | Path, overrides: Iterable[str] = ()) -> S.WorkflowSpec:
    """Read, override and validate a workflow file; raise `WorkflowError` listing every problem."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # bounded: the size check needs one byte past the limit
    except OSError as err:
        raise WorkflowError(
            [Problem(str(path), None, None, None, f"cannot read workflow file: {err.strerror or err}")]
        ) from None
    return load_workflow_text(decode_text(data, str(path)), overrides, file=str(path))
