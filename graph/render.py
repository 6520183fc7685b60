"""Draw a workflow graph as DOT, Mermaid, or a self-made SVG.

The SVG is laid out here (layers from the topological order, boxes, labelled arrows, the
dashed weight-update edge back to the rollout) so `areal-graph plot` needs no system
graphviz. DOT and Mermaid are for people who do have those tools or want to paste a graph
into Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

import networkx as nx

from areal_graph.graph.dag import build_graph, layers
from areal_graph.graph.spec import WorkflowSpec

KIND_COLORS: dict[str, str] = {
    "rollout": "#dbeafe",
    "reward": "#fef3c7",
    "logprob": "#e0e7ff",
    "value": "#fce7f3",
    "advantage": "#dcfce7",
    "train": "#fee2e2",
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
    lines = [
        f"digraph {_dot_id(spec.name)} {{",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for name in graph.nodes:
        label = f"{name}\\n{_node_caption(graph, name)}"
        color = KIND_COLORS.get(graph.nodes[name]["kind"], "#eeeeee")
        lines.append(f'  {_dot_id(name)} [label="{label}", fillcolor="{color}"];')
    for u, v in graph.edges:
        lines.append(f'  {_dot_id(u)} -> {_dot_id(v)} [label="{_edge_label(graph, u, v)}"];')
    for train, rollout in graph.graph["weight_update"]:
        lines.append(
            f'  {_dot_id(train)} -> {_dot_id(rollout)} [label="{WEIGHT_UPDATE_LABEL}", style=dashed, constraint=false];'
        )
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
# A small Sugiyama-style layout: layers by longest path, a "dummy" slot in every layer a long
# edge crosses (so it never runs through a box, and its label has reserved room), one
# barycentre sweep to reduce crossings, and edge ends spread along the box sides.
CHAR_W = 7.2  # approximate width of one character at font-size 12 (Helvetica/Arial)
LABEL_CHAR_W = 6.0  # ... at font-size 10
BOX_H = 44
LAYER_GAP = 110
BOX_GAP = 36
MARGIN = 30

Item = Any  # a node name (str) or a dummy slot ("~", u, v, layer)


@dataclass
class _Layout:
    x: dict[Item, float]  # centre x of every node and dummy slot
    y: dict[Item, float]  # top y
    w: dict[Item, float]  # width
    chains: dict[tuple[str, str], list[Item]]  # edge -> [u, dummies..., v]
    width: float
    height: float


def _label_width(label: str) -> float:
    return len(label) * LABEL_CHAR_W + 10


def _layout(graph: nx.DiGraph) -> _Layout:
    rows: list[list[Item]] = [list(r) for r in layers(graph)]
    layer_of = {n: i for i, r in enumerate(rows) for n in r}
    w: dict[Item, float] = {n: max(len(n), len(_node_caption(graph, n))) * CHAR_W + 24 for n in graph.nodes}
    chains: dict[tuple[str, str], list[Item]] = {}
    preds: dict[Item, list[Item]] = {}
    for u, v in graph.edges:
        chain: list[Item] = [u]
        for layer in range(layer_of[u] + 1, layer_of[v]):
            dummy = ("~", u, v, layer)
            rows[layer].append(dummy)
            # The first slot carries the label; the others only a line.
            w[dummy] = _label_width(_edge_label(graph, u, v)) if layer == layer_of[u] + 1 else 12
            chain.append(dummy)
        chain.append(v)
        chains[(u, v)] = chain
        for a, b in zip(chain, chain[1:]):
            preds.setdefault(b, []).append(a)

    def row_width(row: list[Item]) -> float:
        return sum(w[i] for i in row) + BOX_GAP * max(len(row) - 1, 0)

    inner = max((row_width(r) for r in rows), default=0.0)
    x: dict[Item, float] = {}

    def place(row: list[Item]) -> None:
        left = MARGIN + (inner - row_width(row)) / 2
        for item in row:
            x[item] = left + w[item] / 2
            left += w[item] + BOX_GAP

    index = {item: i for r in rows for i, item in enumerate(r)}
    for i, row in enumerate(rows):
        if i:  # barycentre of the producers above; declaration order breaks ties
            row.sort(key=lambda it: (sum(x[p] for p in preds.get(it, [])) / max(len(preds.get(it, [])), 1), index[it]))
        place(row)
    y = {item: float(MARGIN + i * LAYER_GAP) for i, r in enumerate(rows) for item in r}
    height = MARGIN + max(len(rows) - 1, 0) * LAYER_GAP + BOX_H
    return _Layout(x, y, w, chains, inner + 2 * MARGIN, height)


def _ports(lay: _Layout, graph: nx.DiGraph) -> dict[tuple[str, str], tuple[float, float]]:
    """(edge) -> (x where it leaves its producer, x where it enters its consumer)."""
    out: dict[tuple[str, str], list[float]] = {e: [0.0, 0.0] for e in lay.chains}
    for name in graph.nodes:
        for end, edges, neighbour in (
            (0, list(graph.out_edges(name)), lambda c: c[1]),
            (1, list(graph.in_edges(name)), lambda c: c[-2]),
        ):
            edges.sort(key=lambda e: lay.x[neighbour(lay.chains[e])])
            left = lay.x[name] - lay.w[name] / 2
            for k, e in enumerate(edges):
                out[e][end] = left + lay.w[name] * (k + 1) / (len(edges) + 1)
    return {e: (a, b) for e, (a, b) in out.items()}


def _text(x: float, y: float, s: str, **attrs: Any) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="middle"{extra}>{escape(s)}</text>'


def _edge_path(lay: _Layout, chain: list[Item], x_out: float, x_in: float) -> str:
    """Vertical-tangent cubic segments between layers, straight lines through dummy slots."""
    pts: list[tuple[float, float, float]] = []  # (x, y_enter, y_leave) per chain item
    for k, item in enumerate(chain):
        x = x_out if k == 0 else x_in if k == len(chain) - 1 else lay.x[item]
        pts.append((x, lay.y[item], lay.y[item] + BOX_H))
    d = f"M {pts[0][0]:.1f} {pts[0][2]:.1f}"
    for (x1, _, y1), (x2, y2, y2_leave) in zip(pts, pts[1:]):
        mid = (y1 + y2) / 2
        d += f" C {x1:.1f} {mid:.1f}, {x2:.1f} {mid:.1f}, {x2:.1f} {y2:.1f}"
        if (x2, y2, y2_leave) != pts[-1]:
            d += f" L {x2:.1f} {y2_leave:.1f}"
    return d


def to_svg(spec: WorkflowSpec) -> str:
    """A standalone SVG drawing of the workflow (no external tools needed)."""
    graph = build_graph(spec)
    lay = _layout(graph)
    ports = _ports(lay, graph)
    updates = graph.graph.get("weight_update", [])
    lane_room = (_label_width(WEIGHT_UPDATE_LABEL) + 30) if updates else 0
    width = lay.width + lane_room
    bottom = lay.height + (16 + 10 * len(updates) if updates else 0)
    total_h = bottom + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{total_h:.0f}" '
        f'viewBox="0 0 {width:.0f} {total_h:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(spec.name)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#444"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    labels: list[str] = []
    for (u, v), chain in lay.chains.items():
        x_out, x_in = ports[(u, v)]
        out.append(
            f'<path class="edge" data-from="{escape(u)}" data-to="{escape(v)}" '
            f'd="{_edge_path(lay, chain, x_out, x_in)}" fill="none" stroke="#444" stroke-width="1.2" '
            'marker-end="url(#arrow)"/>'
        )
        label = _edge_label(graph, u, v)
        if len(chain) > 2:  # in the slot reserved for it
            lx, ly = lay.x[chain[1]], lay.y[chain[1]] + BOX_H / 2
        else:  # halfway down the gap between the two layers
            lx, ly = (x_out + x_in) / 2, (lay.y[u] + BOX_H + lay.y[v]) / 2
        lw = _label_width(label)
        # Drawn after all edges, over a white patch, so no line runs across a label.
        labels.append(
            f'<rect x="{lx - lw / 2:.1f}" y="{ly - 8:.1f}" width="{lw:.1f}" height="14" fill="white" '
            'fill-opacity="0.9"/>'
        )
        labels.append(_text(lx, ly + 3, label, font_size=10, fill="#333", class_="edge-label"))
    out.extend(labels)
    lane = lay.width + 10
    for k, (train, rollout) in enumerate(updates):
        # Down below the graph, right to a lane past every box, up, and into the rollout's side:
        # the path never crosses a box.
        sx, sy = lay.x[train], lay.y[train] + BOX_H
        floor = lay.height + 16 + 10 * k
        ex, ey = lay.x[rollout] + lay.w[rollout] / 2, lay.y[rollout] + BOX_H / 2
        lx = lane + 10 * k
        out.append(
            f'<path class="weight-update" data-from="{escape(train)}" data-to="{escape(rollout)}" '
            f'd="M {sx:.1f} {sy:.1f} L {sx:.1f} {floor:.1f} L {lx:.1f} {floor:.1f} L {lx:.1f} {ey:.1f} '
            f'L {ex:.1f} {ey:.1f}" fill="none" stroke="#b91c1c" stroke-width="1.4" stroke-dasharray="6 4" '
            'marker-end="url(#arrow)"/>'
        )
        if k == 0:
            out.append(
                f'<text x="{lane + 6 + 10 * len(updates):.1f}" y="{(ey + floor) / 2:.1f}" fill="#b91c1c" '
                f'font-size="10">{escape(WEIGHT_UPDATE_LABEL)}</text>'
            )
    for name in graph.nodes:
        x, y, w = lay.x[name], lay.y[name], lay.w[name]
        kind = graph.nodes[name]["kind"]
        out.append(
            f'<g class="node" data-name="{escape(name)}" data-kind="{kind}">'
            f'<rect x="{x - w / 2:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_H}" rx="8" '
            f'fill="{KIND_COLORS.get(kind, "#eeeeee")}" stroke="#333" stroke-width="1.2"/>'
            + _text(x, y + 18, name, font_weight="bold")
            + _text(x, y + 34, _node_caption(graph, name), font_size=11, fill="#555")
            + "</g>"
        )
    out.append(_text(width / 2, bottom + 20, f"workflow {spec.name}", font_size=11, fill="#777"))
    out.append("</svg>")
    return "\n".join(out) + "\n"
