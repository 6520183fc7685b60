"""The offline timeline page: one HTML file with its script, styles and data inline.

Why one self-contained file: a run's timeline is looked at on a laptop after the fact, from a
cluster's disk, attached to an issue, opened with no network. So nothing is fetched: the
script and styles are package files (`viewer.js`, `viewer.css`, `page.html` beside this
module) pasted into the page, the data is a JSON script block, and the workflow graph is the
SVG `graph.render` draws for `areal-graph plot`. Tables of the summary are written here as
HTML; the timeline itself is drawn by the script on a canvas (see viewer.js).
"""

from __future__ import annotations

import html
import json
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_graph.trace_analysis.trace_run import RunMaterial
from areal_graph.trace_analysis.trace_summary import summarize_run
from areal_graph.trace_analysis.trace_view.payload import PageOptions, run_payload

log = logging.getLogger(__name__)
ASSETS = Path(__file__).parent
MARKER = re.compile(r"/\*@(?:CSS|JS)@\*/|@(?:TITLE|GRAPHS|SUMMARY|DATA)@")


def build_page(
    runs: Sequence[RunMaterial], options: PageOptions | None = None, summaries: Sequence[dict[str, Any]] | None = None
) -> str:
    """The page's HTML for one run or several (drawn one above the other on one time axis)."""
    if not runs:
        raise ValueError("build_page: no runs to draw")
    options = options or PageOptions()
    summaries = list(summaries) if summaries is not None else [summarize_run(r) for r in runs]
    run_payloads = [run_payload(r, s, options) for r, s in zip(runs, summaries)]
    for p, s in zip(run_payloads, summaries):
        p["notes"] = s["notes"] + _budget_notes(p)
    payload = {"runs": run_payloads, "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    title = "timeline: " + " vs ".join(r.label for r in runs)
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False, default=str).replace("</", "<\\/")
    values = {
        "/*@CSS@*/": (ASSETS / "viewer.css").read_text(encoding="utf-8"),
        "/*@JS@*/": (ASSETS / "viewer.js").read_text(encoding="utf-8"),
        "@TITLE@": html.escape(title),
        "@GRAPHS@": "".join(_graph_html(r, s) for r, s in zip(runs, summaries)),
        "@SUMMARY@": "".join(_summary_html(s) for s in summaries),
        "@DATA@": data,
    }
    # one pass over the template: what is filled in is never searched for markers (a run label
    # or a file path holding "@DATA@" stays text)
    template = (ASSETS / "page.html").read_text(encoding="utf-8")
    return MARKER.sub(lambda m: values[m.group(0)], template)


def write_page(
    path: str | Path,
    runs: Sequence[RunMaterial],
    options: PageOptions | None = None,
    summaries: Sequence[dict[str, Any]] | None = None,
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_page(runs, options, summaries), encoding="utf-8")
    return path


def _budget_notes(p: dict[str, Any]) -> list[str]:
    out = []
    agg = p["aggregation"]
    if agg.get("applied"):
        blocks = sum(1 for f in p["spans"]["f"] if f & 2)
        out.append(
            f"{agg['spans_in']} spans are more than the page's budget of {agg['budget']}: {agg['merged']} "
            f"spans shorter than {agg['quantum_ms']} ms lying together on a row are drawn as {blocks} blocks "
            "(hover one for its count and busy time); longer spans are drawn as they are"
        )
    if p["flows_total"] > len(p["flows"]):
        out.append(
            f"{p['flows_total']} flow arrows: every {p['flows_total'] / len(p['flows']):.1f}th drawn "
            f"({len(p['flows'])})"
        )
    return out


# ---------------------------------------------------------------------- graph beside the timeline
def _graph_html(run: RunMaterial, summary: dict[str, Any]) -> str:
    head = f"<h3>{html.escape(run.label)}</h3>"
    if run.spec is None:
        return (
            f'<section class="graph" data-run="{html.escape(run.label)}">{head}<p class="missing">no workflow '
            "graph: config.yaml is missing or does not load (see the notes)</p></section>"
        )
    from areal_graph.graph.render import to_svg

    try:
        svg = to_svg(run.spec)
    except Exception as err:  # noqa: BLE001 - a graph that cannot be drawn must not lose the timeline
        log.warning("drawing the workflow graph of %s failed: %s", run.label, err)
        return (
            f'<section class="graph">{head}<p class="missing">the graph cannot be drawn: '
            f"{html.escape(str(err))}</p></section>"
        )
    stats = {n: {**v, "fused_into": summary["fused"].get(n)} for n, v in summary["nodes"].items()}
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{v['calls']}</td><td>{v['total_s']:.2f} s</td>"
        f"<td>{100 * v['busy_share']:.1f}%</td></tr>"
        if not v["fused_into"]
        else f"<tr><td>{html.escape(n)}</td><td colspan=3>fused into {html.escape(v['fused_into'])}</td></tr>"
        for n, v in stats.items()
    )
    table = (
        "<table class='nodes'><tr><th>node</th><th>calls</th><th>total</th><th>busy</th></tr>"
        f"{rows}</table><p class='hint'>total: the node's calls added up (they overlap); busy: the share of "
        "the run with at least one call running. Click a node to pick out its spans.</p>"
    )
    data = html.escape(json.dumps(stats), quote=True)
    return (
        f'<section class="graph" data-run="{html.escape(run.label)}" data-nodes="{data}">{head}'
        f'<div class="svgbox">{svg}</div>{table}</section>'
    )


# ---------------------------------------------------------------------- summary tables
def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _summary_html(s: dict[str, Any]) -> str:
    parts = [
        f"<section class='summary'><h3>{html.escape(s['label'])}</h3>",
        f"<p>{s['spans']} spans, {s['flows']} flows, {s['wall_s']:.2f} s of trace "
        f"({html.escape(', '.join(Path(f).name for f in s['files']))})</p>",
    ]
    rows = "".join(
        f"<tr><td>{html.escape(r['process'])}</td><td>{r['busy_s']:.2f} s</td><td>{_pct(r['busy_share'])}"
        f"</td><td>{_pct(r['busy_share_steps'])}</td><td>{_pct(r['idle_share_steps'])}</td>"
        f"<td>{_pct(r['in_span_share'])}</td></tr>"
        for r in s["processes"]
    )
    parts.append(
        "<h4>busy and idle per process</h4><table><tr><th>process</th><th>busy</th><th>busy % run</th>"
        "<th>busy % steps</th><th>idle % steps</th><th>in a span % run</th></tr>" + rows + "</table>"
        "<p class='hint'>busy: compute, a worker's own housekeeping, a server swapping weights; "
        "steps: from the first training step's start to the last one's end.</p>"
    )
    cp = s["critical_path"]
    rows = "".join(
        f"<tr><td>{html.escape(b['label'])}</td><td>{b['steps']}</td><td>{_pct(b['median_share'])}</td></tr>"
        for b in cp["bounded_by"]
    )
    parts.append(
        f"<h4>what bounded each step ({cp['steps']} steps)</h4><table><tr><th>bounded by</th><th>steps</th>"
        f"<th>median share of the step</th></tr>{rows}</table>"
        f"<p class='hint'>node sides from the {html.escape(cp['sides_from'])}; per step on the "
        f"'step bounded by' track.</p>"
    )
    parts.append(_staleness_html(s["staleness"]))
    pk = s["packing"]
    if pk["available"]:
        parts.append(
            f"<h4>micro-batch packing</h4><p>median fill {_pct(pk['fill_median'])} of the "
            f"{pk['budget']}-token budget (lowest {_pct(pk['fill_min'])}); {pk['at_lower_bound']} of "
            f"{pk['steps']} steps at the lower bound of micro-batches ({pk['extra_microbatches']:.0f} extra "
            f"in all); {html.escape(pk['note'])}.</p>"
        )
    else:
        parts.append(f"<h4>micro-batch packing</h4><p class='missing'>not available: {html.escape(pk['missing'])}</p>")
    parts.append("</section>")
    return "".join(parts)


def _staleness_html(st: dict[str, Any]) -> str:
    if not st["counts"]:
        return f"<h4>staleness</h4><p class='missing'>{html.escape(st['note'])}</p>"
    top = max(st["counts"].values())
    bars = "".join(
        f"<tr><td>{k:g}</td><td><div class='bar' style='width:{120 * v / top:.0f}px'></div></td><td>{v}</td></tr>"
        for k, v in st["counts"].items()
    )
    note = f"<p class='hint'>{html.escape(st['note'])}</p>" if st["note"] else ""
    return (
        f"<h4>staleness of what was trained ({html.escape(st['unit'])}; from {html.escape(st['source'])})</h4>"
        f"<table class='hist'>{bars}</table><p>mean {st['mean']:.2f}, max {st['max']:g}</p>{note}"
    )
