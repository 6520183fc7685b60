"""Command-line helpers for the tests of cli/cmd_*.py."""

from __future__ import annotations

import argparse
from types import ModuleType


def parser_of(command: ModuleType, name: str):
    """`parse(*argv)` for one subcommand: the namespace its own `register()` parses `name *argv`
    into, as `areal-graph name *argv` would (without the rest of the CLI)."""

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="areal-graph")
        command.register(parser.add_subparsers(dest="command"))
        return parser.parse_args([name, *argv])

    return parse
