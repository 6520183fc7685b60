"""One run's summary as plain data: the numbers `areal-graph trace` prints, puts in --json and on the page.

Why plain data: the text tables, the JSON output and the HTML page are three views of one
result, so they cannot disagree; tests assert on this dict.
"""

from __future__ import annotations

from typing import Any

from areal_graph.trace_analysis.mismatch_summary import mismatch_summary
from areal_graph.trace_analysis.speculation_summary import shadow_summary, speculation_summary
from areal_graph.trace_analysis.step_split import step_split, summarize_steps
from areal_graph.trace_analysis.trace_metrics import packing_efficiency, staleness_histogram
from areal_graph.trace_analysis.trace_run import RunMaterial
from areal_graph.trace_analysis.trace_stats import node_totals, process_shares, step_bounds, summarize_bounds


def summarize_run(run: RunMaterial) -> dict[str, Any]:
    tl = run.timeline
    bounds = step_bounds(tl, run.generation_nodes, run.training_nodes)
    budget, ranks = _budget(run)
    nodes = (
        list(run.spec.nodes)
        if run.spec is not None
        else sorted({s["args"]["node"] for s in tl.spans if s["cat"] == "node" and s["args"].get("node")})
    )
    return {
        "label": run.label,
        "path": str(run.path),
        "files": list(dict.fromkeys(str(f.path) for f in tl.files)),  # a file read in windows: once
        "wall_s": tl.wall_s,
        "spans": len(tl.spans),
        "flows": len(tl.flows),
        "notes": list(run.notes),
        "processes": process_shares(tl),
        "median_step": summarize_steps(step_split(tl.spans)),
        "critical_path": {**summarize_bounds(bounds), "sides_from": run.sides_from, "per_step": bounds},
        "staleness": staleness_histogram(tl, run.metrics),
        "packing": packing_efficiency(run.metrics, budget, ranks),
        "mismatch": mismatch_summary(run.metrics),
        "speculation": speculation_summary(tl),
        "speculation_shadow": shadow_summary(tl),
        "nodes": node_totals(tl, nodes),
        "fused": dict(run.plan.fused) if run.plan is not None else _fused_from_trace(run),
    }


def _budget(run: RunMaterial) -> tuple[int | None, int]:
    if run.spec is None:
        return None, 1
    budget = run.spec.runtime.max_tokens_per_microbatch
    actor = run.spec.models.get(run.plan.actor) if run.plan is not None else None
    return budget, int(getattr(actor, "dp_size", 1) or 1)


def _fused_from_trace(run: RunMaterial) -> dict[str, str]:
    """The plan span the controller records at the start carries {skipped node: fused into}."""
    for s in run.timeline.spans:
        if s["name"] == "plan" and isinstance(s["args"].get("fused"), dict):
            return {str(k): str(v) for k, v in s["args"]["fused"].items()}
    return {}
