"""Load a workflow YAML into a validated `WorkflowSpec`, reporting every problem at once.

Why collect instead of raising on the first problem: a user fixing a workflow wants the
whole list in one go, each entry naming file, YAML line, node and field. Line numbers come
from composing the YAML node tree (which keeps marks) rather than from `safe_load`.

The schema is not written down here: it is read from the dataclasses in `spec.py` and
`node_kinds.py` (field names, type hints, defaults, `check` metadata).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, Union

import networkx as nx

from areal_graph.api.imports import ImportPathError, import_object
from areal_graph.graph import spec as S
from areal_graph.graph.dag import graph_from_nodes, key_producers
from areal_graph.graph.kind import ImportRef
from areal_graph.graph.node_kinds import BUILTIN_KINDS, IMPLICIT_ROLLOUT_KEYS, POLICY_LOSSES, ROLLOUT_WRITES, trains_policy
from areal_graph.graph.plan import assign_phases
from areal_graph.graph.registry import UnknownKind, kind_of, resolve_kind
from areal_graph.graph.overrides import apply_overrides, parse_override  # noqa: F401  (parse_override re-exported)
from areal_graph.graph.problems import Problem, WorkflowError, node_of, suggest
from areal_graph.graph.spec import REQUIRED_SECTIONS, SECTIONS
from areal_graph.graph.yaml_lines import MAX_FILE_BYTES, Path_, compose_with_lines, decode_text

__all__ = ["Problem", "WorkflowError", "load_workflow", "load_workflow_text", "parse_override"]

log = logging.getLogger(__name__)

# Keys of a node mapping that are not kind parameters.
NODE_KEYS = ("kind", "model", "reads", "writes")


class _Bad(Exception):
    """Internal: a value does not fit its declared type."""


# ============================================================================ type conversion
def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin in (list, tuple):
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def _got(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping", type(None): "null"}.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, (list, dict)) or len(repr(value)) < 40 else ""
    return f"{kind} {shown}".strip()


class _Validator:
    def __init__(self, file: str, lines: Mapping[Path_, int], origins: Mapping[Path_, str]) -> None:
        self.file = file
        self.lines = lines
        self.origins = origins
        self.problems: list[Problem] = []

    # ------------------------------------------------------------------ reporting
    def line(self, path: Path_) -> int | None:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return None

    def report(self, path: Path_, message: str) -> None:
        """Record a problem at `path` (a tuple into the raw mapping)."""
        node = node_of(path)
        fld = ".".join(str(p) for p in (path[2:] if node is not None else path)) or None
        origin = next((self.origins[path[:c]] for c in range(len(path), 0, -1) if path[:c] in self.origins), None)
        if origin:
            message += f" (set by override '{origin}')"
        self.problems.append(Problem(self.file, self.line(path), node, fld, message))

    # ------------------------------------------------------------------ values
    def convert(self, tp: Any, value: Any, path: Path_) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any:
            return value
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            inner = [a for a in args if a is not type(None)]
            return self.convert(inner[0], value, path) if len(inner) == 1 else value
        if origin is Literal:
            if value not in args:
                raise _Bad(f"must be {_type_name(tp)}, got {_got(value)}{suggest(value, map(str, args))}")
            return value
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise _Bad(f"expected a mapping of {tp.__name__} fields, got {_got(value)}")
            built = self.build(tp, value, path)
            if built is None:
                raise _Reported()
            return built
        if origin in (list, tuple) or tp in (list, tuple):
            if not isinstance(value, (list, tuple)):
                raise _Bad(f"expected a list, got {_got(value)}")
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(value) != len(args):
                    raise _Bad(f"expected a list of {len(args)} items, got {len(value)}")
                elem_types = list(args)
            else:
                elem_types = [args[0] if args else Any] * len(value)
            items = []
            for i, (et, item) in enumerate(zip(elem_types, value)):
                try:
                    items.append(self.convert(et, item, path + (i,)))
                except _Bad as err:
                    raise _Bad(f"item {i}: {err}") from None
            return tuple(items) if origin is tuple else items
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                raise _Bad(f"expected a mapping, got {_got(value)}")
            return dict(value)
        if tp is bool:
            if not isinstance(value, bool):
                raise _Bad(f"expected true/false, got {_got(value)}")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Bad(f"expected an integer, got {_got(value)}")
            return value
        if tp is float:
            if isinstance(value, str):
                # YAML 1.1 reads `2e-5` (no dot) as a string; accept it as the number it means.
                try:
                    return float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _Bad(f"expected a number, got {_got(value)}")
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise _Bad(f"expected a string, got {_got(value)}")
            return value
        return value

    def build(self, cls: type, raw: Mapping[str, Any], path: Path_, inject: Mapping[str, Any] | None = None,
              also_allowed: Sequence[str] = ()) -> Any:
        """Validate `raw` against dataclass `cls`; returns the instance, or None if it had problems."""
        inject = dict(inject or {})
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in inject}
        before = len(self.problems)
        for key in raw:
            if path + (key,) in MOVED_FIELDS:
                self.report(path + (key,), f"moved: {MOVED_FIELDS[path + (key,)]}")
            elif key not in fields and key not in also_allowed:
                options = list(fields) + list(also_allowed)
                self.report(path + (key,), f"unknown field '{key}'{suggest(key, options)}; "
                                           f"allowed: {', '.join(options) or 'none'}")
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    self.report(path + (name,), f"missing required field '{name}'")
                continue
            try:
                value = self.convert(hints[name], raw[name], path + (name,))
            except _Bad as err:
                self.report(path + (name,), f"{err}")
                continue
            except _Reported:
                continue
            check = f.metadata.get("check")
            if check is not None and value is not None:
                why = check(value)
                if why:
                    self.report(path + (name,), f"{why}, got {value!r}")
                    continue
            values[name] = value
        if len(self.problems) > before:
            return None
        return cls(**inject, **values)


class _Reported(Exception):
    """Internal: a nested value had problems, already reported."""


# ============================================================================ the workflow
def _validate(raw: Any, v: _Validator) -> S.WorkflowSpec | None:
    if not isinstance(raw, dict):
        v.report((), f"a workflow must be a mapping with sections {', '.join(SECTIONS)}, got {_got(raw)}")
        return None
    for key in raw:
        if key not in SECTIONS:
            v.report((key,), f"unknown section '{key}'{suggest(key, SECTIONS)}; allowed: {', '.join(SECTIONS)}")
    for key in REQUIRED_SECTIONS:
        if key not in raw or raw[key] is None:
            v.report((key,), f"missing required section '{key}'")

    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        v.report(("name",), f"expected a string, got {_got(name)}")

    def section(key: str, cls: type) -> Any:
        value = raw.get(key)
        if value is None:
            return cls() if key not in REQUIRED_SECTIONS else None
        if not isinstance(value, dict):
            v.report((key,), f"expected a mapping, got {_got(value)}")
            return None
        return v.build(cls, value, (key,))

    data = section("data", S.DataSpec)
    inference = section("inference", S.InferenceSpec)
    runtime = section("runtime", S.RuntimeSpec)
    models = _models(raw.get("models"), v)
    declared = list(raw["models"]) if isinstance(raw.get("models"), dict) else None
    nodes, complete = _nodes(raw.get("nodes"), declared, v)
    # Graph rules need every node (a partial set gives bogus "nobody writes" problems); they
    # run against defaults for sections that had problems of their own (already reported).
    draft = S.WorkflowSpec(name=name if isinstance(name, str) else "?", models=models or {},
                           data=data or S.DataSpec(train="?"), inference=inference or S.InferenceSpec(),
                           nodes=nodes, runtime=runtime or S.RuntimeSpec(), source=v.file)
    if complete:
        _check_graph(draft, models is not None, v)
    _check_runtime(draft, runtime is not None, v)
    if v.problems:
        return None
    return draft


def _models(raw: Any, v: _Validator) -> dict[str, S.ModelSpec] | None:
    """The models that parsed; None when the section itself is unusable (skip model checks)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        v.report(("models",), f"expected a non-empty mapping of model name -> {{path, train}}, got {_got(raw)}")
        return None
    models: dict[str, S.ModelSpec] = {}
    for name, body in raw.items():
        if not isinstance(body, dict):
            v.report(("models", name), f"model '{name}' must be a mapping with 'path' (and optional 'train'), "
                                       f"got {_got(body)}")
            continue
        model = v.build(S.ModelSpec, body, ("models", name), inject={"name": name})
        if model is not None:
            models[name] = model
    return models


def _nodes(raw: Any, models: list[str] | None,
           v: _Validator) -> tuple[dict[str, S.NodeSpec], bool]:
    """The nodes that parsed, and whether all of them did."""
    if raw is None:
        return {}, False
    if not isinstance(raw, dict) or not raw:
        v.report(("nodes",), f"expected a non-empty mapping of node name -> node, got {_got(raw)}")
        return {}, False
    nodes: dict[str, S.NodeSpec] = {}
    complete = True
    for name, body in raw.items():
        path = ("nodes", name)
        if not isinstance(body, dict):
            v.report(path, f"node '{name}' must be a mapping with a 'kind', got {_got(body)}")
            complete = False
            continue
        node = _node(str(name), body, models, v)
        if node is None:
            complete = False
        else:
            nodes[node.name] = node
    return nodes, complete


# Fields of a section that now live elsewhere: (section, field) -> where, and how to write it.
MOVED_FIELDS = {("runtime", "dp_size"): "data parallelism is set per model, as models.<name>.dp_size "
                                        "(e.g. models.actor.dp_size: 2)"}
# Fields that were renamed: the old name gets a message saying what it is now.
RENAMED = {"workflow": "rollout_class", "workflow_args": "rollout_args"}


def _node(name: str, body: dict, models: list[str] | None, v: _Validator) -> S.NodeSpec | None:
    path = ("nodes", name)
    before = len(v.problems)
    kind_name = body.get("kind")
    if kind_name is None:
        v.report(path + ("kind",), f"missing required field 'kind' (one of {', '.join(BUILTIN_KINDS)}, "
                                   "or 'package.module:NAME' of a NodeKind)")
        return None
    try:
        kind = resolve_kind(kind_name)
    except UnknownKind as err:
        v.report(path + ("kind",), str(err))
        return None

    model = body.get("model")
    if model is not None and not isinstance(model, str):
        v.report(path + ("model",), f"expected a model name (string), got {_got(model)}")
    elif kind.model == "required" and model is None:
        v.report(path + ("model",), f"a {kind.name} node needs 'model' (one of: {', '.join(models or {}) or 'none'})")
    elif kind.model == "forbidden" and model is not None:
        v.report(path + ("model",), f"a {kind.name} node takes no 'model'")
    elif model is not None and models is not None and model not in models:
        v.report(path + ("model",), f"unknown model '{model}'{suggest(model, models)}; "
                                   f"models: {', '.join(models)}")

    def keys(field: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = body.get(field)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            v.report(path + (field,), f"expected a list of key names, got {_got(value)}")
            return default
        if len(set(value)) != len(value):
            v.report(path + (field,), f"lists a key twice: {value}")
        return tuple(value)

    reads = keys("reads", ())
    writes = keys("writes", kind.default_writes)
    for old, new in RENAMED.items():
        if old in body:
            v.report(path + (old,), f"'{old}' was renamed to '{new}' (the YAML file is the workflow; "
                                    f"the Python class is the rollout class)")
    param_raw = {k: val for k, val in body.items() if k not in NODE_KEYS and k not in RENAMED}
    params = v.build(kind.params, param_raw, path, also_allowed=NODE_KEYS)
    if params is None or len(v.problems) > before:
        return None
    node = S.NodeSpec(name=name, kind=str(kind_name), model=model, reads=reads, writes=writes, params=params,
                      line=v.line(path))
    for ref in kind.imports(node):
        why = check_import(ref)
        if why:
            v.report(path + (ref.field,), why)
    return node


def _check_runtime(spec: S.WorkflowSpec, runtime_ok: bool, v: _Validator) -> None:
    """Relations between runtime fields and the source node: whole prompt groups, concurrency."""
    if runtime_ok:
        _check_launcher(spec, v)
    sources = [n for n in spec.nodes.values() if kind_of(n).source]
    if not runtime_ok or not sources:
        return
    rt, src = spec.runtime, sources[0]
    g = getattr(src.params, "group_size", 1)
    if rt.batch_size % g:
        v.report(("runtime", "batch_size"), f"must be a multiple of nodes.{src.name}.group_size "
                                            f"({g}) so that whole prompt groups are trained, got {rt.batch_size}")
    if rt.max_concurrent_rollouts < g:
        v.report(("runtime", "max_concurrent_rollouts"),
                 f"must be at least nodes.{src.name}.group_size ({g}): a prompt group is generated at once, "
                 f"got {rt.max_concurrent_rollouts}")
    if rt.weight_sync == "memory" and spec.inference.backend == "sglang":  # backends/: shared_memory_weights
        v.report(("runtime", "weight_sync"), "'memory' needs inference.backend 'embedded' or 'vllm' (an sglang "
                                             "server loads weights from disk); use 'disk' or 'auto'")
    python = spec.inference.python
    if python is not None and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        v.report(("inference", "python"), f"{python!r} is not an executable file (relative paths are from the "
                                          f"directory the run starts in: {os.getcwd()})")


def _check_launcher(spec: S.WorkflowSpec, v: _Validator) -> None:
    """The launcher fields: ray is installed when named; its address only with it; Ray picks the GPU."""
    import importlib.util

    rt = spec.runtime
    if rt.launcher != "ray":
        if rt.ray_address is not None:
            v.report(("runtime", "ray_address"), f"is used only with runtime.launcher 'ray' (it is '{rt.launcher}')")
        return
    if importlib.util.find_spec("ray") is None:
        v.report(("runtime", "launcher"), "'ray' needs the ray package: pip install 'areal-graph[ray]'")
    for name, model in spec.models.items():
        if model.device.startswith("cuda:"):
            v.report(("models", name, "device"), f"with runtime.launcher 'ray' write 'cuda', not '{model.device}': "
                                                 "Ray assigns each process its GPUs (CUDA_VISIBLE_DEVICES)")
        elif model.device == "cuda" and model.dp_size > 1:
            v.report(("models", name, "dp_size"), "data-parallel ranks on CUDA under runtime.launcher 'ray' are not "
                                                  "built yet (Ray shows each rank only its own GPU); use the local "
                                                  "launcher, or dp_size 1")


def _check_graph(spec: S.WorkflowSpec, models_ok: bool, v: _Validator) -> None:
    """Rules that involve several nodes: keys, writers, cycles, phases, and each kind's own rules."""
    nodes = spec.nodes
    sources = [n for n in nodes.values() if kind_of(n).source]
    if not sources:
        v.report(("nodes",), "the workflow needs exactly one node of kind 'rollout' (it has none)")
    for extra in sources[1:]:
        v.report(("nodes", extra.name, "kind"), f"a second rollout node (the first is '{sources[0].name}'); "
                                                f"a workflow has exactly one")
    _check_trained_models(spec, v)

    producers = key_producers(nodes)
    for key, writers in producers.items():
        for dup in writers[1:]:
            v.report(("nodes", dup, "writes"), f"key '{key}' is also written by node '{writers[0]}'; "
                                               f"each key has exactly one writer")
    available = sorted(producers)
    if not sources:  # already reported; don't repeat it for every key the rollout would provide
        available = sorted(set(available) | set(ROLLOUT_WRITES) | set(IMPLICIT_ROLLOUT_KEYS))
    for node in nodes.values():
        path = ("nodes", node.name)
        for i, key in enumerate(node.reads):
            if key not in available:
                v.report(path + ("reads", i), f"reads key '{key}' which no node writes{suggest(key, available)}; "
                                              f"available keys: {', '.join(available)}")
        if models_ok or kind_of(node).model == "forbidden":
            for issue in kind_of(node).rules(node, spec):
                v.report(path + issue.where, issue.message)
    graph = graph_from_nodes(nodes)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        if sources:
            for name, issue in assign_phases(spec)[1]:
                v.report(("nodes", name) + issue.where, issue.message)
        return
    names = [u for u, _ in cycle]
    v.report(("nodes", names[0], "reads"), "dependency cycle: " + " -> ".join(names + [names[0]])
             + " (weight updates back to the rollout are implicit; keys may not flow backwards)")


def _check_trained_models(spec: S.WorkflowSpec, v: _Validator) -> None:
    """One policy model (the one the inference servers serve); no model both policy and critic."""
    policy = [n for n in spec.nodes.values() if trains_policy(n)]
    if not policy:
        v.report(("nodes",), "the workflow needs a 'train' node with a policy loss "
                             f"({' or '.join(POLICY_LOSSES)}) to train the actor")
    for extra in policy[1:]:
        if extra.model != policy[0].model:
            v.report(("nodes", extra.name, "model"), f"trains model '{extra.model}' with a policy loss, but node "
                     f"'{policy[0].name}' trains '{policy[0].model}': the inference servers serve one policy")
    roles: dict[str, dict[str, str]] = {}
    for node in spec.nodes.values():
        role = kind_of(node).model_role(node)
        if node.model is not None and role is not None:
            roles.setdefault(node.model, {}).setdefault(role, node.name)
    for model, by_role in roles.items():
        if len(by_role) > 1:
            v.report(("nodes", by_role["critic"], "model"),
                     f"model '{model}' is used as a critic here and as a policy by node '{by_role['policy']}': "
                     "give the critic its own entry under `models:`")


def check_import(ref: ImportRef) -> str | None:
    """Import what a parameter names and check it is what the kind expects; None when fine."""
    try:
        obj = import_object(ref.path, what=ref.field)
    except ImportPathError as err:
        return str(err)
    if ref.expect == "callable" and not callable(obj):
        return f"{ref.path} is a {type(obj).__name__}, not a function"
    if ref.expect == "class" and not isinstance(obj, type):
        return f"{ref.path} is not a class"
    if ref.expect == "rollout_class":
        from areal_graph.api.rollout import Rollout

        if not (isinstance(obj, type) and issubclass(obj, Rollout)):
            return f"{ref.path} is not a subclass of areal_graph.api.rollout.Rollout"
    problem = None if ref.kwargs is None else _check_signature(obj, ref)
    if problem is None and ref.expect == "rollout_class":
        problem = obj.check_args(dict(ref.kwargs or {}))  # the class's own checks of its arguments
    return problem


def _check_signature(obj: Any, ref: ImportRef) -> str | None:
    """Can `obj` be called the way the engine will call it (positional inputs + configured kwargs)?"""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None  # builtins without a signature: nothing to check
    kwargs = dict(ref.kwargs or {})
    kwargs.update({k: None for k in ref.supplied if k in sig.parameters and k not in kwargs})
    try:
        sig.bind(*([None] * ref.positional), **kwargs)
    except TypeError as err:
        what = "constructor" if isinstance(obj, type) else "function"
        given = ", ".join(kwargs) or "no keyword arguments"
        return f"{ref.path}: its {what} {sig} cannot be called with {given}: {err}"
    return None


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
    v = _Validator(file, lines, origins)
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
        raise WorkflowError([Problem(str(path), None, None, None, f"cannot read workflow file: {err.strerror or err}")]) from None
    return load_workflow_text(decode_text(data, str(path)), overrides, file=str(path))
