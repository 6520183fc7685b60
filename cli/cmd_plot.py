"""`areal-graph plot WORKFLOW.yaml [-o OUTDIR]`: draw the workflow graph (DOT, Mermaid, SVG).

The SVG is drawn by areal-graph itself, so no graphviz install is needed; the DOT and
Mermaid files are there for people who prefer those tools.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw a workflow graph (.dot, .mmd, .svg)",
        description="Validate WORKFLOW and write <name>.dot, <name>.mmd and <name>.svg to OUTDIR.",
        epilog="Example: areal-graph plot workflows/ppo_async.yaml -o plots/",
    )
    p.add_argument("workflow", type=Path, help="workflow YAML file")
    p.add_argument("-o", "--outdir", type=Path, default=Path("."), help="output folder (default: current)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field first (repeatable)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from areal_graph.cli.cmd_validate import load_or_report
    from areal_graph.graph import render

    console = Console()
    spec = load_or_report(args.workflow, args.overrides, console)
    if spec is None:
        return 1
    try:
        args.outdir.mkdir(parents=True, exist_ok=True)
        written = []
        for ext, fn in (("dot", render.to_dot), ("mmd", render.to_mermaid), ("svg", render.to_svg)):
            path = args.outdir / f"{spec.name}.{ext}"
            path.write_text(fn(spec), encoding="utf-8")
            written.append(path)
    except OSError as err:
        console.print(f"[red]cannot write to {args.outdir}: {err.strerror or err}[/]")
        return 1
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    return 0
