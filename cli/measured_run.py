"""One `areal-graph run` in a subprocess, measured as `areal-graph trace --json` measures it.

Why one helper: `tune --verify` and the benchmarks that check the simulator (bench_simulator.py,
bench_tuned.py, bench_gpu_probe.py) all run a workflow with overrides and read back the same
things: the steps window (first step's start to last step's end), the greedy accuracy before the
first step and after the last, and the mean staleness of what was trained.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MeasuredRun:
    run_dir: Path
    exit_code: int
    window_s: float | None = None
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    staleness_mean: float | None = None


def measured_run(
    workflow: str | Path,
    overrides: Sequence[str],
    run_dir: Path,
    log: Path,
    timeout: float | None = None,
    cwd: Path | None = None,
) -> MeasuredRun:
    """Run it (a fresh `run_dir`: a folder that holds a run is refused), output to `log`."""
    from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file
    from areal_graph.trace_analysis.trace_model import load_timeline
    from areal_graph.trace_analysis.trace_stats import training_window

    shutil.rmtree(run_dir, ignore_errors=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(workflow), *overrides, "--run-dir", str(run_dir)]
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return MeasuredRun(run_dir, 124)
    if rc != 0:
        return MeasuredRun(run_dir, rc)
    window = training_window(load_timeline(run_dir))
    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    accs = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    stale = [m["staleness/mean"] for m in metrics if "staleness/mean" in m]
    return MeasuredRun(
        run_dir,
        0,
        (window[1] - window[0]) if window else None,
        accs[0] if accs else None,
        accs[-1] if len(accs) > 1 else None,
        sum(stale) / len(stale) if stale else None,
    )
