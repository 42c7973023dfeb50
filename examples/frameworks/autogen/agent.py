"""The calc agent with AutoGen AgentChat and an MCP workbench (Agent Lightning's Calc-X setup).

An ``AssistantAgent`` over ``OpenAIChatCompletionClient`` (pointed at
``OPENAI_BASE_URL`` with ``OPENAI_API_KEY``), whose tools come from an
``McpWorkbench`` over the calculator MCP server in ``examples/calc`` (stdio).
The agent reflects on the tool's result to write its answer. Prints the final
answer as the last line of stdout.

    OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/frameworks/autogen/agent.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams

from tether.starter.calc import SYSTEM_PROMPT

MODEL = "policy"
SERVER = Path(__file__).resolve().parents[2] / "calc" / "mcp_server.py"


def model_client() -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model=MODEL,
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        max_tokens=128,
        # A model name OpenAI does not know needs its capabilities spelled out.
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "structured_output": False,
            "family": "unknown",
        },
    )


async def solve(question: str) -> str:
    client = model_client()
    server = StdioServerParams(command=sys.executable, args=[str(SERVER)])
    try:
        async with McpWorkbench(server) as workbench:
            agent = AssistantAgent(
                "calculator_agent",
                model_client=client,
                workbench=workbench,
                system_message=SYSTEM_PROMPT,
                reflect_on_tool_use=True,
                max_tool_iterations=3,
            )
            result = await agent.run(task=question)
    finally:
        await client.close()
    return str(result.messages[-1].content).strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    answer = asyncio.run(solve(task["question"]))
    print(answer.replace("\n", " "))


if __name__ == "__main__":
    main()
