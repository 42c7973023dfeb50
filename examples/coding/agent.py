"""The coding agent: fixes a bug in a tiny repository with file and test tools.

An ordinary OpenAI-SDK program, trained by tether unchanged. It reads its task
from ``TETHER_TASK`` (JSON with ``instruction`` and the repository's
``files``), writes the repository to a fresh temporary directory, and lets
the model ``policy`` at ``OPENAI_BASE_URL`` work on it with three tools:
``read_file(path)``, ``write_file(path, content)`` and ``run_tests()`` (the
repository's visible tests, pytest in a subprocess with a time limit). Paths
are confined to the temporary directory. When the model stops calling tools
(or after ``MAX_CALLS`` calls) the agent prints, as the last line of stdout,
the files it changed: ``{"files": {path: content}, "summary": "..."}``. The
grader runs the hidden tests against exactly those changes.

    OPENAI_BASE_URL=http://127.0.0.1:8321/rollouts/<id>/v1 OPENAI_API_KEY=<token> \\
    TETHER_TASK="$(sed -n 1p examples/coding/tasks.jsonl)" \\
    python examples/coding/agent.py
"""

from __future__ import annotations

import json
import os
from typing import Any

import openai
from coding_workspace import Workspace
from openai import OpenAI

MODEL = "policy"
MAX_CALLS = 12
MAX_TOKENS = 1024

SYSTEM_PROMPT = (
    "You fix bugs in a small Python repository. Read the code with read_file, replace a "
    "file with write_file (give its whole new content), and check your fix with run_tests. "
    "When the tests pass, reply with one line saying what you changed."
)


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS: list[dict[str, Any]] = [
    _function(
        "read_file",
        "Read a file of the repository.",
        {"path": {"type": "string", "description": "relative path, e.g. roman.py"}},
    ),
    _function(
        "write_file",
        "Replace a file of the repository (or create it) with the given content.",
        {
            "path": {"type": "string", "description": "relative path, e.g. roman.py"},
            "content": {"type": "string", "description": "the whole new file"},
        },
    ),
    _function("run_tests", "Run the repository's tests (pytest) and show the result.", {}),
]


def run_tool(ws: Workspace, name: str, arguments: str) -> str:
    """Run one tool call on the workspace; every failure comes back as ``error: …`` text."""
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise TypeError("arguments must be a JSON object")
        if name == "read_file":
            return ws.read_file(args["path"])
        if name == "write_file":
            return ws.write_file(args["path"], args["content"])
        if name == "run_tests":
            return ws.run_tests()
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments for {name}: {exc!r}"
    return f"error: unknown tool {name!r}; the tools are read_file, write_file, run_tests"


def solve(client: OpenAI, task: dict[str, Any], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """Work on a copy of ``task["files"]``; return ``{"files": changed, "summary": text}``."""
    with Workspace(task["files"]) as ws:
        listing = "\n".join(f"- {path}" for path in sorted(task["files"]))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{task['instruction']}\n\nFiles:\n{listing}"},
        ]
        summary = ""
        for _ in range(MAX_CALLS):
            try:
                response = client.chat.completions.create(
                    model=MODEL, messages=messages, tools=TOOLS, max_tokens=max_tokens
                )
            except openai.BadRequestError as exc:
                if "context" not in str(exc):
                    raise
                break  # the conversation outgrew the model's context: keep what was done
            message = response.choices[0].message
            summary = message.content or ""
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = run_tool(ws, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return {"files": ws.changed_files(), "summary": summary.strip()}


def reply_budget() -> int:
    """Tokens per reply: ``AGENT_MAX_TOKENS`` if set (quick runs), else ``MAX_TOKENS``."""
    return int(os.environ.get("AGENT_MAX_TOKENS") or MAX_TOKENS)


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    print(json.dumps(solve(client, task, reply_budget())))


if __name__ == "__main__":
    main()
