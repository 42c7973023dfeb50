"""The calc agent with structured outputs: a forced tool call, then a Pydantic answer.

Written as the ``openai`` SDK's docs write structured outputs: the first turn
forces the calculator (``tool_choice={"type": "function", ...}``), so the
model's reply is always a calculator call with arguments valid against the
tool's schema; the second turn asks for the answer as an ``Answer`` with
``client.chat.completions.parse(response_format=Answer)`` (a strict
``json_schema`` built from the Pydantic model) and reads ``message.parsed``.
tether's gateway enforces both with grammar-constrained decoding, so even an
untrained model's replies parse. Reads ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``
and ``TETHER_TASK``; prints the final answer as the last line of stdout.

    OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/frameworks/structured/agent.py
"""

from __future__ import annotations

import json
import os
from typing import Any

from openai import OpenAI
from pydantic import BaseModel, Field

from tether.starter.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator

MODEL = "policy"
# The calculator as a strict tool: arguments exactly as declared, the expression bounded
# (bounding strings is good practice with structured outputs: a model that has not learnt
# to close a string yet then still produces a call that parses).
CALCULATOR = {
    "type": "function",
    "function": {
        **CALCULATOR_TOOL["function"],
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 48}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}


class Answer(BaseModel):
    """The agent's final answer."""

    answer: int = Field(ge=-1_000_000, le=1_000_000, description="the number asked for")


def solve(client: OpenAI, question: str) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    first = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[CALCULATOR],
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        max_completion_tokens=64,
    )
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        expression = str(json.loads(call.function.arguments)["expression"])
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": calculator(expression)}
        )
    final = client.chat.completions.parse(
        model=MODEL, messages=messages, response_format=Answer, max_completion_tokens=32
    )
    parsed = final.choices[0].message.parsed
    assert parsed is not None, final.choices[0].message.content
    return parsed.answer


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    print(f"The answer is {solve(OpenAI(), task['question'])}.")


if __name__ == "__main__":
    main()
