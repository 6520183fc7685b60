"""`areal-graph simulate WORKFLOW.yaml [KEY=VALUE ...] --calibrate RUN_DIR [--json]`: predict a run.

A discrete-event model of what the controller does (perfmodel/simulator.py), driven by the
costs of a finished run (perfmodel/costs.py): the steps window, step time, staleness and each
process's busy share, before spending the time on the run itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from areal_graph.cli.console import output_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="predict a run's time, staleness and busy shares from the costs of a finished run",
        description=(
            "Simulate WORKFLOW (with KEY=VALUE overrides) event by event as the controller runs it: the "
            "staleness gate and max_staleness, max_concurrent_rollouts, continuous batching on each server, "
            "interruption and weight updates, the training side, placement (resources) on this machine's "
            "cores. Costs come from a finished run (--calibrate RUN_DIR, or a model saved by `areal-graph "
            "costs --save`). Prints the predicted steps window (first step's start to last step's end, what "
            "`areal-graph trace RUN --json` reports as steps_window_s), the median step, staleness and each "
            "process's busy share, and says where the prediction extrapolates."
        ),
        epilog=(
            "Example: areal-graph simulate workflows/ppo_async_longtail.yaml runtime.max_staleness=8 "
            "--calibrate runs/calibration  (inference.kv_on_update=keep prices keeping the KV cache at "
            "updates)"
        ),
    )
    p.add_argument("workflow", type=Path, help="workflow YAML file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="workflow overrides, as for `run`")
    p.add_argument(
        "--calibrate",
        required=True,
        metavar="RUN_DIR",
        help="a finished run whose trace gives the costs (10 steps at least; 30 recommended), or a "
        "cost model JSON from `areal-graph costs --save`",
    )
    p.add_argument("--seeds", type=int, default=3, help="simulations with different length draws, averaged (default 3)")
    p.add_argument(
        "--batch-order",
        choices=["submission", "completion"],
        default="submission",
        help="which groups a step trains: the oldest submitted (the controller today) or the first "
        "finished, dropping those past max_staleness (priced only)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from areal_graph.cli.cmd_validate import load_or_report
    from areal_graph.perfmodel.calibration import load_costs

    console, err = output_console(), Console(stderr=True)
    if args.seeds < 1:
        err.print(f"[red]--seeds must be >= 1, got {args.seeds}[/]")
        return 2
    spec = load_or_report(args.workflow, args.overrides, err)
    if spec is None:
        return 1
    try:
        costs = load_costs(args.calibrate)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]--calibrate: {exc}[/]", soft_wrap=True, highlight=False)
        return 1
    from areal_graph.perfmodel.speculation import CannotPriceSpeculation

    try:
        out = predict(spec, costs, args.seeds, batch_order=args.batch_order)
    except CannotPriceSpeculation as exc:  # the workflow speculates and the calibration cannot price it
        err.print(f"[red]{exc}[/]", soft_wrap=True, highlight=False)
        return 1
    if args.json:
        console.print_json(json.dumps(out))
        return 0
    _print(console, out, args)
    return 0


def predict(spec: Any, costs: Any, seeds: int = 3, **settings: Any) -> dict[str, Any]:
    """The simulator's prediction for `spec`, averaged over `seeds` length draws, as plain data."""
    from areal_graph.perfmodel.cost_model import calibration_warning
    from areal_graph.perfmodel.simulator import simulate
    from areal_graph.perfmodel.workflow_config import config_from_spec

    base = dataclasses.replace(config_from_spec(spec, costs), **settings)
    results = [simulate(dataclasses.replace(base, seed=base.seed + k), costs) for k in range(seeds)]
    windows = [r.steps_window_s for r in results]
    first = results[0]
    return {
        "workflow": spec.name,
        "steps": base.steps,
        "steps_window_s": statistics.fmean(windows),
        "steps_window_s_range": [min(windows), max(windows)],
        "step_s_median": statistics.fmean(r.step_s_median for r in results),
        "staleness_mean": statistics.fmean(r.staleness_mean for r in results),
        "staleness_max": max(r.staleness_max for r in results),
        "busy": {k: statistics.fmean(r.busy[k] for r in results) for k in first.busy},
        "step_bound": first.step_bound,
        "tokens_per_s": statistics.fmean(r.tokens_per_s for r in results),
        "reprefill_tokens": int(statistics.fmean(r.reprefill_tokens for r in results)),
        # speculative runs: verifying and plain steps, tokens per row and verifying forward (first draw)
        "speculation": first.speculation,
        "settings": {
            "max_staleness": base.max_staleness,
            "batch_size": base.batch_size,
            "max_concurrent_rollouts": base.max_concurrent,
            "max_running_requests": base.max_running,
            "servers": base.servers,
            "kv_on_update": base.kv_on_update,
            "batch_order": base.batch_order,
            "speculative": base.speculative,
            "placement": {
                "inference": dataclasses.asdict(base.inference),
                "training": dataclasses.asdict(base.training),
                "other": dataclasses.asdict(base.other),
            },
        },
        "calibrated_on": costs.source,
        "calibration_warning": calibration_warning(costs),
        "extrapolates": first.notes,
    }


def _print(console: Any, out: dict[str, Any], args: argparse.Namespace) -> None:
    lo, hi = out["steps_window_s_range"]
    console.print(
        f"[bold]{out['workflow']}[/]: {out['steps']} steps, predicted from the costs of {out['calibrated_on']}",
        highlight=False,
    )
    table = Table(show_header=False)
    table.add_row(
        "steps window (first step's start to last step's end)",
        f"{out['steps_window_s']:.1f} s  ({lo:.1f}-{hi:.1f} over {args.seeds} draws)",
    )
    table.add_row("median step", f"{out['step_s_median'] * 1e3:.0f} ms")
    table.add_row("staleness of what is trained", f"mean {out['staleness_mean']:.2f}, max {out['staleness_max']}")
    bound = out["step_bound"]
    table.add_row("steps that waited for generation", f"{bound['generation']} of {sum(bound.values())}")
    for proc, share in out["busy"].items():
        table.add_row(f"busy: {proc}", f"{share:.0%} of the window")
    table.add_row("tokens decoded per second", f"{out['tokens_per_s']:,.0f}")
    table.add_row("tokens prefilled again after weight updates", f"{out['reprefill_tokens']:,}")
    sp = out.get("speculation") or {}
    if sp:
        table.add_row(
            "speculative decoding",
            f"{sp['verifying_share']:.0%} of decode steps verify, {sp['tokens_per_row_forward']:.2f} tokens per row "
            "and verifying forward",
        )
    console.print(table)
    if out.get("calibration_warning"):
        console.print(f"[red]calibration:[/] {out['calibration_warning']}", highlight=False)
    for note in out["extrapolates"]:
        console.print(f"[yellow]extrapolates:[/] {note}", highlight=False)
