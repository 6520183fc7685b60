"""The rules a workflow must keep beyond its schema: across fields and sections (runtime,
launcher), across nodes (the graph: one writer per key, no cycles, phases, one policy), and
on this machine (import paths resolve, functions take what they are given).

Each check reports every problem it finds to the `Validator` (graph/typed_yaml.py) and
raises nothing: graph/loader.py runs them after the schema and collects the lot.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from typing import Any

import networkx as nx

from areal_graph.api.imports import ImportPathError, import_object
from areal_graph.api.rollout import Rollout
from areal_graph.graph import spec as S
from areal_graph.graph.dag import graph_from_nodes, key_producers
from areal_graph.graph.kind import ImportRef
from areal_graph.graph.kinds.common import (
    IMPLICIT_ROLLOUT_KEYS,
    ROLLOUT_WRITES,
    SERVED_MODEL,
    actor_model,
    adapter_sync,
    lagged_models,
    served_model_refs,
    trains_policy,
)
from areal_graph.graph.kinds.losses import POLICY_LOSSES
from areal_graph.graph.kinds.registry import kind_of, model_role
from areal_graph.graph.plan import assign_phases
from areal_graph.graph.problems import suggest
from areal_graph.graph.typed_yaml import Validator


def check_runtime(spec: S.WorkflowSpec, runtime_ok: bool, v: Validator) -> None:
    """Relations between runtime fields and the source node: whole prompt groups, concurrency."""
    check_speculative(spec, v)
    if runtime_ok:
        check_launcher(spec, v)
        check_loggers(spec, v)
        check_checkpoints(spec, v)
    sources = [n for n in spec.nodes.values() if kind_of(n).source]
    if not runtime_ok or not sources:
        return
    rt, src = spec.runtime, sources[0]
    g = getattr(src.params, "group_size", 1)
    if rt.batch_size % g:
        v.report(
            ("runtime", "batch_size"),
            f"must be a multiple of nodes.{src.name}.group_size "
            f"({g}) so that whole prompt groups are trained, got {rt.batch_size}",
        )
    if rt.max_concurrent_rollouts < g:
        v.report(
            ("runtime", "max_concurrent_rollouts"),
            f"must be at least nodes.{src.name}.group_size ({g}): a prompt group is generated at once, "
            f"got {rt.max_concurrent_rollouts}",
        )
    if rt.weight_sync == "memory" and spec.inference.backend == "sglang":  # backends/: shared_memory_weights
        v.report(
            ("runtime", "weight_sync"),
            "'memory' needs inference.backend 'embedded' or 'vllm' (an sglang "
            "server loads weights from disk); use 'disk' or 'auto'",
        )
    if spec.inference.kv_on_update in ("keep", "wait") and spec.inference.backend != "embedded":
        v.report(
            ("inference", "kv_on_update"),
            f"'{spec.inference.kv_on_update}' is built for the embedded engine only; the "
            f"{spec.inference.backend} backend recomputes the KV cache of requests "
            "in flight at a weight update",
        )
    python = spec.inference.python
    if python is not None and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        v.report(
            ("inference", "python"),
            f"{python!r} is not an executable file (relative paths are from the "
            f"directory the run starts in: {os.getcwd()})",
        )


# How to turn on each server's own speculative decoding: the closest it has to ours (n-gram
# lookup, no draft model), set through inference.args.
OWN_SPECULATION = {
    "sglang": "SGLang's --speculative-algorithm server argument (its n-gram lookup: inference.args "
    "speculative_algorithm: NGRAM, with its speculative_* settings)",
    "vllm": 'vLLM\'s --speculative-config with method "ngram" (inference.args speculative_config: '
    '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\')',
}


def check_speculative(spec: S.WorkflowSpec, v: Validator) -> None:
    """inference.speculative: max_match against min_match (a rule across two fields, so not a
    field's own check), and speculation asked of a backend that is not ours. Why refuse there
    rather than pass it on: proposals drawn from the prompt group's other answers and the kept
    answers to a prompt are the embedded engine's; SGLang and vLLM speculate their own way, with
    their own settings, so the workflow says which it means."""
    sp = spec.inference.speculative
    if sp.max_match < sp.min_match:
        v.report(
            ("inference", "speculative", "max_match"),
            f"must be >= inference.speculative.min_match ({sp.min_match}): the longest suffix looked up "
            f"cannot be shorter than the shortest, got {sp.max_match}",
        )
    backend = spec.inference.backend
    if sp.enabled and backend in OWN_SPECULATION:
        v.report(
            ("inference", "speculative", "enabled"),
            f"speculative decoding from the prompt group's answers is the embedded engine's; the {backend} "
            f"backend has speculative decoding of its own: set enabled: false and turn it on with "
            f"{OWN_SPECULATION[backend]}",
        )
    default_shadow = S.SpeculativeSpec().shadow_every
    if backend in OWN_SPECULATION and sp.shadow_every not in (0, default_shadow):
        # the default is left alone (it is every workflow's); a value written on purpose would
        # count nothing on those servers, so it is named rather than ignored
        v.report(
            ("inference", "speculative", "shadow_every"),
            f"counting what speculation would accept is the embedded engine's; the {backend} backend "
            f"does not count it: remove the field (or set 0), got {sp.shadow_every}",
        )


def check_launcher(spec: S.WorkflowSpec, v: Validator) -> None:
    """The launcher fields: ray is installed when named; its address only with it; Ray picks the GPU."""
    rt = spec.runtime
    if rt.launcher != "ray":
        if rt.ray_address is not None:
            v.report(("runtime", "ray_address"), f"is used only with runtime.launcher 'ray' (it is '{rt.launcher}')")
        return
    if importlib.util.find_spec("ray") is None:
        v.report(("runtime", "launcher"), "'ray' needs the ray package: pip install 'areal-graph[ray]'")
    for name, model in spec.models.items():
        if model.device.startswith("cuda:"):
            v.report(
                ("models", name, "device"),
                f"with runtime.launcher 'ray' write 'cuda', not '{model.device}': "
                "Ray assigns each process its GPUs (CUDA_VISIBLE_DEVICES)",
            )
        elif model.device == "cuda" and model.dp_size > 1:
            v.report(
                ("models", name, "dp_size"),
                "data-parallel ranks on CUDA under runtime.launcher 'ray' are not "
                "built yet (Ray shows each rank only its own GPU); use the local "
                "launcher, or dp_size 1",
            )


def check_loggers(spec: S.WorkflowSpec, v: Validator) -> None:
    """A tracker's settings without the tracker in runtime.loggers: set for nothing, most likely
    because the logger was forgotten (whether its package is installed is cli/preflight.py's)."""
    rt = spec.runtime
    unused = [
        ("wandb_project", "wandb", rt.wandb_project != S.RuntimeSpec.wandb_project),
        ("mlflow_tracking_uri", "mlflow", rt.mlflow_tracking_uri is not None),
        ("mlflow_experiment", "mlflow", rt.mlflow_experiment is not None),
    ]
    for name, logger, is_set in unused:
        if is_set and logger not in rt.loggers:
            v.report(
                ("runtime", name), f"is used only with '{logger}' in runtime.loggers (it is [{', '.join(rt.loggers)}])"
            )


def check_checkpoints(spec: S.WorkflowSpec, v: Validator) -> None:
    """runtime.keep_checkpoints / keep_checkpoints_every against the fields they depend on. Why
    here and not in the field's own check: keeping none is wrong for a reason that lives in another
    field (auto_resume), and a setting that can never act (no checkpoints, milestones that are
    never saved) is a mistake the user should hear about before the run, not find out after it."""
    rt = spec.runtime
    keep, every = rt.keep_checkpoints, rt.keep_checkpoints_every
    if keep is not None:
        if keep == 0 and rt.auto_resume > 0:
            v.report(
                ("runtime", "keep_checkpoints"),
                f"must be >= 1, got 0: runtime.auto_resume ({rt.auto_resume}) resumes from the last complete "
                "checkpoint, so runtime.keep_checkpoints must keep at least 1 (null keeps all)",
            )
        elif keep < 1:
            v.report(
                ("runtime", "keep_checkpoints"),
                f"must be >= 1 (the newest complete checkpoints kept; null keeps all), got {keep}",
            )
        if rt.save_every <= 0:
            v.report(
                ("runtime", "keep_checkpoints"),
                "does nothing without runtime.save_every > 0 (no checkpoint is "
                "written); set save_every, or leave keep_checkpoints out",
            )
    if every is None:
        return
    if keep is None:
        v.report(
            ("runtime", "keep_checkpoints_every"),
            "is used only with runtime.keep_checkpoints (without it every checkpoint is kept)",
        )
    elif rt.save_every > 0 and every % rt.save_every:
        v.report(
            ("runtime", "keep_checkpoints_every"),
            f"must be a multiple of runtime.save_every ({rt.save_every}), got {every}: checkpoints are written "
            f"only at multiples of save_every, so most multiples of {every} would have no checkpoint to keep "
            "as a milestone",
        )


def check_graph(spec: S.WorkflowSpec, models_ok: bool, v: Validator) -> None:
    """Rules that involve several nodes: keys, writers, cycles, phases, and each kind's own rules."""
    nodes = spec.nodes
    sources = [n for n in nodes.values() if kind_of(n).source]
    if not sources:
        v.report(("nodes",), "the workflow needs exactly one node of kind 'rollout' (it has none)")
    for extra in sources[1:]:
        v.report(
            ("nodes", extra.name, "kind"),
            f"a second rollout node (the first is '{sources[0].name}'); a workflow has exactly one",
        )
    check_trained_models(spec, v)
    check_lora(spec, v)
    check_lagged(spec, v)
    check_megatron(spec, v)

    producers = key_producers(nodes)
    for key, writers in producers.items():
        for dup in writers[1:]:
            v.report(
                ("nodes", dup, "writes"),
                f"key '{key}' is also written by node '{writers[0]}'; each key has exactly one writer",
            )
    available = sorted(producers)
    if not sources:  # already reported; don't repeat it for every key the rollout would provide
        available = sorted(set(available) | set(ROLLOUT_WRITES) | set(IMPLICIT_ROLLOUT_KEYS))
    for node in nodes.values():
        path = ("nodes", node.name)
        for i, key in enumerate(node.reads):
            if key not in available:
                v.report(
                    path + ("reads", i),
                    f"reads key '{key}' which no node writes{suggest(key, available)}; "
                    f"available keys: {', '.join(available)}",
                )
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
    v.report(
        ("nodes", names[0], "reads"),
        "dependency cycle: "
        + " -> ".join(names + [names[0]])
        + " (weight updates back to the rollout are implicit; keys may not flow backwards)",
    )


VLLM_MAX_LORA_RANK = 512  # vLLM 0.32's MaxLoRARanks (backends/vllm.py rounds a rank up to one it serves)


def check_lora(spec: S.WorkflowSpec, v: Validator) -> None:
    """LoRA where it is built: a trained policy, one rank; adapter-only sync to every backend
    (the embedded engine merges the tensors it receives, vLLM and SGLang load each version's
    peft directory through their LoRA API)."""
    for name, model in spec.models.items():
        if model.lora is None:
            continue
        where = ("models", name, "lora")
        if model.train is None:
            v.report(where, "adapters are trained: give the model `train` settings too")
        elif name != actor_model(spec):
            v.report(
                where, "LoRA is built for the policy model only (a critic or reference with adapters is not built yet)"
            )
        if model.dp_size != 1:
            v.report(("models", name, "dp_size"), "LoRA with data parallelism (dp_size > 1) is not built yet")
        if model.lora.sync == "adapter" and spec.inference.backend != "embedded":
            # vLLM and SGLang load each version's peft directory through their LoRA API: from disk
            if spec.runtime.weight_sync == "memory":
                v.report(
                    ("runtime", "weight_sync"),
                    f"the {spec.inference.backend} backend loads LoRA adapters "
                    "from a directory (lora.sync: adapter): use weight_sync auto or disk, or lora.sync: merged",
                )
            if spec.inference.backend == "vllm" and model.lora.r > VLLM_MAX_LORA_RANK:
                v.report(where + ("r",), f"vLLM serves LoRA ranks up to {VLLM_MAX_LORA_RANK}")


def check_lagged(spec: S.WorkflowSpec, v: Validator) -> None:
    """A lagged model (`models.<name>.lagged`) is a copy of the actor that servers of its own
    serve for generation: never trained, started from the actor's weights (its path), used by no
    node, named by a rollout argument `model:<name>` (graph/kinds/rollout.py checks those)."""
    lagged = lagged_models(spec)
    if not lagged:
        return
    actor = actor_model(spec)
    named = {
        name
        for node in spec.nodes.values()
        if isinstance(getattr(node.params, "rollout_args", None), dict)
        for name in served_model_refs(node.params.rollout_args).values()
    }
    for name in lagged:
        model, where = spec.models[name], ("models", name)
        for field in ("train", "lora"):
            if getattr(model, field) is not None:
                v.report(
                    where + (field,),
                    f"a lagged model is served, never trained: remove `{field}` (the actor's "
                    "weights reach it every lagged.refresh_every versions)",
                )
        if actor is not None and name != actor and model.path != spec.models[actor].path:
            v.report(
                where + ("path",),
                f"a lagged model starts from the actor's weights: its path must be the actor's "
                f"'{spec.models[actor].path}', not '{model.path}'",
            )
        if adapter_sync(spec) and spec.inference.backend != "embedded":
            v.report(
                where + ("lagged",),
                f"a lagged copy of a policy that syncs LoRA adapters to {spec.inference.backend} servers "
                "(lora.sync: adapter) is not built yet: use lora.sync: merged",
            )
        if name not in named:
            v.report(
                where + ("lagged",),
                f"no rollout plays model '{name}' (rollout_args: {{opponent: {SERVED_MODEL}{name}}}): "
                "its servers would run for nothing",
            )
    for node in spec.nodes.values():
        if node.model in lagged:
            v.report(
                ("nodes", node.name, "model"),
                f"model '{node.model}' is a lagged copy served for generation only: no node uses it "
                f"(a rollout names it as {SERVED_MODEL}{node.model})",
            )


def check_megatron(spec: S.WorkflowSpec, v: Validator) -> None:
    """`backend: megatron` where it is built (engines/training/megatron/): a policy model (trained
    or a frozen reference) on one CUDA device, without LoRA. Whether this machine has CUDA is
    checked when the model host starts, not here: a workflow may be validated elsewhere."""
    for name, model in spec.models.items():
        if model.backend != "megatron":
            continue
        where = ("models", name)
        if not model.device.startswith("cuda"):
            v.report(
                where + ("device",), f"backend megatron needs a CUDA device (cuda or cuda:N), got '{model.device}'"
            )
        if model.dp_size != 1:
            v.report(where + ("dp_size",), "data parallelism with backend megatron is not built yet (dp_size 1)")
        if model.lora is not None:
            v.report(where + ("lora",), "LoRA with backend megatron is not built yet")
        if model_role(spec, name) == "critic":
            v.report(
                where + ("backend",),
                "backend megatron is built for policy models; a critic with backend megatron is not built yet",
            )


def check_trained_models(spec: S.WorkflowSpec, v: Validator) -> None:
    """One policy model (the one the inference servers serve); no model both policy and critic."""
    policy = [n for n in spec.nodes.values() if trains_policy(n)]
    if not policy:
        v.report(
            ("nodes",),
            f"the workflow needs a 'train' node with a policy loss ({' or '.join(POLICY_LOSSES)}) to train the actor",
        )
    for extra in policy[1:]:
        if extra.model != policy[0].model:
            v.report(
                ("nodes", extra.name, "model"),
                f"trains model '{extra.model}' with a policy loss, but node "
                f"'{policy[0].name}' trains '{policy[0].model}': the inference servers serve one policy",
            )
    roles: dict[str, dict[str, str]] = {}
    for node in spec.nodes.values():
        role = kind_of(node).model_role(node)
        if node.model is not None and role is not None:
            roles.setdefault(node.model, {}).setdefault(role, node.name)
    for model, by_role in roles.items():
        if len(by_role) > 1:
            v.report(
                ("nodes", by_role["critic"], "model"),
                f"model '{model}' is used as a critic here and as a policy by node '{by_role['policy']}': "
                "give the critic its own entry under `models:`",
            )


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
        if not (isinstance(obj, type) and issubclass(obj, Rollout)):
            return f"{ref.path} is not a subclass of areal_graph.api.rollout.Rollout"
    problem = None if ref.kwargs is None else check_signature(obj, ref)
    if problem is None and ref.expect == "rollout_class":
        problem = obj.check_args(dict(ref.kwargs or {}))  # the class's own checks of its arguments
    return problem


def check_signature(obj: Any, ref: ImportRef) -> str | None:
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


def check_resources(spec: S.WorkflowSpec, v: Validator) -> None:
    """The placement section against itself and the rest of the workflow (machine-side checks, a
    core or a GPU this machine lacks, are cli/preflight.py's): sides that would share a core or a
    GPU, fewer cores or GPUs than the processes that need one, devices the models do not use."""
    res, servers = spec.resources, spec.inference.servers
    # lagged models' servers take cores of the inference side too (their GPUs are the policy servers')
    every_server = servers + sum(m.lagged.servers for m in spec.models.values() if m.lagged is not None)
    inf, train = res.inference, res.training
    for what in ("cores", "gpus"):
        a, b = getattr(inf, what), getattr(train, what)
        shared = sorted(set(a or ()) & set(b or ()))
        if shared:
            v.report(
                ("resources", "training", what),
                f"shares {', '.join(map(str, shared))} with resources.inference.{what}: generation and training "
                f"each need their own (leave both out for the default, where every process shares everything)",
            )
    if inf.cores is not None and len(inf.cores) < every_server:
        v.report(
            ("resources", "inference", "cores"),
            f"lists {len(inf.cores)} core(s) for {every_server} inference servers: each server needs at least one",
        )
    if inf.cores is not None and spec.inference.threads and spec.inference.threads > len(inf.cores) // every_server:
        v.report(
            ("inference", "threads"),
            f"{spec.inference.threads} threads per server is more than the "
            f"{len(inf.cores) // every_server} core(s) each gets from resources.inference.cores",
        )
    if inf.gpus is not None:
        if len(inf.gpus) % servers:
            v.report(
                ("resources", "inference", "gpus"),
                f"{len(inf.gpus)} GPU(s) do not split evenly among {servers} inference servers",
            )
        if spec.inference.backend == "embedded" and not str(spec.inference.args.get("device", "cpu")).startswith(
            "cuda"
        ):
            v.report(
                ("resources", "inference", "gpus"),
                "the embedded servers run on the CPU: set inference.args.device: cuda to use these GPUs",
            )
    cuda_models = {n: m for n, m in spec.models.items() if m.device.startswith("cuda")}
    for name, model in spec.models.items():
        if train.cores is not None and model.dp_size > len(train.cores):
            v.report(
                ("models", name, "dp_size"),
                f"{model.dp_size} ranks but resources.training.cores lists "
                f"{len(train.cores)} core(s): each rank needs one",
            )
        if train.gpus is None or name not in cuda_models:
            continue
        if model.device != "cuda":
            v.report(
                ("models", name, "device"),
                f"with resources.training.gpus write 'cuda', not '{model.device}': "
                "rank r uses the r-th GPU of that list",
            )
        elif model.dp_size > len(train.gpus):
            v.report(
                ("models", name, "dp_size"),
                f"{model.dp_size} ranks on CUDA but resources.training.gpus lists "
                f"{len(train.gpus)} GPU(s): one rank a GPU",
            )
    if train.gpus is not None and not cuda_models:
        v.report(
            ("resources", "training", "gpus"), "no model is on CUDA: set models.<name>.device: cuda to use these GPUs"
        )
    if spec.runtime.launcher == "ray":
        for side in ("inference", "training", "other"):
            if getattr(res, side).gpus is not None:
                v.report(
                    ("resources", side, "gpus"),
                    "is not built for runtime.launcher 'ray' (Ray assigns each "
                    "process its GPUs); use the local launcher, or leave it out",
                )
