"""MCP servers of our own, run over stdio by the MCP tool agent (workflows/rollout/mcp_tool_agent.py)."""
