"""Does `runtime.autopilot` help? The same run with a fixed concurrency and with the autopilot.

    python benchmarks/bench_autopilot.py                 # long-tailed kit, 60 steps, 2 interleaved rounds
    python benchmarks/bench_autopilot.py --quick         # 12 steps, 1 round: checks that it works

Starting points: max_concurrent_rollouts 16 (two prompt groups: too few to fill the engine's batch)
and 64 (the shipped setting). Each is run with the concurrency fixed and with `runtime.autopilot:
true`, which moves it a prompt group at a time from the trainer's measured idle share (runtime/
orchestration/autopilot.py). Reported: the steps window (median over rounds), where the autopilot
ended (`autopilot/max_concurrent` at the last step), its changes, and the staleness trained.
Output: a table and benchmarks/results/autopilot.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORKFLOW = "workflows/ppo_async_longtail.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--starts", default="16,64", help="starting max_concurrent_rollouts, comma-separated")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.steps, args.rounds = 12, 1
    from areal_graph.cli.measured_run import measured_run

    console = Console()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-autopilot-"))
    configs = [(start, pilot) for start in map(int, args.starts.split(",")) for pilot in (False, True)]
    windows: dict[tuple[int, bool], list[float]] = {c: [] for c in configs}
    finals: dict[tuple[int, bool], dict] = {}
    for k in range(args.rounds):
        for start, pilot in configs:
            run_dir = work / f"c{start}-{'pilot' if pilot else 'fixed'}-{k}"
            got = measured_run(
                WORKFLOW,
                [
                    f"runtime.steps={args.steps}",
                    "runtime.eval_every=0",
                    "runtime.save_every=0",
                    f"runtime.max_concurrent_rollouts={start}",
                    f"runtime.autopilot={'true' if pilot else 'false'}",
                ],
                run_dir,
                work / f"{run_dir.name}.log",
                cwd=ROOT,
            )
            if got.exit_code != 0 or got.window_s is None:
                raise RuntimeError(f"run failed (exit {got.exit_code}): {work / (run_dir.name + '.log')}")
            windows[(start, pilot)].append(got.window_s)
            metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
            limits = [m["autopilot/max_concurrent"] for m in metrics if "autopilot/max_concurrent" in m]
            finals[(start, pilot)] = {
                "final": limits[-1] if limits else start,
                "changes": sum(1 for a, b in zip(limits, limits[1:]) if a != b),
                "staleness": got.staleness_mean,
            }
            console.print(f"round {k + 1}: start {start}, autopilot {pilot}: {got.window_s:.1f} s", highlight=False)
    table = Table(title=f"runtime.autopilot on {WORKFLOW}, {args.steps} steps (median of {args.rounds} rounds)")
    for col in ("start", "autopilot", "steps window", "vs fixed", "ended at", "changes", "staleness"):
        table.add_column(col, justify="right")
    rows = []
    for start, pilot in configs:
        w = statistics.median(windows[(start, pilot)])
        fixed = statistics.median(windows[(start, False)])
        f = finals[(start, pilot)]
        rows.append(
            {
                "start": start,
                "autopilot": pilot,
                "window_s": w,
                "windows": windows[(start, pilot)],
                "speedup_vs_fixed": fixed / w,
                **f,
            }
        )
        table.add_row(
            str(start),
            "on" if pilot else "off",
            f"{w:.1f} s",
            f"{fixed / w:.2f}x",
            str(int(f["final"])),
            str(f["changes"]),
            f"{f['staleness']:.2f}" if f["staleness"] is not None else "-",
        )
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("autopilot_quick.json" if args.quick else "autopilot.json")
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "rows": rows}, indent=1))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
