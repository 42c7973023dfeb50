"""The calc agent with the OpenAI Agents SDK on its default model provider: the Responses API.

Written as the SDK's quickstart writes an agent — ``Agent(name=..., tools=[...])``
run by ``Runner.run``, no model object — so every call is ``POST
{OPENAI_BASE_URL}/responses``, which tether's gateway serves and records like a
chat completion. Only ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` are set. Tracing
is turned off, as the SDK's docs say to do when the key is not an OpenAI
platform key. Prints the final answer as the last line of stdout.

    OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/frameworks/responses/agent.py
"""

from __future__ import annotations

import asyncio
import json
import os

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tether.starter.calc import SYSTEM_PROMPT
from tether.starter.calc import calculator as evaluate

MAX_TURNS = 4


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. 12 * (3 + 4)
    """
    return evaluate(expression)


async def solve(question: str) -> str:
    set_tracing_disabled(True)
    agent = Agent(
        name="Calculator agent",
        instructions=SYSTEM_PROMPT,
        tools=[calculator],
        model_settings=ModelSettings(max_tokens=128),
    )
    try:
        result = await Runner.run(agent, question, max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        return ""
    return str(result.final_output or "").strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    answer = asyncio.run(solve(task["question"]))
    print(answer.replace("\n", " "))


if __name__ == "__main__":
    main()
