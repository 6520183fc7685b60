"""Pictures of one or more runs as PNG files (`areal-graph trace RUN [RUN_B] --png DIR`).

Why PNGs beside the HTML page: they go into reports, issues and READMEs as they are. Two
pictures: each process's utilisation over the run (busy share per time slice, busy as
trace_stats defines it), and the learning curve (greedy accuracy, mean reward and staleness
by step from metrics.jsonl). matplotlib is an optional dependency (`pip install
'areal-graph[plots]'`); it draws off-screen (Agg), so no display is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_graph.trace_analysis.trace_metrics import learning_curve
from areal_graph.trace_analysis.trace_run import RunMaterial
from areal_graph.trace_analysis.trace_stats import utilisation

log = logging.getLogger(__name__)
UTILISATION_PNG = "utilisation.png"
LEARNING_CURVE_PNG = "learning_curve.png"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as err:
        raise PlotsUnavailable("PNG pictures need matplotlib: pip install 'areal-graph[plots]'") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_pngs(runs: Sequence[RunMaterial], outdir: str | Path, bins: int = 200) -> list[Path]:
    """Write utilisation.png and learning_curve.png into `outdir`; the paths written."""
    if not runs:
        raise ValueError("write_pngs: no runs")
    plt = _pyplot()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    return [
        _utilisation_png(plt, runs, outdir / UTILISATION_PNG, bins),
        _learning_curve_png(plt, runs, outdir / LEARNING_CURVE_PNG),
    ]


def _utilisation_png(plt: Any, runs: Sequence[RunMaterial], path: Path, bins: int) -> Path:
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.6 * len(runs) + 0.6), squeeze=False, sharex=True)
    for ax, run in zip(axes[:, 0], runs):
        u = utilisation(run.timeline, bins)
        drawn = 0
        for proc in run.timeline.processes:
            series = u["by_process"].get(proc)
            if series is not None and any(series):
                ax.step(u["t_s"], [100 * v for v in series], where="mid", label=proc, linewidth=1.2)
                drawn += 1
        ax.set_ylim(0, 105)
        ax.set_ylabel("busy %")
        ax.set_title(f"{run.label}: busy share per process ({u['bin_s']:.2f} s slices)", fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(loc="upper left", fontsize=8, ncol=3, framealpha=0.8)
        else:
            ax.text(
                0.5,
                0.5,
                "no busy spans in the trace",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="#92400e",
            )
    axes[-1, 0].set_xlabel("seconds from the run's start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _learning_curve_png(plt: Any, runs: Sequence[RunMaterial], path: Path) -> Path:
    panels = [
        ("accuracy", "greedy eval accuracy"),
        ("reward", "mean reward (trained batch)"),
        ("staleness_mean", "staleness (mean; dotted: max)"),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 7.5), sharex=True)
    curves = [(run, learning_curve(run.metrics)) for run in runs]
    for ax, (key, title) in zip(axes, panels):
        drawn = False
        for k, (run, curve) in enumerate(curves):
            pts = curve[key]
            if not pts:
                continue
            colour = f"C{k}"
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                color=colour,
                label=run.label,
                marker="o" if key == "accuracy" else None,
                markersize=3,
                linewidth=1.2,
            )
            if key == "staleness_mean" and curve["staleness_max"]:
                mx = curve["staleness_max"]
                ax.plot([p[0] for p in mx], [p[1] for p in mx], color=colour, linestyle=":", linewidth=1)
            drawn = True
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(
                0.5,
                0.5,
                "not logged in metrics.jsonl",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="#92400e",
            )
    axes[-1].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
