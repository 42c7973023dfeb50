"""The calc agent as an in-process callable: ``async def agent(task, client)``.

tether runs it inside its own process with an ``AsyncOpenAI`` client already
pointed at the rollout (base URL and key set). It returns the final answer
text; the run's grader turns that into the reward. The loop is the same as
``agent.py``: at most four model calls, calculator calls run locally.
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI

from tether.starter.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator

MODEL = "policy"
MAX_CALLS = 4


def _run_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        return calculator(str(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments: {exc}"


async def agent(task: dict[str, Any], client: AsyncOpenAI) -> str:
    """Solve ``task["question"]`` with the calculator; return the final answer text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    answer = ""
    for _ in range(MAX_CALLS):
        response = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=128
        )
        message = response.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = _run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer.strip()
