"""The calculator as an MCP server (stdio), for ``mcp_agent.py``.

    python examples/calc/mcp_server.py     # speaks MCP on stdin/stdout

One tool, ``calculator(expression)``, evaluated with tether's safe
calculator (no ``eval``): ``+ - * /``, parentheses, small powers.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tether.starter.calc import calculator as _calculate

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer

server = MCPServer("calculator")


@server.tool(description="Evaluate an arithmetic expression.")
def calculator(expression: Annotated[str, Field(description="e.g. 12 * (3 + 4)")]) -> str:
    return _calculate(expression)


if __name__ == "__main__":
    server.run("stdio")
