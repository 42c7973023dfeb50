"""In-process mode: ``await agent(task, client)`` on the trainer's own event loop.

No process is started, so a rollout costs only the agent's own work. The
agent gets the task (a dict) and an ``openai.AsyncOpenAI`` bound to its
rollout (base URL and token), and returns one of:

- a ``str``: the final answer, handed to the grader;
- a number: the agent's reward (``agent_value``);
- a ``dict`` with ``"answer"`` and/or ``"reward"``: both;
- ``None``: nothing (the reward then comes from the reward route or nowhere).

Retries: the client keeps the OpenAI SDK's default ``max_retries=2``, so an
agent behaves as it would as a process with the same SDK (the gateway answers
429/503 while admission is paused, and a retry is what rides that out). Each
request's own timeout is the attempt's deadline. The clients of all rollouts
share one HTTP connection pool, closed by :meth:`InProcessRunner.close`.

An agent that swallows cancellation cannot be stopped from outside; after the
deadline plus ``grace_s`` it is abandoned (left to finish on its own) and the
attempt is reported as TIMEOUT.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tether.records import RolloutStatus

from ._base import (
    AgentLoadError,
    AttemptResult,
    Launch,
    finish_despite_cancel,
    result_for,
    timeout_of,
)
from ._pool_worker import load_callable
from ._runner_base import RunnerBase

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["AgentFn", "InProcessRunner", "interpret_return"]

log = logging.getLogger(__name__)

AgentFn = Callable[[dict[str, Any], Any], Awaitable[Any]]
MAX_RETRIES = 2  # the OpenAI SDK's default; see the module docstring


def interpret_return(value: object) -> tuple[str | None, float | None]:
    """``(final_answer, agent_value)`` from what an in-process agent returned.

    Raises ``TypeError`` for anything else, with the accepted shapes in the message.
    """
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None, float(value)  # NaN/inf stay as they are: unusable, never 0
    if isinstance(value, dict) and value.keys() & {"answer", "reward"}:
        answer, reward = value.get("answer"), value.get("reward")
        if answer is not None and not isinstance(answer, str):
            raise TypeError(f"agent returned answer {answer!r}; it must be a str or None")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise TypeError(f"agent returned reward {reward!r}; it must be a number or None")
        return answer, None if reward is None else float(reward)
    raise TypeError(
        f"agent returned {type(value).__name__} {value!r:.80}; return a str (the answer), a "
        "number (the reward), a dict with 'answer' and/or 'reward', or None"
    )


class InProcessRunner(RunnerBase):
    """Awaits ``config.entry`` (an ``async def agent(task, client)``) once per attempt.

    ``agent`` may be given directly (a coroutine function) instead of by name.
    """

    def __init__(self, config: RunnerConfig, *, agent: AgentFn | None = None) -> None:
        super().__init__(config)
        self.agent = agent if agent is not None else self._load(config)
        call = type(self.agent).__call__  # an object with an async __call__ counts too
        if not (inspect.iscoroutinefunction(self.agent) or inspect.iscoroutinefunction(call)):
            raise AgentLoadError(
                f"agent ({config.entry!r}) must be an 'async def agent(task, client)' "
                "in inprocess mode; use mode 'pool' for a synchronous main()"
            )
        import openai  # here, not at module level: process and pool modes never need it

        self._openai = openai
        self._http: Any = None  # openai.DefaultAsyncHttpxClient, made on first use
        self._tasks: set[asyncio.Task[Any]] = set()

    @staticmethod
    def _load(config: RunnerConfig) -> AgentFn:
        try:
            return load_callable(str(config.entry), config.cwd)
        except Exception as exc:
            raise AgentLoadError(
                f"cannot import agent ({config.entry!r}): {type(exc).__name__}: {exc}"
            ) from exc

    def _client(self, launch: Launch, timeout: float) -> Any:
        openai = self._openai
        if self._http is None:
            self._http = openai.DefaultAsyncHttpxClient()
        return openai.AsyncOpenAI(
            base_url=launch.base_url,
            api_key=launch.token,
            max_retries=MAX_RETRIES,
            timeout=timeout,
            http_client=self._http,
        )

    async def _run(self, launch: Launch) -> AttemptResult:
        timeout = timeout_of(launch, self.config.timeout_s)
        started = time.monotonic()
        task = asyncio.ensure_future(self.agent(launch.task, self._client(launch, timeout)))
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            await finish_despite_cancel(self._stop(task))
            raise
        duration = time.monotonic() - started
        if not done:
            await self._stop(task)
            return result_for(
                launch,
                RolloutStatus.TIMEOUT,
                error=f"agent ran past its timeout of {timeout:g}s and was cancelled",
                duration_s=duration,
            )
        if task.cancelled():
            return result_for(
                launch, RolloutStatus.CANCELLED, error="agent was cancelled", duration_s=duration
            )
        exc = task.exception()
        if exc is not None:
            unreachable = isinstance(exc, self._openai.APIConnectionError) and not isinstance(
                exc, self._openai.APITimeoutError
            )
            return result_for(
                launch,
                RolloutStatus.FAILED,
                error=f"{type(exc).__name__}: {exc}",
                output_tail=_tail("".join(traceback.format_exception(exc)), self.config),
                duration_s=duration,
                infra="gateway_unreachable" if unreachable else None,
            )
        try:
            answer, value = interpret_return(task.result())
        except TypeError as bad:
            return result_for(launch, RolloutStatus.FAILED, error=str(bad), duration_s=duration)
        if value is not None and not math.isfinite(value):
            log.warning("rollout %s: agent returned a non-finite reward", launch.rollout_id)
        return result_for(
            launch,
            RolloutStatus.SUCCEEDED,
            final_answer=answer,
            agent_value=value,
            duration_s=duration,
        )

    def _forget(self, task: asyncio.Task[Any]) -> None:
        """Done callback: drop the task; read its exception so an abandoned one is not logged."""
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()

    async def _stop(self, task: asyncio.Task[Any]) -> None:
        """Cancel the agent's task; give it ``grace_s`` to unwind, then abandon it."""
        task.cancel()
        _done, pending = await asyncio.wait({task}, timeout=self.config.grace_s)
        if pending:
            log.warning("an in-process agent ignored cancellation; abandoning it")

    async def close(self) -> None:
        """Cancel running agents (their attempts return CANCELLED) and close the HTTP pool."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.config.grace_s)
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _tail(text: str, config: RunnerConfig) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= config.max_output_bytes:
        return text
    cut = len(data) - config.max_output_bytes
    return f"[... {cut} bytes truncated ...]\n" + data[cut:].decode("utf-8", errors="replace")
