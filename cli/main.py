"""Entry point of the `areal-graph` command.

Each subcommand lives in its own module `areal_graph.cli.cmd_<name>` exposing
`register(subparsers)`; that module sets `func` on its parser. Modules are imported only
to build the parser, and heavy imports (torch, transformers) happen inside `func`, so
`areal-graph --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from rich.console import Console
from rich.logging import RichHandler

from areal_graph import __version__

# Order is the order shown in --help.
SUBCOMMANDS = ["run", "validate", "plot", "init_model", "eval", "serve", "trace", "costs", "simulate", "tune", "slurm"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="areal-graph",
        description=(
            "Asynchronous RL for language models on reasoning tasks. The RL loop is a dataflow "
            "graph declared in YAML (rollout -> reward -> logprob -> advantage -> train), run "
            "over gRPC workers with bounded staleness and interruptible generation."
        ),
        epilog="Start with: areal-graph run workflows/ppo_async.yaml",
    )
    parser.add_argument("--version", action="version", version=f"areal-graph {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"areal_graph.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"areal_graph.cli.cmd_{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    for command in sub.choices.values():  # main() reports a stray argument with its command's usage
        command.set_defaults(command_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    # transformers' per-file loading/saving bars would interleave with our rich output (and
    # every worker's log); set before transformers is imported, inherited by child processes.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    # KEY=VALUE overrides may stand anywhere on the line (`run wf.yaml --run-dir d k=v`),
    # which argparse alone does not allow after an option; collect the stragglers here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if isinstance(getattr(args, "overrides", None), list) and all(
            "=" in e and not e.startswith("-") for e in extra
        ):
            args.overrides.extend(extra)
        else:
            hint = ""
            if isinstance(getattr(args, "overrides", None), list) and any(e.startswith("--") for e in extra):
                hint = " (a workflow field is set as KEY=VALUE, e.g. runtime.steps=3, not as an option)"
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(
        level=level,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False)],
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, for records (slurm's header)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
