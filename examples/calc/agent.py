"""A calculator agent: an ordinary OpenAI-SDK program, trained by tether unchanged.

It reads its task from ``TETHER_TASK`` (JSON with ``question``), talks to the
model named ``policy`` at ``OPENAI_BASE_URL`` with ``OPENAI_API_KEY`` (the
SDK reads both), runs ``calculator`` tool calls locally, and prints its final
answer as the last line of stdout. At most four model calls.

Run it by hand against ``tether serve``::

    OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/calc/agent.py

A warm worker pool may import this file and call :func:`main` repeatedly;
everything is read inside ``main``.
"""

from __future__ import annotations

import ast
import json
import operator
import os
from typing import Any

from openai import OpenAI

MODEL = "policy"
MAX_CALLS = 4

SYSTEM_PROMPT = "You are a math assistant. Use the calculator, then reply: The answer is N."

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "e.g. 12 * (3 + 4)",
                }
            },
            "required": ["expression"],
        },
    },
}

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        if isinstance(node.op, ast.Pow) and (abs(right) > 10 or left == 0 > right):
            raise ValueError(f"exponent {right} is out of range (|exponent| <= 10)")
        result = _OPS[type(node.op)](left, right)
        if isinstance(result, complex) or abs(result) > 1e15 or result != result:
            raise ValueError("result is out of range (|x| <= 1e+15)")
        return result
    raise ValueError(f"{type(node).__name__} is not allowed; use numbers, + - * / and parentheses")


def calculator(expression: str) -> str:
    """Evaluate ``expression`` safely; integers print without ``.0``; errors as ``error: …``."""
    try:
        if len(expression) > 200:
            raise ValueError("expression is longer than 200 characters")
        value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError:
        return f"error: not an arithmetic expression: {expression!r}"
    except (ValueError, TypeError, OverflowError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.6f}".rstrip("0").rstrip(".")


def run_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(arguments)
        return calculator(str(args["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments: {exc}"


def solve(client: OpenAI, question: str) -> str:
    """The agent loop: ask, run tool calls, stop at the first reply without one."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    answer = ""
    for _ in range(MAX_CALLS):
        response = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=128
        )
        message = response.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer.strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    answer = solve(client, task["question"])
    print(answer.replace("\n", " "))


if __name__ == "__main__":
    main()
