"""What a node kind is: one `NodeKind` entry says everything the engine needs to know about it.

An entry carries the kind's parameter dataclass, which process hosts its nodes and with
what object (`hosting`, `host_args`), how a node is called (`call`), its validation rules
(`rules`), which side of the sample buffer it runs on (`phase`), and the import paths its
parameters name (checked by `validate` before anything starts). Validation, placement,
worker configuration and dispatch all read the entry; nothing else switches on a kind's name.

Entries are torch-free and name their implementation by import path ("module:Class"), so
`areal-graph validate` runs without torch and a worker imports only what it hosts. The
built-in kinds live by family in `graph/kinds/`; a user kind is any module-level `NodeKind`,
named in YAML as `kind: package.module:NAME` (see `graph/kinds/registry.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from areal_graph.graph.spec import NodeSpec, WorkflowSpec

Phase = Literal["generation", "training"]
PHASES: tuple[Phase, ...] = ("generation", "training")
CONTROLLER = "controller"  # the process name of nodes the controller runs itself


@dataclass(frozen=True)
class Hosting:
    """Where a node runs: a process, and the named object in it that serves the node's calls.

    Several nodes may share one object (a model's logprob, value and train nodes share the
    model's `ModelHost`, so proximal log-probs come from exactly the weights about to be
    trained). `exclusive` objects serve one call at a time (they hold a model); the others
    may serve many concurrently (reward scoring of many prompt groups). `role` decides the
    process's thread budget: "model" processes get the training threads, others one thread.
    `ranks` > 1: the process is rank 0 of that many data-parallel processes (a model's
    `dp_size`); the launcher starts the others beside it and the object relays to them.
    """

    process: str
    obj: str
    impl: str  # "package.module:Class", constructed once per (process, obj)
    exclusive: bool = False
    role: Literal["model", "rollout", "stateless", "controller"] = "stateless"
    ranks: int = 1


@dataclass(frozen=True)
class Call:
    """One invocation of a hosted object: `obj.<method>(batch, **args)` -> PackedBatch [, stats]."""

    method: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunInfo:
    """What only a started run knows, for building host objects (torch-free, JSON-able)."""

    model_paths: Mapping[str, str]  # model name -> resolved local directory
    server_urls: Sequence[str] = ()
    # a lagged model's name -> its servers' URLs (`models.<name>.lagged`), for the rollout
    served_urls: Mapping[str, Sequence[str]] = field(default_factory=dict)
    train_threads: int = 1
    run_dir: str = ""


@dataclass(frozen=True)
class Issue:
    """A validation problem found by a kind's rules: `where` is a path inside the node's mapping."""

    where: tuple[str | int, ...]
    message: str


@dataclass(frozen=True)
class ImportRef:
    """A parameter that names Python code: validate imports it and checks what it is."""

    field: str  # the parameter's name, e.g. "rollout_class"
    path: str  # "package.module:attr"
    expect: Literal["class", "callable", "rollout_class"] = "callable"
    # when set, the object must accept being called as obj(*positional, **kwargs) with these
    # keyword arguments; `supplied` names arguments the engine adds when the object takes them
    kwargs: Mapping[str, Any] | None = None
    positional: int = 0
    supplied: tuple[str, ...] = ()


def no_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    return []


def no_imports(node: NodeSpec) -> list[ImportRef]:
    return []


def fuses_nothing(node: NodeSpec, spec: WorkflowSpec) -> str | None:
    return None


@dataclass(frozen=True)
class NodeKind:
    """The single registry entry of a node kind (see module docstring)."""

    name: str
    params: type  # a dataclass; YAML keys besides kind/model/reads/writes are its fields
    doc: str
    model: Literal["required", "forbidden", "optional"]
    # "generation" (before the sample buffer), "training" (after it), or "auto": decided per
    # node from the params' `phase` field and what the node reads (function nodes)
    phase: Phase | Literal["auto"]
    hosting: Callable[[NodeSpec, WorkflowSpec], Hosting]
    host_args: Callable[[NodeSpec, WorkflowSpec, RunInfo], dict[str, Any]]
    call: Callable[[NodeSpec, WorkflowSpec], Call]
    rules: Callable[[NodeSpec, WorkflowSpec], list[Issue]] = no_rules
    imports: Callable[[NodeSpec], list[ImportRef]] = no_imports
    default_writes: tuple[str, ...] = ()
    # the node's output may hold fewer sequences than its input (whole prompt groups dropped)
    may_drop: bool = False
    # the node updates a model's weights (a train node); it writes no keys
    trains: bool = False
    # which role the node uses its model in ("policy": log-probs / policy loss, "critic":
    # values / value loss): one model may not serve both
    model_role: Callable[[NodeSpec], str | None] = lambda node: None
    # the node scores answers: an evaluation runs it (and what it reads) on greedy answers
    scores: bool = False
    # the source of the graph: reads prompts from `data`, provides the implicit keys
    # (group_id, sample_id, answer); a workflow has exactly one
    source: bool = False
    # the name of another node whose output this node computes itself when the run is
    # configured so (e.g. the proximal log-probs from the training forward); that node is
    # then skipped, and the plan and the trace say so
    fuses: Callable[[NodeSpec, WorkflowSpec], str | None] = fuses_nothing
    # keys the node is given whenever the batch holds them, without declaring them in `reads`
    # (a train node's `versions`, for its staleness-split mismatch stats)
    optional_reads: tuple[str, ...] = ()
    # each call is given `policy_version=` (the version of the weights it works on), so that
    # the node can tell fresh tokens (sampled by those weights) from stale ones
    versioned_call: bool = False
