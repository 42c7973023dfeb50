"""The calc agent with the official ``openai`` SDK, streaming, with parallel tool calls.

Written as the SDK's docs write a streaming tool-calling loop: ``stream=True``
with ``stream_options={"include_usage": True}``, tool-call deltas accumulated
by ``index``, every tool call of a turn run before the next request
(``parallel_tool_calls=True``). Reads ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``
and ``TETHER_TASK``; prints the final answer as the last line of stdout.

    OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/frameworks/openai_stream/agent.py
"""

from __future__ import annotations

import json
import os
from typing import Any

from openai import OpenAI

from tether.starter.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator

MODEL = "policy"
MAX_CALLS = 4


def run_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        return calculator(str(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments: {exc}"


def stream_turn(client: OpenAI, messages: list[dict[str, Any]]) -> tuple[str, list[dict]]:
    """One streamed request: the content and the tool calls, assembled from the deltas."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[CALCULATOR_TOOL],
        tool_choice="auto",
        parallel_tool_calls=True,
        max_completion_tokens=128,
        stream=True,
        stream_options={"include_usage": True},
    )
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        if not chunk.choices:  # the last chunk carries only the usage
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls or []:
            call = calls.setdefault(
                tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if tc.id:
                call["id"] = tc.id
            if tc.function and tc.function.name:
                call["function"]["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                call["function"]["arguments"] += tc.function.arguments
    return "".join(content), [calls[i] for i in sorted(calls)]


def solve(client: OpenAI, question: str) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    answer = ""
    for _ in range(MAX_CALLS):
        answer, tool_calls = stream_turn(client, messages)
        if not tool_calls:
            break
        messages.append({"role": "assistant", "content": answer or None, "tool_calls": tool_calls})
        for call in tool_calls:  # the model may ask for several at once
            result = run_tool(call["function"]["name"], call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return answer.strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    answer = solve(OpenAI(), task["question"])  # OPENAI_BASE_URL, OPENAI_API_KEY
    print(answer.replace("\n", " "))


if __name__ == "__main__":
    main()
