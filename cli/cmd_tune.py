"""`areal-graph tune WORKFLOW.yaml [KEY=VALUE ...] [--calibrate RUN_DIR] [--verify]`: the autopilot.

Searches placement, max staleness (up to the workflow's own), max concurrent rollouts and the
micro-batch budget with the simulator (perfmodel/tune.py), driven by the costs of a calibration
run (a short run of the workflow itself when none is given), and prints the best configurations
with their predicted steps windows and the overrides that give them. `--verify` then runs the
best one and the workflow as given, `--verify-rounds` times each interleaved, and prints both,
predicted and measured, with the median of the rounds' speed-ups.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from areal_graph.cli.console import output_console
from areal_graph.cli.measured_run import measured_run

CALIBRATION_STEPS = 30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search placement, staleness, concurrency and micro-batch budget with the simulator",
        description=(
            "Find the settings the simulator predicts to finish WORKFLOW's steps soonest on this machine: "
            "placement of the inference servers, the trainer and the rest on its cores (resources), max "
            "staleness (from 0 up to the workflow's runtime.max_staleness, never above it unless "
            "--max-staleness says so), max concurrent rollouts and the micro-batch token budget. Costs come "
            f"from --calibrate RUN_DIR, or from a {CALIBRATION_STEPS}-step run of the workflow made first. "
            "Prints the best configurations, their predicted windows and the KEY=VALUE overrides to use; "
            "--verify runs the best and the workflow as given (--verify-rounds times each, interleaved) and prints "
            "both measured."
        ),
        epilog="Example: areal-graph tune workflows/ppo_async_longtail.yaml --verify",
    )
    p.add_argument("workflow", type=Path, help="workflow YAML file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="workflow overrides, as for `run`")
    p.add_argument(
        "--calibrate",
        metavar="RUN_DIR",
        help="a finished run of this workflow (or a cost model JSON); "
        f"default: run {CALIBRATION_STEPS} steps of it first",
    )
    p.add_argument(
        "--calibration-steps",
        type=int,
        default=CALIBRATION_STEPS,
        metavar="N",
        help=f"steps of the calibration run made when --calibrate is not given (default {CALIBRATION_STEPS}; "
        "at least 10)",
    )
    p.add_argument(
        "--max-staleness",
        type=int,
        default=None,
        metavar="ETA",
        help="search max staleness up to ETA (default: the workflow's own runtime.max_staleness)",
    )
    p.add_argument("--top", type=int, default=5, help="configurations to print (default 5)")
    p.add_argument("--seeds", type=int, default=3, help="length draws per finalist (default 3)")
    p.add_argument("--verify", action="store_true", help="run the best configuration and the workflow as given")
    p.add_argument(
        "--verify-steps",
        type=int,
        default=None,
        metavar="N",
        help="steps of each --verify run (default: the workflow's, at most 100)",
    )
    p.add_argument(
        "--verify-rounds",
        type=int,
        default=2,
        metavar="N",
        help="run the best and the workflow as given N times each, interleaved, and report medians and the "
        "median of the rounds' speed-ups (default 2: one run each can be 20%% off on a shared machine)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where calibration and --verify runs go (default runs/tune-<name>-<time>)",
    )
    p.add_argument(
        "--search-speculative",
        action="store_true",
        help="also try speculative decoding on and off (needs a calibration with shadow acceptance; its "
        "verifying steps were priced 14-40%% under their time in a run on a 2-core CPU: docs/speculative_decoding.md)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from areal_graph.cli.cmd_validate import load_or_report
    from areal_graph.perfmodel.calibration import load_costs
    from areal_graph.perfmodel.speculation import CannotPriceSpeculation
    from areal_graph.perfmodel.tune import search
    from areal_graph.perfmodel.workflow_config import config_from_spec

    console, err = output_console(), Console(stderr=True)
    say = err if args.json else console
    spec = load_or_report(args.workflow, args.overrides, err)
    if spec is None:
        return 1
    eta = spec.runtime.max_staleness if args.max_staleness is None else args.max_staleness
    if eta < 0 or args.top < 1 or args.seeds < 1 or args.calibration_steps < 10 or args.verify_rounds < 1:
        err.print(
            "[red]--max-staleness must be >= 0, --top, --seeds and --verify-rounds >= 1, --calibration-steps >= 10[/]"
        )
        return 2
    work = args.work_dir or Path("runs") / f"tune-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    source = args.calibrate
    if source is None:
        source = str(work / "calibration")
        say.print(f"calibrating: {args.calibration_steps} steps of {args.workflow} into {source} ...")
        rc = measured_run(
            args.workflow,
            [
                *args.overrides,
                f"runtime.steps={args.calibration_steps}",
                "runtime.eval_every=0",
                "runtime.save_every=0",
            ],
            Path(source),
            work / "calibration.log",
        ).exit_code
        if rc != 0:
            err.print(f"[red]the calibration run failed (exit {rc}); its log: {work / 'calibration.log'}[/]")
            return 1
    try:
        costs = load_costs(source)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]--calibrate: {exc}[/]", soft_wrap=True, highlight=False)
        return 1
    base = config_from_spec(spec, costs)
    try:
        with say.status("simulating ...") as status:
            result = search(
                base,
                costs,
                eta,
                top=args.top,
                seeds=args.seeds,
                progress=lambda i, n: status.update(f"simulating configurations ({i} of ~{n}) ..."),
                search_speculative=args.search_speculative,
            )
    except CannotPriceSpeculation as exc:  # the workflow speculates and the calibration cannot price it
        err.print(f"[red]{exc}[/]", soft_wrap=True, highlight=False)
        return 1
    out: dict[str, Any] = _as_json(spec, result, costs, eta)
    if spec.inference.kv_on_update == "recompute" and spec.inference.backend == "embedded":
        out["kv_keep"] = _price_kv_keep(result, costs, args.seeds)
    if args.verify:
        out["verify"] = _verify(args, spec, result, costs, work, say)
        out["verified_speedup"] = verified_speedup(out["verify"])
    if args.json:
        console.print_json(json.dumps(out))
    else:
        _print(console, args, out)
    return 0


def _as_json(spec: Any, result: Any, costs: Any, eta: int) -> dict[str, Any]:
    from areal_graph.perfmodel.cost_model import calibration_warning

    def one(c: Any) -> dict[str, Any]:
        return {
            "overrides": c.overrides,
            "steps_window_s": c.window_s,
            "staleness_mean": c.staleness,
            "busy": c.busy,
            "speedup_vs_given": result.given.window_s / c.window_s if c.window_s else None,
            "speculative": c.cfg.speculative,
            "extrapolates": c.notes,
        }

    return {
        "workflow": spec.name,
        "steps": spec.runtime.steps,
        "calibrated_on": costs.source,
        "calibration_warning": calibration_warning(costs),
        "max_staleness_searched": eta,
        "simulations": result.simulated,
        "speculation_searched": result.speculation_searched,
        "speculation_note": result.speculation_note,
        "given": one(result.given),
        "best": [one(c) for c in result.ranked],
    }


def _price_kv_keep(result: Any, costs: Any, seeds: int) -> dict[str, Any]:
    """The best configuration with `inference.kv_on_update=keep`, priced but not searched: it changes
    what the engine computes after a weight update (the prefix's keys and values stay a version old)."""
    from areal_graph.perfmodel.simulator import simulate

    best = result.ranked[0]
    cfg = dataclasses.replace(best.cfg, kv_on_update="keep")
    window = (
        sum(simulate(dataclasses.replace(cfg, seed=cfg.seed + k), costs).steps_window_s for k in range(seeds)) / seeds
    )
    return {
        "overrides": ["inference.kv_on_update=keep", *best.overrides],
        "steps_window_s": window,
        "speedup_vs_given": result.given.window_s / window,
    }


def _verify(args: argparse.Namespace, spec: Any, result: Any, costs: Any, work: Path, say: Any) -> list[dict[str, Any]]:
    """Run the best configuration and the workflow as given, `--verify-rounds` times each,
    interleaved (the order alternating by round, so a slow phase of the machine falls on both);
    their windows predicted, measured (the median of the rounds) and every round's."""
    from areal_graph.perfmodel.simulator import simulate

    steps = args.verify_steps or min(spec.runtime.steps, 100)
    cands = (("best", result.ranked[0]), ("as given", result.given))
    rows: dict[str, dict[str, Any]] = {}
    for label, cand in cands:
        cfg = dataclasses.replace(cand.cfg, steps=steps)
        predicted = (
            sum(simulate(dataclasses.replace(cfg, seed=cfg.seed + k), costs).steps_window_s for k in range(args.seeds))
            / args.seeds
        )
        rows[label] = {"label": label, "overrides": cand.overrides, "steps": steps, "predicted_s": predicted}
        rows[label].update(measured_s=None, measured_rounds=[], run_dirs=[], exit=0)
    for k in range(args.verify_rounds):
        for label, cand in cands if k % 2 == 0 else cands[::-1]:
            name = f"verify-{label.replace(' ', '-')}" + (f"-{k + 1}" if args.verify_rounds > 1 else "")
            overrides = [*args.overrides, *cand.overrides, f"runtime.steps={steps}", "runtime.eval_every=0"]
            say.print(
                f"verifying {label} (round {k + 1} of {args.verify_rounds}): {steps} steps with "
                f"{' '.join(cand.overrides) or 'no overrides'} ...",
                highlight=False,
            )
            got = measured_run(args.workflow, [*overrides, "runtime.save_every=0"], work / name, work / f"{name}.log")
            row = rows[label]
            row["measured_rounds"].append(got.window_s)
            row["run_dirs"].append(str(work / name))
            row["exit"] = row["exit"] or got.exit_code
    for row in rows.values():
        got_all = [m for m in row["measured_rounds"] if m is not None]
        row["measured_s"] = statistics.median(got_all) if len(got_all) == len(row["measured_rounds"]) else None
        row["run_dir"] = row["run_dirs"][0]
    return list(rows.values())


def verified_speedup(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured speed-up of the best over the workflow as given: each round's ratio (the two
    runs of one round ran next to each other) and their median, beside the predicted one; None
    when a run failed."""
    got = {r["label"]: r for r in rows}
    best, given = got.get("best"), got.get("as given")
    if best is None or given is None or best["measured_s"] is None or given["measured_s"] is None:
        return None
    ratios = [g / b for g, b in zip(given["measured_rounds"], best["measured_rounds"])]
    return {
        "median": statistics.median(ratios),
        "rounds": ratios,
        "predicted": given["predicted_s"] / best["predicted_s"],
    }


def _print(console: Any, args: argparse.Namespace, out: dict[str, Any]) -> None:
    console.print(
        f"[bold]{out['workflow']}[/]: {out['steps']} steps, {out['simulations']} simulations from the costs "
        f"of {out['calibrated_on']} (max staleness searched 0-{out['max_staleness_searched']})",
        highlight=False,
    )
    table = Table(title="the best configurations, predicted", title_justify="left")
    for col in (
        "rank",
        "steps window",
        "vs as given",
        "staleness",
        "engine busy",
        "trainer busy",
        "speculative",
        "overrides",
    ):
        table.add_column(col, justify="left" if col == "overrides" else "right")
    given = out["given"]
    table.add_row(
        "given",
        f"{given['steps_window_s']:.1f} s",
        "1.00x",
        f"{given['staleness_mean']:.2f}",
        f"{given['busy'].get('inference-0', 0):.0%}",
        f"{given['busy'].get('trainer', 0):.0%}",
        "on" if given["speculative"] else "off",
        "(none)",
    )
    for i, c in enumerate(out["best"], 1):
        table.add_row(
            str(i),
            f"{c['steps_window_s']:.1f} s",
            f"{c['speedup_vs_given']:.2f}x",
            f"{c['staleness_mean']:.2f}",
            f"{c['busy'].get('inference-0', 0):.0%}",
            f"{c['busy'].get('trainer', 0):.0%}",
            "on" if c["speculative"] else "off",
            " ".join(c["overrides"]) or "(the workflow as given)",
        )
    console.print(table)
    if out.get("calibration_warning"):
        # the engine's share of every prediction is slowed alike, so the ranking between engine- and
        # trainer-bound configurations shifts too
        console.print(f"[red]calibration:[/] {out['calibration_warning']}", highlight=False)
    best = out["best"][0]
    if out["speculation_searched"]:
        console.print(
            f"speculative decoding searched on and off: {'on' if best['speculative'] else 'off'} in the best "
            f"(inference.speculative.enabled={str(best['speculative']).lower()})",
            highlight=False,
        )
    elif out["speculation_note"]:
        console.print(f"[yellow]{out['speculation_note']}[/]", highlight=False, soft_wrap=True)
    console.print(
        f"use: areal-graph run {args.workflow} {' '.join([*args.overrides, *best['overrides']])}".rstrip(),
        highlight=False,
        soft_wrap=True,
    )
    for note in best["extrapolates"]:
        console.print(f"[yellow]extrapolates:[/] {note}", highlight=False)
    keep = out.get("kv_keep")
    if keep:
        console.print(
            f"not searched, as it changes what the engine computes: keeping the KV cache at weight updates "
            f"(inference.kv_on_update=keep) with the best settings is predicted at {keep['steps_window_s']:.1f} s "
            f"({keep['speedup_vs_given']:.2f}x the workflow as given)",
            highlight=False,
            soft_wrap=True,
        )
    for row in out.get("verify", []):
        rounds = row["measured_rounds"]
        measured = (
            f"{row['measured_s']:.1f} s"
            + (f" (rounds: {', '.join(f'{m:.1f}' for m in rounds)})" if len(rounds) > 1 else "")
            if row["measured_s"] is not None
            else f"failed (exit {row['exit']})"
        )
        console.print(
            f"verified {row['label']}: {row['steps']} steps, predicted {row['predicted_s']:.1f} s, measured "
            f"{measured} ({row['run_dir']}{' ...' if len(rounds) > 1 else ''})",
            highlight=False,
        )
    speedup = out.get("verified_speedup")
    if speedup:
        per_round = speedup["rounds"]
        console.print(
            f"measured speed-up of the best over the workflow as given: {speedup['median']:.2f}x"
            + (f" (median of the rounds: {', '.join(f'{r:.2f}x' for r in per_round)})" if len(per_round) > 1 else "")
            + f"; predicted {speedup['predicted']:.2f}x",
            highlight=False,
        )
