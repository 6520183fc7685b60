"""`areal-graph costs RUN_DIR [--json] [--save FILE]`: what each part of a run costs, read off its trace.

The cost model the simulator runs on (perfmodel/costs.py): engine step times against batch
and context, prefill, training-side calls against tokens, weight sync, rewards, the rollout's
and the controller's overheads, background CPU, and the output-length distribution by policy
version; every fit with its error on the run it came from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.cli.console import output_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "costs",
        help="fit what each part of a finished run costs (the simulator's cost model)",
        description=(
            "Read RUN_DIR's trace and metrics and fit what each process costs: a decode step against the "
            "running batch and its context, a prefill chunk against its tokens, each training-side call "
            "against tokens and sequences, the weight sync, the reward per prompt group, the rollout's and "
            "the controller's own overheads, the CPU the other processes use, and the output-length "
            "distribution by policy version (it drifts as the policy learns). Each fit shows its error on "
            "this same run. `areal-graph simulate --calibrate RUN_DIR` runs on this model."
        ),
        epilog="Example: areal-graph costs runs/ppo_async_longtail-20261127-101500",
    )
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="a finished run's directory (trace.json, config.yaml)")
    p.add_argument("--json", action="store_true", help="print the model and the table as JSON")
    p.add_argument("--save", type=Path, metavar="FILE", help="also write the model as JSON (simulate --calibrate FILE)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from areal_graph.perfmodel.calibration import load_costs
    from areal_graph.perfmodel.cost_model import calibration_warning, costs_summary, describe_costs

    console, err = output_console(), Console(stderr=True)
    try:
        model = load_costs(args.run)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]{exc}[/]", soft_wrap=True, highlight=False)
        return 1
    if args.save is not None:
        model.save(args.save)
    if args.json:
        console.print_json(json.dumps(costs_summary(model)))
        return 0
    table = Table(title=f"costs of {model.source} (fitted on its own trace)", title_justify="left")
    for col in ("cost", "value", "fit error on this run"):
        table.add_column(col)
    for row in describe_costs(model):
        table.add_row(*row)
    console.print(table)
    warning = calibration_warning(model)
    if warning is not None:
        console.print(f"[red]warning:[/] {warning}", highlight=False)
    for note in model.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    if args.save is not None:
        console.print(f"saved to {args.save}")
    return 0
