"""DOT, Mermaid and SVG contain every node and edge; the SVG is well-formed and laid out sanely."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from areal_graph.graph import render
from areal_graph.graph.dag import build_graph
from areal_graph.graph.loader import load_workflow
from support.paths import FIXTURES, REPO

WORKFLOWS = sorted((REPO / "workflows").glob("*.yaml"))
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(params=WORKFLOWS, ids=lambda p: p.name)
def spec(request):
    return load_workflow(request.param)


def test_dot(spec):
    dot = render.to_dot(spec)
    graph = build_graph(spec)
    assert dot.startswith(f'digraph "{spec.name}" {{') and dot.rstrip().endswith("}")
    for name in spec.nodes:
        assert re.search(rf'^  "{name}" \[label="{name}\\n', dot, re.M)
    for u, v, d in graph.edges(data=True):
        assert f'"{u}" -> "{v}" [label="{", ".join(d["keys"])}"];' in dot
    for t, r in graph.graph["weight_update"]:
        assert re.search(rf'"{t}" -> "{r}" \[.*style=dashed, constraint=false\]', dot)
    assert dot.count("->") == graph.number_of_edges() + len(graph.graph["weight_update"])
    assert dot.count("{") == dot.count("}")


def test_mermaid(spec):
    mmd = render.to_mermaid(spec)
    graph = build_graph(spec)
    assert mmd.startswith("flowchart TD\n")
    for name in spec.nodes:
        assert f'n_{name}["{name}<br/>' in mmd
    for u, v, d in graph.edges(data=True):
        assert f'n_{u} -->|"{", ".join(d["keys"])}"| n_{v}' in mmd
    for t, r in graph.graph["weight_update"]:
        assert f"n_{t} -.->|" in mmd and mmd.strip().endswith(f"n_{r}")


def _boxes(root) -> dict[str, tuple[float, float, float, float]]:
    out = {}
    for g in root.iter(f"{SVG_NS}g"):
        if g.get("class") == "node":
            r = g.find(f"{SVG_NS}rect")
            out[g.get("data-name")] = tuple(float(r.get(k)) for k in ("x", "y", "width", "height"))
    return out


def test_svg(spec):
    svg = render.to_svg(spec)
    root = ET.fromstring(svg)
    graph = build_graph(spec)
    boxes = _boxes(root)
    assert set(boxes) == set(spec.nodes)
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    for name in spec.nodes:
        assert name in texts
    paths = [p for p in root.iter(f"{SVG_NS}path") if p.get("class") in ("edge", "weight-update")]
    edges = {(p.get("data-from"), p.get("data-to")) for p in paths if p.get("class") == "edge"}
    assert edges == set(graph.edges)
    labels = [t.text for t in root.iter(f"{SVG_NS}text") if t.get("class") == "edge-label"]
    assert sorted(labels) == sorted(", ".join(d["keys"]) for _, _, d in graph.edges(data=True))
    dashed = [p for p in paths if p.get("class") == "weight-update"]
    assert [(p.get("data-from"), p.get("data-to")) for p in dashed] == graph.graph["weight_update"]
    assert all(p.get("stroke-dasharray") for p in dashed)

    # Layout sanity: boxes inside the canvas, no two overlap, producers above consumers.
    width, height = float(root.get("width")), float(root.get("height"))
    items = list(boxes.items())
    for name, (x, y, w, h) in items:
        assert 0 <= x and x + w <= width and 0 <= y and y + h <= height, name
    for i, (a, (ax, ay, aw, ah)) in enumerate(items):
        for b, (bx, by, bw, bh) in items[i + 1 :]:
            overlap = ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah
            assert not overlap, (a, b)
    for u, v in graph.edges:
        assert boxes[u][1] < boxes[v][1]
    # Every edge leaves its producer's bottom side and enters its consumer's top side, and
    # no edge runs through a box that is not one of its two ends.
    for p in paths:
        points = _sample_path(p.get("d"))
        (ux, uy, uw, uh), (vx, vy, vw, _) = boxes[p.get("data-from")], boxes[p.get("data-to")]
        if p.get("class") == "edge":
            (x0, y0), (x1, y1) = points[0], points[-1]
            assert ux < x0 < ux + uw and y0 == pytest.approx(uy + uh, abs=0.1)
            assert vx < x1 < vx + vw and y1 == pytest.approx(vy, abs=0.1)
        for other, (bx, by, bw, bh) in boxes.items():
            if other in (p.get("data-from"), p.get("data-to")):
                continue
            for x, y in points:
                assert not (bx + 1 < x < bx + bw - 1 and by + 1 < y < by + bh - 1), (p.get("data-from"), other)


def _sample_path(d: str) -> list[tuple[float, float]]:
    """Points along an SVG path made of M, L and C commands (what render.py writes)."""
    tokens = re.findall(r"[MLC]|-?\d+(?:\.\d+)?", d)
    points: list[tuple[float, float]] = []
    i, cur = 0, (0.0, 0.0)
    while i < len(tokens):
        cmd = tokens[i]
        if cmd in "ML":
            nxt = (float(tokens[i + 1]), float(tokens[i + 2]))
            steps = 1 if cmd == "M" else 20
            points += (
                [
                    (cur[0] + (nxt[0] - cur[0]) * t / steps, cur[1] + (nxt[1] - cur[1]) * t / steps)
                    for t in range(1, steps + 1)
                ]
                if cmd == "L"
                else [nxt]
            )
            cur, i = nxt, i + 3
        else:  # C x1 y1, x2 y2, x y
            c = [float(t) for t in tokens[i + 1 : i + 7]]
            p0, p1, p2, p3 = cur, (c[0], c[1]), (c[2], c[3]), (c[4], c[5])
            for k in range(1, 41):
                t = k / 40
                a, b, cc, dd = (1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t**2, t**3
                points.append(
                    (a * p0[0] + b * p1[0] + cc * p2[0] + dd * p3[0], a * p0[1] + b * p1[1] + cc * p2[1] + dd * p3[1])
                )
            cur, i = p3, i + 7
    return points


def test_svg_escapes_names():
    from dataclasses import replace

    spec = load_workflow(REPO / "workflows/ppo_async.yaml")
    svg = render.to_svg(replace(spec, name="a<b&c"))
    ET.fromstring(svg)
    assert "a&lt;b&amp;c" in svg


def test_svg_of_every_test_workflow_is_drawable():
    """A wider graph (the minimal test workflow plus every shipped one) still lays out without overlaps."""
    from areal_graph.graph.loader import load_workflow as load

    svg = render.to_svg(load(FIXTURES / "minimal.yaml"))
    root = ET.fromstring(svg)
    assert len(_boxes(root)) == 6
