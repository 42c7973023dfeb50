"""The calc agent with its calculator behind a real MCP server (stdio).

Like ``agent.py`` (same environment variables, same loop, answer on the last
stdout line), but the tools come from ``mcp_server.py``: the agent starts the
server as a subprocess, lists its tools, offers them to the model in OpenAI
format, and forwards each tool call to the server — as in Agent Lightning's
Calc-X example.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... TETHER_TASK='{"question": "..."}' \\
    python examples/calc/mcp_agent.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from tether.starter.calc import SYSTEM_PROMPT

MODEL = "policy"
MAX_CALLS = 4
SERVER = Path(__file__).with_name("mcp_server.py")


def _tidy_schema(schema: Any) -> Any:
    """Drop pydantic's ``title`` keys and put ``type`` then ``description`` first,
    the order hand-written OpenAI tool schemas use (the prompt renders key order)."""
    if isinstance(schema, list):
        return [_tidy_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    first = [k for k in ("type", "description") if k in schema]
    out: dict[str, Any] = {}
    for key in first + [k for k in schema if k not in first and k != "title"]:
        value = schema[key]
        if key == "properties":  # property names are data, not schema keywords
            out[key] = {name: _tidy_schema(sub) for name, sub in value.items()}
        else:
            out[key] = _tidy_schema(value)
    return out


def openai_tool(tool: Any) -> dict[str, Any]:
    """An MCP tool description as an OpenAI function tool."""
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": _tidy_schema(schema),
        },
    }


@contextlib.asynccontextmanager
async def connect(server: Path = SERVER) -> AsyncIterator[Any]:
    """An MCP client session to ``server`` started with this Python over stdio."""
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(server)])
    try:
        from mcp import Client  # mcp >= 2
    except ImportError:  # mcp 1.x
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session
        return
    async with Client(params) as client:
        yield client


async def call_tool(session: Any, name: str, arguments: str) -> str:
    """Run one tool call on the MCP server; failures come back as ``error: …`` text."""
    try:
        args = json.loads(arguments)
        if not isinstance(args, dict):
            raise TypeError("arguments must be a JSON object")
        result = await session.call_tool(name, args)
    except Exception as exc:  # the model sees the error, as it would from any tool
        return f"error: {exc}"
    text = "".join(getattr(part, "text", "") for part in result.content)
    failed = getattr(result, "is_error", None) or getattr(result, "isError", False)
    return f"error: {text}" if failed and not text.startswith("error") else text


async def solve(client: AsyncOpenAI, question: str, server: Path = SERVER) -> str:
    """The agent loop over the MCP server's tools."""
    async with connect(server) as session:
        tools = [openai_tool(t) for t in (await session.list_tools()).tools]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        answer = ""
        for _ in range(MAX_CALLS):
            response = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=tools, max_tokens=128
            )
            message = response.choices[0].message
            answer = message.content or ""
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = await call_tool(session, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return answer.strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    answer = asyncio.run(solve(AsyncOpenAI(), task["question"]))
    print(answer.replace("\n", " "))


if __name__ == "__main__":
    main()
