"""The calculator as an MCP server (stdio): the tool `workflows/agent_calculator_mcp.yaml` trains with.

    python -m areal_graph.workflows.mcp_servers.calculator

It offers one tool, `calculator(expression: str)`, with the same name, parameter and answers as the
calculator agent's tool (workflows/rollout/calculator_agent.py): the safe evaluator of
tools/calculator.py, whose reply is a number or "Error: ..." text, never an exception. The
builtin kit tiny-calc learnt that tool's name and argument in its SFT data, so its calls hit this
server unchanged, and the tool messages it reads back are the same text, token for token.

Why a server of our own: the shipped MCP example must run offline, in the test suite, and show
the whole path (spawn, tools/list, tools/call, shutdown) with a tool whose answers are checkable.
Written with the SDK's `MCPServer`, as anyone would write one; point `rollout_args.command` at
your own server instead.
"""

from __future__ import annotations

import logging

from areal_graph.tools.calculator import calculate

TOOL_NAME = "calculator"
DESCRIPTION = "Evaluate an arithmetic expression."


def calculator(expression: str) -> str:
    """The tool: the value of `expression` as text, or "Error: ..." (refused or failed)."""
    return calculate(expression)


def build_server():  # -> mcp.server.mcpserver.MCPServer (mcp is an optional dependency)
    """The MCP server offering `calculator`; quiet on stderr (warnings only), since a run keeps
    the server's stderr in the rollout worker's log."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("areal-graph-calculator", log_level="WARNING")
    server.add_tool(calculator, name=TOOL_NAME, description=DESCRIPTION, structured_output=False)
    return server


def main() -> None:
    """Serve over stdio until the client closes stdin."""
    logging.basicConfig(level=logging.WARNING)
    build_server().run("stdio")


if __name__ == "__main__":
    main()
