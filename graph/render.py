"""Draw a workflow graph as DOT, Mermaid, or a self-made SVG.

The SVG is laid out here (layers from the topological order, boxes, labelled arrows, the
dashed weight-update edge back to the rollout) so `areal-graph plot` needs no system
graphviz. DOT and Mermaid are for people who do have those tools or want to paste a graph
into Markdown.
"""

from __future__ import annotations

from html import escape
from typing import Any

import networkx as nx

from areal_graph.graph.dag import build_graph, layers
from areal_graph.graph.spec import WorkflowSpec

KIND_COLORS: dict[str, str] = {
    "rollout": "#dbeafe", "reward": "#fef3c7", "logprob": "#e0e7ff",
    "value": "#fce7f3", "advantage": "#dcfce7", "train": "#fee2e2",
}
WEIGHT_UPDATE_LABEL = "new weights (v+1)"


def _node_caption(graph: nx.DiGraph, name: str) -> str:
    data = graph.nodes[name]
    return f"{data['kind']} ({data['model']})" if data.get("model") else data["kind"]


def _edge_label(graph: nx.DiGraph, u: str, v: str) -> str:
    return ", ".join(graph.edges[u, v]["keys"])


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(spec: WorkflowSpec) -> str:
    """Graphviz DOT text: one box per node, edges labelled with keys, dashed weight update."""
    graph = build_graph(spec)
    lines = [f"digraph {_dot_id(spec.name)} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
             '  edge [fontname="Helvetica", fontsize=10];']
    for name in graph.nodes:
        label = f"{name}\\n{_node_caption(graph, name)}"
        color = KIND_COLORS.get(graph.nodes[name]["kind"], "#eeeeee")
        lines.append(f'  {_dot_id(name)} [label="{label}", fillcolor="{color}"];')
    for u, v in graph.edges:
        lines.append(f'  {_dot_id(u)} -> {_dot_id(v)} [label="{_edge_label(graph, u, v)}"];')
    for train, rollout in graph.graph["weight_update"]:
        lines.append(f'  {_dot_id(train)} -> {_dot_id(rollout)} [label="{WEIGHT_UPDATE_LABEL}", '
                     'style=dashed, constraint=false];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_id(name: str) -> str:
    return "n_" + "".join(c if c.isalnum() else "_" for c in name)


def to_mermaid(spec: WorkflowSpec) -> str:
    """Mermaid flowchart text (renders in GitHub Markdown)."""
    graph = build_graph(spec)
    lines = ["flowchart TD"]
    for name in graph.nodes:
        lines.append(f'  {_mermaid_id(name)}["{name}<br/>{_node_caption(graph, name)}"]')
    for u, v in graph.edges:
        lines.append(f'  {_mermaid_id(u)} -->|"{_edge_label(graph, u, v)}"| {_mermaid_id(v)}')
    for train, rollout in graph.graph["weight_update"]:
        lines.append(f'  {_mermaid_id(train)} -.->|"{WEIGHT_UPDATE_LABEL}"| {_mermaid_id(rollout)}')
    return "\n".join(lines) + "\n"


# ============================================================================ SVG
CHAR_W = 7.2      # approximate width of one character at font-size 12 (Helvetica/Arial)
BOX_H = 44
LAYER_GAP = 110
BOX_GAP = 40
MARGIN = 30


def _layout(graph: nx.DiGraph) -> tuple[dict[str, tuple[float, float, float]], float, float]:
    """name -> (x_center, y_top, width); plus the canvas width and height."""
    rows = layers(graph)
    widths = {n: max(len(n), len(_node_caption(graph, n))) * CHAR_W + 24 for n in graph.nodes}
    row_w = [sum(widths[n] for n in row) + BOX_GAP * (len(row) - 1) for row in rows]
    inner = max(row_w, default=0)
    pos: dict[str, tuple[float, float, float]] = {}
    for i, row in enumerate(rows):
        x = MARGIN + (inner - row_w[i]) / 2
        for n in row:
            pos[n] = (x + widths[n] / 2, MARGIN + i * LAYER_GAP, widths[n])
            x += widths[n] + BOX_GAP
    label_room = max((len(WEIGHT_UPDATE_LABEL) * CHAR_W + 60) if graph.graph.get("weight_update") else 0, 0)
    return pos, MARGIN * 2 + inner + label_room, MARGIN * 2 + max(len(rows) - 1, 0) * LAYER_GAP + BOX_H


def _text(x: float, y: float, s: str, **attrs: Any) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="middle"{extra}>{escape(s)}</text>'


def to_svg(spec: WorkflowSpec) -> str:
    """A standalone SVG drawing of the workflow (no external tools needed)."""
    graph = build_graph(spec)
    pos, width, height = _layout(graph)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height + 30:.0f}" '
        f'viewBox="0 0 {width:.0f} {height + 30:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(spec.name)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#444"/></marker></defs>',
        f'<rect width="100%" height="100%" fill="white"/>',
    ]
    labels: list[str] = []
    for u, v in graph.edges:
        (x1, y1, _), (x2, y2, _) = pos[u], pos[v]
        y1 += BOX_H
        mid = (y1 + y2) / 2
        out.append(f'<path class="edge" data-from="{escape(u)}" data-to="{escape(v)}" '
                   f'd="M {x1:.1f} {y1:.1f} C {x1:.1f} {mid:.1f}, {x2:.1f} {mid:.1f}, {x2:.1f} {y2:.1f}" '
                   'fill="none" stroke="#444" stroke-width="1.2" marker-end="url(#arrow)"/>')
        # Label on the curve's midpoint, over a white patch so crossing lines stay readable;
        # drawn after all edges so no later line runs across a label.
        label = _edge_label(graph, u, v)
        lx, ly = (x1 + x2) / 2, mid
        w = len(label) * CHAR_W * 0.85 + 8
        labels.append(f'<rect x="{lx - w / 2:.1f}" y="{ly - 9:.1f}" width="{w:.1f}" height="14" fill="white" '
                      'fill-opacity="0.85"/>')
        labels.append(_text(lx, ly + 2, label, font_size=10, fill="#333", class_="edge-label"))
    out.extend(labels)
    right = max((x + w / 2 for x, _, w in pos.values()), default=MARGIN)
    for k, (train, rollout) in enumerate(graph.graph.get("weight_update", [])):
        (tx, ty, tw), (rx, ry, rw) = pos[train], pos[rollout]
        lane = right + 30 + 14 * k
        sx, sy = tx + tw / 2, ty + BOX_H / 2
        ex, ey = rx + rw / 2, ry + BOX_H / 2
        out.append(f'<path class="weight-update" data-from="{escape(train)}" data-to="{escape(rollout)}" '
                   f'd="M {sx:.1f} {sy:.1f} L {lane:.1f} {sy:.1f} L {lane:.1f} {ey:.1f} L {ex:.1f} {ey:.1f}" '
                   'fill="none" stroke="#b91c1c" stroke-width="1.4" stroke-dasharray="6 4" marker-end="url(#arrow)"/>')
        out.append(f'<text x="{lane + 6:.1f}" y="{(sy + ey) / 2:.1f}" fill="#b91c1c" font-size="10">'
                   f"{escape(WEIGHT_UPDATE_LABEL)}</text>")
    for name, (x, y, w) in pos.items():
        kind = graph.nodes[name]["kind"]
        out.append(f'<g class="node" data-name="{escape(name)}" data-kind="{kind}">'
                   f'<rect x="{x - w / 2:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_H}" rx="8" '
                   f'fill="{KIND_COLORS.get(kind, "#eeeeee")}" stroke="#333" stroke-width="1.2"/>'
                   + _text(x, y + 18, name, font_weight="bold")
                   + _text(x, y + 34, _node_caption(graph, name), font_size=11, fill="#555")
                   + "</g>")
    out.append(_text(width / 2, height + 18, f"workflow {spec.name}", font_size=11, fill="#777"))
    out.append("</svg>")
    return "\n".join(out) + "\n"
