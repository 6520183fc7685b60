"""An MCP server (stdio) for the MCP client's failure tests, run by path:
`python tests/support/mcp_flaky_server.py`. Tools: `echo` answers, `slow` sleeps past a call
timeout, `fail` reports a tool error, `crash` writes to stderr and kills the server mid-call."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("flaky", log_level="WARNING")


@server.tool(structured_output=False)
def echo(text: str) -> str:
    """Say it back."""
    return text


@server.tool(structured_output=False)
def slow(seconds: float) -> str:
    """Answer after `seconds`."""
    time.sleep(seconds)
    return "late"


@server.tool(structured_output=False)
def fail() -> str:
    """A tool error."""
    raise ToolError("the database is down")


@server.tool(structured_output=False)
def crash() -> str:
    """Die mid-call, saying why on stderr."""
    sys.stderr.write("flaky: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
