"""`areal-graph validate WORKFLOW.yaml [--set k=v ...]`: check a workflow, show its graph.

Exit 0 with a summary (models, nodes, edges, execution order) when the workflow is valid;
exit 1 listing every problem (file, line, node, field) otherwise, never a traceback: the
person reading it is fixing a YAML file, not debugging Python.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from areal_graph.cli.console import output_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check a workflow YAML and show its graph",
        description=(
            "Load WORKFLOW, apply --set overrides, and check it: fields, types, ranges, models, "
            "every import path it names (rollout classes, reward and function nodes, node kinds), "
            "whether each reward fn can score the data, whether a sample of each dataset's prompts (rendered "
            "with the template and the policy's tokenizer) leaves room for max_new_tokens in the model's "
            "context, and the graph derived from what each node reads and writes (every read key has one "
            "writer, no cycles, no generation-side node reading a training-side key, train nodes get "
            "what their loss needs). Prints every problem at once; when valid, the execution plan: "
            "which side of the sample buffer each node runs on, what runs concurrently, where, and "
            "what is fused."
        ),
        epilog="Example: areal-graph validate workflows/ppo_async.yaml --set runtime.max_staleness=0",
    )
    p.add_argument("workflow", type=Path, nargs="?", help="workflow YAML file")
    p.add_argument(
        "--schema",
        action="store_true",
        help="print a reference of every workflow field (type, default, meaning) and exit",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field before validating, e.g. --set nodes.train.clip_eps=0.1 (repeatable; "
        "KEY=VALUE after WORKFLOW works too, as for `run`)",
    )
    p.set_defaults(func=run)


def print_problems(console: Console, workflow: Path, problems: list) -> None:
    console.print(f"[bold red]{workflow}: {len(problems)} problem(s)[/]")
    for problem in problems:
        # markup=False: YAML values like [a, b] in a message must print verbatim.
        console.print("  - " + str(problem), highlight=False, markup=False, soft_wrap=True)


def load_or_report(workflow: Path, overrides: list[str], console: Console) -> Any:
    """The validated workflow, or None after printing every problem (the commands that take a
    WORKFLOW and KEY=VALUE overrides all answer a bad one the same way: exit 1, no traceback)."""
    from areal_graph.graph.loader import WorkflowError, load_workflow

    try:
        return load_workflow(workflow, overrides=overrides)
    except WorkflowError as err:
        print_problems(console, workflow, err.problems)
        return None


def run(args: argparse.Namespace) -> int:
    from areal_graph.graph.dag import build_graph
    from areal_graph.graph.loader import WorkflowError, load_workflow
    from areal_graph.graph.plan import build_plan

    console = output_console()
    if args.schema:
        from rich.markdown import Markdown

        from areal_graph.graph.schema_doc import schema_markdown

        console.print(Markdown(schema_markdown()))
        return 0
    if args.workflow is None:
        console.print("[red]validate needs a WORKFLOW file (or --schema)[/]")
        return 2
    try:
        spec = load_workflow(args.workflow, overrides=args.overrides)
    except WorkflowError as err:
        print_problems(console, args.workflow, err.problems)
        return 1
    from areal_graph.cli.preflight import preflight
    from areal_graph.cli.prompt_fit import check_prompts

    try:  # a builtin name no kit has, or bad inference.args, fails here, not minutes into `run`
        preflight(spec)
    except ValueError as err:
        for line in str(err).splitlines():
            console.print(f"{args.workflow}: {line}", style="red", markup=False, highlight=False)
        return 1
    prompts = check_prompts(spec)  # prompt + max_new_tokens against the policy's context, on a sample
    for line in prompts.problems:
        console.print(f"{args.workflow}: {line}", style="red", markup=False, highlight=False)
    if prompts.problems:
        return 1
    graph = build_graph(spec)
    console.print(
        f"[bold green]OK[/] {args.workflow}: workflow [bold]{spec.name}[/], "
        f"{len(spec.nodes)} nodes, {graph.number_of_edges()} edges"
    )

    models = Table(title="models", title_justify="left")
    for col in ("name", "path", "trained"):
        models.add_column(col)
    for m in spec.models.values():
        served = f"lagged copy, every {m.lagged.refresh_every} versions" if m.lagged else "frozen"
        models.add_row(m.name, m.path, f"lr {m.train.lr:g}" if m.train else served)
    console.print(models)

    plan = build_plan(spec)
    nodes = Table(title="nodes", title_justify="left")
    for col in ("node", "kind", "model", "side", "process", "reads", "writes"):
        nodes.add_column(col)
    for n in spec.nodes.values():
        where = f"(fused into {plan.fused[n.name]})" if n.name in plan.fused else plan.hosting[n.name].process
        nodes.add_row(
            n.name,
            n.kind,
            n.model or "-",
            plan.phase[n.name],
            where,
            ", ".join(n.reads) or "-",
            ", ".join(n.writes) or "-",
        )
    console.print(nodes)

    edges = Table(title="edges", title_justify="left")
    for col in ("from", "to", "keys"):
        edges.add_column(col)
    for u, v, data in graph.edges(data=True):
        edges.add_row(u, v, ", ".join(data["keys"]))
    for train, rollout in graph.graph["weight_update"]:
        edges.add_row(train, rollout, "[italic]new weights (implicit, not a DAG edge)[/]")
    console.print(edges)

    rt = spec.runtime
    console.print("[bold]plan[/]")
    for line in plan.describe():
        console.print(f"  {line}", highlight=False, markup=False)
    console.print(
        f"runtime: batch {rt.batch_size} trajectories/step, max staleness {rt.max_staleness}, "
        f"{rt.steps} steps, backend {spec.inference.backend}, "
        # what `kv_on_update: auto` (the default) resolved to, for this backend and staleness
        f"KV cache at weight updates: {spec.inference.kv_on_update}",
        highlight=False,
    )
    for line in prompts.lines:
        console.print(line, highlight=False, markup=False)
    return 0
