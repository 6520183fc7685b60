"""Is the simulator right? Calibrate on one short run, predict other configurations, measure them.

    python benchmarks/bench_simulator.py                 # both kits, 30-step calibration, 60-step runs
    python benchmarks/bench_simulator.py --kits longtail --steps 40
    python benchmarks/bench_simulator.py --quick         # 12-step calibration, 2 short runs: checks it works
    python benchmarks/bench_simulator.py --speculative   # speculative decoding priced from a run without it

For each kit (the long-tailed `ppo_async_longtail.yaml` and the shipped `ppo_async.yaml`):
1. one calibration run: the workflow as shipped (eta 4, nothing pinned), `--cal-steps` steps,
   no evaluation; `perfmodel.costs.fit_costs` reads its trace;
2. for every configuration below: `areal-graph simulate`'s prediction (3 length draws,
   averaged) from that calibration alone, then the real run (`areal-graph run`, `--steps`
   steps, no evaluation), whose steps window (first step's start to last step's end) comes
   from its trace exactly as `areal-graph trace RUN --json` reports it;
3. the error (predicted - measured) / measured.

The configurations vary what the issue names: max staleness 0, 1, 4, 8; max concurrent
rollouts; batch size; two placements (`resources`); and the two kits; and low concurrency (16
rollouts in flight, 8 or 16 requests running, against the calibration's 64). `--only TEXT`
runs the configurations whose label contains TEXT. A run is measured
`--rounds` times (default 2), the rounds interleaved, and the median taken: the machine is
shared, and the same run measured twice differs by 10-25% here.

Every round starts and ends with the calibration's own settings (the anchors), and each error is
reported twice: against the run as measured, and "at the calibration's speed", each round of it
divided by the machine's speed at its time (an anchor's measured / predicted window,
interpolated between the two anchors nearest in time). The second is the model's own error, the
first adds the machine's drift; the summary gives both over the configurations not calibrated on.

`--speculative` (kit `longtail-speculative`): the calibration run decodes plainly, as shipped,
and its trace's shadow counts (what speculation would have accepted) price the configurations
with `inference.speculative.enabled=true`, at the calibration's concurrency and at lower ones
where the engine verifies more; each is measured beside the same settings without speculation.
The verifying steps of the measured runs with speculation also check the verifying step's
price (`areal-graph costs` on such a run: the prefill-based price against its own steps).
Rows add the predicted and measured share of decode steps that verified and tokens per row and
verifying forward.

Output: a table (configuration, predicted, measured, error, the same at the calibration's speed,
predicted / measured staleness and engine busy share), the median and worst |error|, and benchmarks/results/simulator_validation.json
(`_speculative.json` with `--speculative`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PIN_TRAIN_CORE = ["resources.inference.cores=[0]", "resources.training.cores=[1]", "resources.other.cores=[1]"]
PIN_ENGINE_CORE = ["resources.inference.cores=[0]", "resources.training.cores=[1]", "resources.other.cores=[0]"]
KITS: dict[str, dict[str, Any]] = {
    "longtail": {
        "workflow": "workflows/ppo_async_longtail.yaml",
        "configs": [
            ("eta 4 (as calibrated)", []),
            ("eta 0 (synchronous)", ["runtime.max_staleness=0"]),
            ("eta 1", ["runtime.max_staleness=1"]),
            ("eta 8", ["runtime.max_staleness=8"]),
            ("eta 4, 32 concurrent rollouts", ["runtime.max_concurrent_rollouts=32"]),
            (
                "eta 8, 128 concurrent, 128 running",
                [
                    "runtime.max_staleness=8",
                    "runtime.max_concurrent_rollouts=128",
                    "inference.max_running_requests=128",
                ],
            ),
            ("eta 4, batch 64", ["runtime.batch_size=64"]),
            ("eta 4, pinned: engine core 0, trainer + rest core 1", PIN_TRAIN_CORE),
            ("eta 4, pinned: engine + rest core 0, trainer core 1", PIN_ENGINE_CORE),
            # fewer requests in flight or running than the calibration had (64): where the simulator
            # once predicted up to twice the measured window
            ("eta 4, 16 concurrent rollouts", ["runtime.max_concurrent_rollouts=16"]),
            ("eta 4, 16 running", ["inference.max_running_requests=16"]),
            ("eta 0, 8 running", ["runtime.max_staleness=0", "inference.max_running_requests=8"]),
        ],
    },
    "shipped": {
        "workflow": "workflows/ppo_async.yaml",
        "configs": [
            ("eta 4 (as calibrated)", []),
            ("eta 0 (synchronous)", ["runtime.max_staleness=0"]),
            ("eta 8", ["runtime.max_staleness=8"]),
            ("eta 4, batch 64", ["runtime.batch_size=64"]),
            ("eta 4, 16 concurrent rollouts", ["runtime.max_concurrent_rollouts=16"]),
            ("eta 4, 8 running", ["inference.max_running_requests=8"]),
            ("eta 1, 16 concurrent rollouts", ["runtime.max_staleness=1", "runtime.max_concurrent_rollouts=16"]),
            ("eta 0, 16 running", ["runtime.max_staleness=0", "inference.max_running_requests=16"]),
        ],
    },
}
SPEC = ["inference.speculative.enabled=true"]
KITS["longtail-speculative"] = {
    "workflow": "workflows/ppo_async_longtail.yaml",
    "configs": [
        ("eta 4 (as calibrated)", []),
        ("eta 4, speculative", SPEC),
        ("eta 4, 8 running", ["inference.max_running_requests=8"]),
        ("eta 4, 8 running, speculative", [*SPEC, "inference.max_running_requests=8"]),
        ("eta 4, 16 concurrent rollouts", ["runtime.max_concurrent_rollouts=16"]),
        ("eta 4, 16 concurrent rollouts, speculative", [*SPEC, "runtime.max_concurrent_rollouts=16"]),
    ],
}
COMMON = ["runtime.eval_every=0", "runtime.save_every=0"]


def run_workflow(workflow: str, overrides: list[str], run_dir: Path, log: Path) -> float:
    """Run it; the measured steps window from its trace (what `trace --json` reports)."""
    from areal_graph.cli.measured_run import measured_run

    got = measured_run(workflow, overrides, run_dir, log, cwd=ROOT)
    if got.exit_code != 0 or got.window_s is None:
        raise RuntimeError(f"{workflow} {' '.join(overrides)} failed (exit {got.exit_code}); log {log}")
    return got.window_s


def measured_extras(run_dir: Path) -> dict[str, Any]:
    from areal_graph.trace_analysis.speculation_summary import speculation_summary
    from areal_graph.trace_analysis.trace_run import load_run
    from areal_graph.trace_analysis.trace_summary import summarize_run

    run = load_run(run_dir)
    summary = summarize_run(run)
    busy = {p["process"]: p.get("busy_share_steps") for p in summary["processes"]}
    out: dict[str, Any] = {"staleness_mean": summary["staleness"].get("mean"), "engine_busy": busy.get("inference-0")}
    spec = speculation_summary(run.timeline)
    if spec.get("available"):
        out["verifying_share"] = spec["verifying_share"]  # of decode steps
        out["tokens_per_row_forward"] = spec["tokens_per_forward"]
        out["verify_check"] = verify_check(run_dir)
    return out


def verify_check(run_dir: Path) -> dict[str, float]:
    """A run with speculation, fitted: how far the prefill-based price of its verifying steps is
    from what they took (perfmodel/costs.py `_fit_verify`)."""
    from areal_graph.perfmodel.calibration import load_costs

    try:
        return load_costs(run_dir).verify_check
    except ValueError as exc:  # too few steps to fit: nothing to check
        return {"error": str(exc)}  # type: ignore[dict-item]


def machine_speed(
    configs: list[tuple[str, list[str]]],
    preds: list[dict[str, Any]],
    measured: list[list[float]],
    when: list[list[float]],
) -> Callable[[float], float] | None:
    """The machine's speed over the benchmark, from the calibration's own settings measured at the
    start and the end of every round: measured / predicted window, linearly between the two anchors
    nearest in time (the first or last beyond them). None without two anchors.

    Why: the machine is shared and its speed drifts by 10-30% within half an hour, so the error of
    one prediction against one measurement mixes the model's error with the drift. Dividing each
    run by the speed the calibration's settings had around it leaves the model's; both are
    reported."""
    anchors = sorted(
        (t, m / preds[i]["steps_window_s"])
        for i, (label, _) in enumerate(configs)
        if label.startswith("eta 4 (as calibrated")
        for m, t in zip(measured[i], when[i])
    )
    if len(anchors) < 2:
        return None
    ts = [a[0] for a in anchors]
    vs = [a[1] for a in anchors]

    def at(t: float) -> float:
        return float(np.interp(t, ts, vs))

    return at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kits", default="longtail,shipped", help="comma-separated: longtail, shipped")
    ap.add_argument("--cal-steps", type=int, default=30, help="steps of the calibration run")
    ap.add_argument("--steps", type=int, default=60, help="steps of every measured run")
    ap.add_argument("--rounds", type=int, default=2, help="measure each run this often, interleaved (median)")
    ap.add_argument("--seeds", type=int, default=3, help="simulations per prediction (length draws)")
    ap.add_argument("--quick", action="store_true", help="12-step calibration, two 12-step runs per kit")
    ap.add_argument("--workdir", type=Path, default=None, help="where the runs go (default: a temp dir)")
    ap.add_argument("--only", default=None, help="run only the configurations whose label contains this text")
    ap.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="calibrate on this finished run of the (one) kit's workflow instead of making one",
    )
    ap.add_argument(
        "--speculative",
        action="store_true",
        help="speculative decoding, priced from a calibration without it (kit longtail-speculative)",
    )
    args = ap.parse_args()
    if args.quick:
        args.cal_steps, args.steps = 12, 12
    if args.speculative:
        args.kits = "longtail-speculative"
    from areal_graph.cli.cmd_simulate import predict
    from areal_graph.graph.loader import load_workflow
    from areal_graph.perfmodel.calibration import load_costs
    from areal_graph.perfmodel.cost_model import calibration_warning

    console = Console()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-simulator-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for kit in args.kits.split(","):
        spec_of = KITS[kit]
        wf = spec_of["workflow"]
        cal_dir = work / f"{kit}-calibration"
        t0 = time.perf_counter()
        if args.calibrate is not None:
            cal_dir = args.calibrate
        else:
            run_workflow(wf, [f"runtime.steps={args.cal_steps}", *COMMON], cal_dir, work / f"{kit}-cal.log")
        costs = load_costs(cal_dir)
        cal_window = costs.measured["steps_window_s"]
        console.print(
            f"[bold]{kit}[/]: calibrated on {costs.measured['steps']} steps ({cal_window:.1f} s window, "
            f"{time.perf_counter() - t0:.0f} s with startup) in {cal_dir}"
        )
        warning = calibration_warning(costs)
        if warning:  # slowed by something else: every prediction below inherits it
            console.print(f"  [red]calibration:[/] {warning}", highlight=False)
        configs = spec_of["configs"][:2] if args.quick else spec_of["configs"]
        if args.only:
            configs = [c for c in configs if args.only in c[0]]
        # the machine's speed drifts (shared hosts): the calibration's own settings are measured again
        # last, and the drift between the two runs of them is reported beside the errors
        configs = [*configs, ("eta 4 (as calibrated, again at the end)", [])] if not args.quick else configs
        preds = [
            predict(load_workflow(ROOT / wf, [f"runtime.steps={args.steps}", *COMMON, *ov]), costs, args.seeds)
            for _, ov in configs
        ]
        measured_runs: list[list[float]] = [[] for _ in configs]
        when: list[list[float]] = [[] for _ in configs]  # each measured run's middle, seconds
        extras: list[dict[str, Any]] = [{} for _ in configs]
        for k in range(args.rounds):  # rounds interleaved: the machine's drift spreads over every configuration
            for i, (label, overrides) in enumerate(configs):
                run_dir = work / f"{kit}-{i}-{k}"
                t_run = time.perf_counter()
                measured_runs[i].append(
                    run_workflow(
                        wf, [f"runtime.steps={args.steps}", *COMMON, *overrides], run_dir, work / f"{kit}-{i}-{k}.log"
                    )
                )
                when[i].append((t_run + time.perf_counter()) / 2)
                extras[i] = measured_extras(run_dir)
                console.print(f"  round {k + 1}: {label:52s} measured {measured_runs[i][-1]:6.1f} s", highlight=False)
        speed = machine_speed(configs, preds, measured_runs, when)
        for i, (label, overrides) in enumerate(configs):
            pred, measured = preds[i], statistics.median(measured_runs[i])
            err = (pred["steps_window_s"] - measured) / measured
            # the same runs, each divided by the machine's speed at its time (the calibration's settings
            # measured around it, against their prediction): the model's error apart from the drift
            steady = statistics.median(m / speed(t) for m, t in zip(measured_runs[i], when[i])) if speed else None
            err_steady = (pred["steps_window_s"] - steady) / steady if steady else None
            rows.append(
                {
                    "kit": kit,
                    "config": label,
                    "overrides": overrides,
                    "steps": args.steps,
                    "predicted_s": pred["steps_window_s"],
                    "measured_s": measured,
                    "measured_rounds": measured_runs[i],
                    "error": err,
                    "measured_at_calibration_speed_s": steady,
                    "error_at_calibration_speed": err_steady,
                    "predicted_staleness": pred["staleness_mean"],
                    "measured_staleness": extras[i].get("staleness_mean"),
                    "predicted_engine_busy": pred["busy"].get("inference-0"),
                    "measured_engine_busy": extras[i].get("engine_busy"),
                    "extrapolates": pred["extrapolates"],
                    "calibration": str(cal_dir),
                    "calibration_warning": warning,
                    "calibration_probe_scale": costs.probe_scale,
                    "predicted_speculation": pred.get("speculation") or {},
                    "measured_verifying_share": extras[i].get("verifying_share"),
                    "measured_tokens_per_row_forward": extras[i].get("tokens_per_row_forward"),
                    "verify_check": extras[i].get("verify_check"),
                }
            )
            console.print(
                f"  {label:52s} predicted {pred['steps_window_s']:6.1f} s  measured {measured:6.1f} s  "
                f"error {err:+.1%}",
                highlight=False,
            )
    errors = [abs(r["error"]) for r in rows]
    table = Table(title=f"simulator vs measurement ({args.steps} steps a run, calibrated on {args.cal_steps})")
    for col in (
        "kit",
        "configuration",
        "predicted s",
        "measured s",
        "error",
        "at calibration speed: measured / error",
        "staleness pred / meas",
        "engine busy pred / meas",
    ):
        table.add_column(col, justify="right" if col not in ("kit", "configuration") else "left")
    for r in rows:
        ms = r["measured_staleness"]
        mb = r["measured_engine_busy"]
        table.add_row(
            r["kit"],
            r["config"],
            f"{r['predicted_s']:.1f}",
            f"{r['measured_s']:.1f}",
            f"{r['error']:+.1%}",
            f"{r['measured_at_calibration_speed_s']:.1f} / {r['error_at_calibration_speed']:+.1%}"
            if r["error_at_calibration_speed"] is not None
            else "-",
            f"{r['predicted_staleness']:.2f} / {ms:.2f}" if ms is not None else f"{r['predicted_staleness']:.2f} / -",
            f"{r['predicted_engine_busy']:.0%} / {mb:.0%}" if mb is not None else "-",
        )
    console.print(table)
    summary: dict[str, Any] = {
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "runs": len(rows),
    }
    # the configurations not calibrated on, as measured and at the calibration's speed
    held_out = [r for r in rows if not r["config"].startswith("eta 4 (as calibrated")]
    steady = [abs(r["error_at_calibration_speed"]) for r in held_out if r["error_at_calibration_speed"] is not None]
    if held_out:
        summary["held_out"] = len(held_out)
        summary["held_out_median_abs_error"] = statistics.median(abs(r["error"]) for r in held_out)
        summary["held_out_worst_abs_error"] = max(abs(r["error"]) for r in held_out)
    if steady:
        summary["held_out_median_abs_error_at_calibration_speed"] = statistics.median(steady)
        summary["held_out_worst_abs_error_at_calibration_speed"] = max(steady)
    for kit in {r["kit"] for r in rows}:
        same = [r["measured_s"] for r in rows if r["kit"] == kit and r["config"].startswith("eta 4 (as calibrated")]
        if len(same) == 2:
            summary[f"{kit}_drift"] = same[1] / same[0] - 1  # the same run measured first and last
    console.print(
        f"median |error| {summary['median_abs_error']:.1%}, worst {summary['worst_abs_error']:.1%} "
        f"over {len(rows)} configurations"
    )
    if held_out:
        console.print(
            f"the {summary['held_out']} configurations not calibrated on: median |error| "
            f"{summary['held_out_median_abs_error']:.1%}, worst {summary['held_out_worst_abs_error']:.1%}"
            + (
                f"; at the calibration's speed (each run divided by the speed the calibration's settings "
                f"had around it) {summary['held_out_median_abs_error_at_calibration_speed']:.1%} and "
                f"{summary['held_out_worst_abs_error_at_calibration_speed']:.1%}"
                if steady
                else ""
            )
        )
    for key, drift in summary.items():
        if key.endswith("_drift"):
            console.print(
                f"{key[:-6]}: the calibration's settings measured first and last differ by {drift:+.1%} "
                "(the machine's own drift over the benchmark)"
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.speculative:
        for r in rows:
            sp = r["predicted_speculation"]
            if not sp:
                continue
            check = r["verify_check"] or {}
            console.print(
                f"  {r['config']}: verifying steps predicted {sp['verifying_share']:.0%} of decode steps, "
                f"{sp['tokens_per_row_forward']:.2f} tokens per row and forward; measured "
                f"{(r['measured_verifying_share'] or 0):.0%}, "
                f"{(r['measured_tokens_per_row_forward'] or 0):.2f}; the measured verifying steps priced by the "
                f"prefill fit {check.get('formula_total_rel_err', float('nan')):+.1%}, by the probe "
                f"{check.get('probe_total_rel_err', float('nan')):+.1%}",
                highlight=False,
            )
    name = "simulator_validation_speculative" if args.speculative else "simulator_validation"
    out = RESULTS / (f"{name}_quick.json" if args.quick else f"{name}.json")
    out.write_text(
        json.dumps(
            {
                "summary": summary,
                "rows": rows,
                "cal_steps": args.cal_steps,
                "steps": args.steps,
                "date": time.strftime("%Y-%m-%d"),
            },
            indent=1,
        )
    )
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
