"""The wordmath agent: grade-school word problems, solved with a calculator tool.

An ordinary OpenAI-SDK program, trained by tether unchanged. It reads its task
from ``TETHER_TASK`` (JSON with ``question``), talks to the model ``policy`` at
``OPENAI_BASE_URL`` with ``OPENAI_API_KEY`` (the SDK reads both), runs
``calculator`` tool calls locally, and prints its final answer as the last
line of stdout. Word problems take several steps, so it allows up to
``MAX_CALLS`` model calls. The prompt and tool are the calc task's, so a model
that learned the calculator there starts from what it knows.

    OPENAI_BASE_URL=http://127.0.0.1:8321/rollouts/<id>/v1 OPENAI_API_KEY=<token> \\
    TETHER_TASK='{"question": "A farm has 3 cows and 5 chickens. How many legs?"}' \\
    python examples/wordmath/agent.py

A warm worker pool imports this file once and calls :func:`main` per rollout.
"""

from __future__ import annotations

import json
import os
from typing import Any

import openai
from openai import OpenAI

from tether.starter.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator

MODEL = "policy"
MAX_CALLS = 6
MAX_TOKENS = 128


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; every failure comes back as ``error: …`` text for the model."""
    if name != "calculator":
        return f"error: unknown tool {name!r}; the only tool is 'calculator'"
    try:
        args = json.loads(arguments)
        return calculator(str(args["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments: {exc}"


def solve(client: OpenAI, question: str, max_tokens: int = MAX_TOKENS) -> str:
    """Ask, run tool calls, stop at the first reply without one (or when the context is full)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    answer = ""
    for _ in range(MAX_CALLS):
        try:
            response = client.chat.completions.create(
                model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=max_tokens
            )
        except openai.BadRequestError as exc:
            if "context" not in str(exc):
                raise
            break  # the conversation outgrew the model's context: answer with what we have
        message = response.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer.strip()


def reply_budget() -> int:
    """Tokens per reply: ``AGENT_MAX_TOKENS`` if set (quick runs), else ``MAX_TOKENS``."""
    return int(os.environ.get("AGENT_MAX_TOKENS") or MAX_TOKENS)


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    print(solve(client, task["question"], reply_budget()).replace("\n", " "))


if __name__ == "__main__":
    main()
