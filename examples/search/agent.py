"""The search agent: answers questions about a made-up archipelago with a ``search`` tool.

An ordinary OpenAI-SDK program, trained by tether unchanged. It reads its task
from ``TETHER_TASK`` (JSON with ``question``), talks to the model ``policy`` at
``OPENAI_BASE_URL`` with ``OPENAI_API_KEY``, runs ``search(query)`` calls
against the local BM25 index (:mod:`doc_search`), and prints its final answer
as the last line of stdout. Some questions need two searches (the festival of
the town where someone was born), so it allows up to ``MAX_CALLS`` calls.

    OPENAI_BASE_URL=http://127.0.0.1:8321/rollouts/<id>/v1 OPENAI_API_KEY=<token> \\
    TETHER_TASK='{"question": "Who founded the town of Lumzar?"}' \\
    python examples/search/agent.py

A warm worker pool imports this file once (the index is built on first use and
kept) and calls :func:`main` per rollout.
"""

from __future__ import annotations

import json
import os
from typing import Any

import openai
from doc_search import SEARCH_TOOL, search
from openai import OpenAI

MODEL = "policy"
MAX_CALLS = 5
MAX_TOKENS = 128

SYSTEM_PROMPT = (
    "You answer questions about the Tessaly Isles. Use the search tool to find the "
    "articles you need, then reply: The answer is X."
)


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; every failure comes back as ``error: …`` text for the model."""
    if name != "search":
        return f"error: unknown tool {name!r}; the only tool is 'search'"
    try:
        args = json.loads(arguments)
        return search(str(args["query"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments: {exc}"


def solve(client: OpenAI, question: str, max_tokens: int = MAX_TOKENS) -> str:
    """Ask, run searches, stop at the first reply without a tool call (or a full context)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    answer = ""
    for _ in range(MAX_CALLS):
        try:
            response = client.chat.completions.create(
                model=MODEL, messages=messages, tools=[SEARCH_TOOL], max_tokens=max_tokens
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
