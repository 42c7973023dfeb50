"""The calc agent with the OpenAI Agents SDK on its default model provider: the Responses API.

Written as the SDK's quickstart writes an agent — ``Agent(name=..., tools=[...])``
run by ``Runner.run``, no model and no model settings — so every call is ``POST
{OPENAI_BASE_URL}/responses`` with the SDK's defaults for its default model
(``reasoning``, ``text.verbosity``: accepted without effect), which tether's
gateway serves and records like a chat completion; the reply's length is capped
by ``gateway.default_max_tokens``. Only ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``
are set. Tracing is turned off, as the SDK's docs say to do when the key is not
an OpenAI platform key. Prints the final answer as the last line of stdout.

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
    ModelBehaviorError,
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
    )
    try:
        result = await Runner.run(agent, question, max_turns=MAX_TURNS)
    except (MaxTurnsExceeded, ModelBehaviorError):
        # ModelBehaviorError: among others, a reply cut at max_tokens (the Responses API's
        # status "incomplete", which the SDK raises on). No answer: the grader gives 0.
        return ""
    return str(result.final_output or "").strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    answer = _loop().run_until_complete(solve(task["question"]))
    print(answer.replace("\n", " "))


def _loop() -> asyncio.AbstractEventLoop:
    """One event loop per process. The SDK's default provider shares one HTTP client per
    process, bound to the loop that first used it, so a warm worker that calls main()
    once per rollout must not start a new loop each time (``asyncio.run``)."""
    try:
        return _loop.loop  # type: ignore[attr-defined]
    except AttributeError:
        _loop.loop = asyncio.new_event_loop()  # type: ignore[attr-defined]
        return _loop.loop  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
