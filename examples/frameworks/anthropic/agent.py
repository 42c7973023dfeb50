"""The calc agent with the official ``anthropic`` SDK: the Messages API's tool-use loop.

Written as Anthropic's tool-use docs write it: ``client.messages.create`` with
``system``, ``tools`` (``input_schema``) and a required ``max_tokens``; while the
``stop_reason`` is ``tool_use``, the reply's ``content`` goes back as the assistant
turn and each ``tool_use`` block is answered by a ``tool_result`` block. Reads
``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` (tether sets both for every agent:
the rollout's base URL without ``/v1``, and its token) and ``TETHER_TASK``; prints
the final answer as the last line of stdout.

    ANTHROPIC_BASE_URL=http://127.0.0.1:8321 ANTHROPIC_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/frameworks/anthropic/agent.py
"""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic

from tether.starter.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator

MODEL = "policy"
MAX_CALLS = 4
TOOLS = [
    {
        "name": "calculator",
        "description": CALCULATOR_TOOL["function"]["description"],
        "input_schema": CALCULATOR_TOOL["function"]["parameters"],
    }
]


def run_tool(name: str, tool_input: dict[str, Any]) -> tuple[str, bool]:
    """The tool's text and whether it is an error (``is_error``)."""
    if name != "calculator":
        return f"error: unknown tool {name!r}", True
    try:
        return calculator(str(tool_input["expression"])), False
    except (KeyError, TypeError) as exc:
        return f"error: bad input: {exc}", True


def solve(client: anthropic.Anthropic, question: str) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    answer = ""
    for _ in range(MAX_CALLS):
        response = client.messages.create(
            model=MODEL,
            max_tokens=128,
            system=SYSTEM_PROMPT,
            tools=TOOLS,
            messages=messages,
        )
        answer = "".join(block.text for block in response.content if block.type == "text")
        if response.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": response.content})
        results = []
        for block in response.content:
            if block.type == "tool_use":
                text, error = run_tool(block.name, block.input)
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": block.id,
                        "content": text,
                        "is_error": error,
                    }
                )
        messages.append({"role": "user", "content": results})
    return answer.strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    answer = solve(anthropic.Anthropic(), task["question"])  # ANTHROPIC_BASE_URL, _API_KEY
    print(answer.replace("\n", " "))


if __name__ == "__main__":
    main()
