"""A scripted fake judge: a real OpenAI-compatible HTTP server on a loopback port that
answers every chat completion with canned text, for tests of ``rollout.grader: judge``.

``ScriptedJudge(script)`` serves ``POST /v1/chat/completions`` and ``GET /v1/models``;
``script(body)`` returns the answer's text, or an ``int`` HTTP status to fail with.
Every request body is kept in :attr:`ScriptedJudge.requests`, every Authorization
header in :attr:`ScriptedJudge.keys`. :func:`scoring` makes a script that reads the
task and candidates back out of tether's prompt and scores each answer with a function.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tether.gateway import BackgroundServer

Script = Callable[[dict[str, Any]], "str | int"]

_CANDIDATE = re.compile(r'<candidate id="(\d+)">\n(.*?)\n</candidate>', re.S)
_TASK = re.compile(r"<task>\n(.*?)\n</task>", re.S)


def candidates(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The task row and ``{label: answer}`` of a judge request made by tether."""
    user = body["messages"][-1]["content"]
    task = json.loads(_TASK.search(user)[1])  # type: ignore[index]
    return task, dict(_CANDIDATE.findall(user))


def scoring(score: Callable[[dict[str, Any], str], float]) -> Script:
    """A script that scores each candidate with ``score(task, answer)``."""

    def script(body: dict[str, Any]) -> str:
        task, found = candidates(body)
        return json.dumps(
            {
                k: {"explanation": f"answer {a[:40]!r}", "score": score(task, a)}
                for k, a in found.items()
            }
        )

    return script


class ScriptedJudge:
    """The fake judge's server; ``with ScriptedJudge(script) as judge: judge.base_url``."""

    def __init__(self, script: Script | str | int, model: str = "scripted-judge") -> None:
        """``script``: a function of the request body, or the one answer (text or status)."""
        self.script: Script = script if callable(script) else (lambda _: script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.keys: list[str | None] = []
        app = FastAPI()
        app.post("/v1/chat/completions")(self._chat)
        app.get("/v1/models")(self._models)
        self.server = BackgroundServer(app)

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    async def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "x"}]}

    async def _chat(self, request: Request) -> Any:
        body = await request.json()
        self.requests.append(body)
        self.keys.append(request.headers.get("authorization"))
        answer = self.script(body)
        if isinstance(answer, int):
            error = {"message": f"scripted failure {answer}", "type": "server_error"}
            return JSONResponse({"error": error}, status_code=answer)
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def __enter__(self) -> ScriptedJudge:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
