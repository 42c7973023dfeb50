"""The runner contract: what one rollout attempt is, what it returns, and the agent's env.

A runner starts the unchanged agent for one rollout attempt (:class:`Launch`)
and reports how it ended (:class:`AttemptResult`). It never raises for faults
of the agent (non-zero exit, exception, timeout, output flood); those are
statuses. It raises only for mistakes of its caller or user::

    RunnerError(TetherError)
    ├── RunnerConfigError(RunnerError, UserError)  a RunnerConfig/Launch value is wrong
    ├── AgentLoadError(RunnerError, UserError)     RunnerConfig.agent cannot be imported or called
    └── WorkerError(RunnerError)                   a pool worker broke its protocol (internal,
                                                   reported to callers as a FAILED attempt)

The agent's environment (docs/design.md, "Agent contract") is built only by
:func:`agent_env`: the five contract variables, a short list of harmless
variables copied from the parent, and the user's explicit ``extra_env``.
Nothing else of the parent's environment (admin key, cloud credentials)
reaches an agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from tether.errors import TetherError, UserError
from tether.records import RolloutStatus

__all__ = [
    "CONTRACT_VARS",
    "INFRA_FAULTS",
    "SAFE_BASE_VARS",
    "AgentLoadError",
    "Attempt",
    "AttemptResult",
    "Launch",
    "Runner",
    "RunnerConfigError",
    "RunnerError",
    "WorkerError",
    "agent_env",
    "base_env",
]

log = logging.getLogger(__name__)

#: The variables every agent gets (docs/design.md, "Agent contract").
CONTRACT_VARS = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "TETHER_ROLLOUT_ID",
    "TETHER_TASK",
    "TETHER_REWARD_URL",
)
#: Parent variables copied when set: what a program needs to start and find its packages.
SAFE_BASE_VARS = ("PATH", "HOME", "LANG", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
#: Never passed to an agent, even through ``extra_env``.
FORBIDDEN_VARS = ("TETHER_ADMIN_KEY",)

#: Infrastructure faults (``AttemptResult.infra``): the attempt is retried, the agent not blamed.
INFRA_FAULTS = (
    "killed",  # a signal tether did not send (OOM killer, an operator, a dying host)
    "worker_lost",  # a pool or Ray worker died under the attempt
    "node_lost",  # the machine (Ray node, Kubernetes node) went away
    "evicted",  # the pod was evicted or preempted
    "unschedulable",  # the attempt could not be placed (no node, image pull failed)
    "gateway_unreachable",  # the agent could not connect to the gateway
    "engine_lost",  # a model call could not reach its inference server (a replica down)
)
#: Deaths by these signals, when tether did not send them, are infrastructure faults;
#: others (SIGSEGV, SIGABRT, ...) are the agent crashing.
FOREIGN_KILL_SIGNALS = frozenset(
    {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
)
#: What the OpenAI SDK prints when it cannot reach its base URL (the gateway).
GATEWAY_UNREACHABLE_MARKERS = ("APIConnectionError",)


class RunnerError(TetherError):
    """Base of everything :mod:`tether.runner` raises on purpose."""


class RunnerConfigError(RunnerError, UserError):
    """A runner setting is wrong; the message names the value, the rule and the fix."""


class AgentLoadError(RunnerError, UserError):
    """The agent named by ``RunnerConfig.agent`` cannot be imported, or is not what the mode needs."""


class WorkerError(RunnerError):
    """A pool worker died or answered something that is not its protocol."""


@dataclass(frozen=True)
class Launch:
    """One attempt of one rollout, as the trainer hands it to a runner.

    ``base_url`` is ``{gateway}/rollouts/{rollout_id}/v1``; ``token`` is the
    rollout's own bearer token; ``reward_url`` is set only when the run lets
    agents report their reward. ``timeout_s=None`` means the runner config's.
    """

    rollout_id: str
    attempt: int
    base_url: str
    token: str
    task: dict[str, Any]
    reward_url: str | None = None
    timeout_s: float | None = None
    run_id: str | None = None  # labels remote attempts (Kubernetes Jobs) with their run

    def __post_init__(self) -> None:
        if not self.rollout_id:
            raise RunnerConfigError("launch.rollout_id ('') must be a non-empty rollout id")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise RunnerConfigError(
                f"launch.timeout_s ({self.timeout_s}) must be > 0 seconds, or None for the "
                "runner's timeout_s"
            )


@dataclass
class AttemptResult:
    """How one attempt ended.

    ``status`` is SUCCEEDED (the agent exited 0 / returned), FAILED, TIMEOUT or
    CANCELLED. ``final_answer`` is the last non-empty stdout line (process and
    pool modes) or the returned answer (in-process). ``output_tail`` holds the
    last ``max_output_bytes`` of stdout and stderr, interleaved as they came.
    ``agent_value`` is a reward returned by an in-process agent, else None;
    whether to accept it is the trainer's decision (the run config's).

    ``infra`` names an infrastructure fault (one of :data:`INFRA_FAULTS`) when
    the attempt ended because of something other than the agent: a signal
    tether did not send, a lost worker or node, an evicted pod, a gateway the
    agent could not reach. Such an attempt is retried as a new one (up to
    ``max_attempts``); an attempt with ``infra=None`` failed on its own merits.
    """

    rollout_id: str
    attempt: int
    status: RolloutStatus
    exit_code: int | None = None
    final_answer: str | None = None
    output_tail: str = ""
    agent_value: float | None = None
    error: str | None = None
    duration_s: float = 0.0
    infra: str | None = None

    def __post_init__(self) -> None:
        if self.infra is not None and self.infra not in INFRA_FAULTS:
            raise ValueError(f"infra ({self.infra!r}) must be one of {', '.join(INFRA_FAULTS)}")

    @property
    def ok(self) -> bool:
        return self.status is RolloutStatus.SUCCEEDED


@runtime_checkable
class Runner(Protocol):
    """Starts agents for rollout attempts. Every mode implements this."""

    #: Called with each launch as its agent starts (the trainer marks the rollout running).
    on_start: Callable[[Launch], None] | None

    async def run(self, launch: Launch) -> AttemptResult:
        """Run one attempt to its end. Never raises for agent faults; returns a status.

        Cancelling the awaiting task stops the agent (its whole process group)
        and re-raises :class:`asyncio.CancelledError`; :meth:`close` makes
        attempts still running return ``CANCELLED``.
        """
        ...

    async def close(self) -> None:
        """Stop every agent and worker this runner started; nothing is left running."""
        ...


def base_env(
    extra_env: Mapping[str, str] | None = None, parent_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of an agent without its rollout: safe parent variables + ``extra_env``."""
    parent = os.environ if parent_env is None else parent_env
    env = {name: parent[name] for name in SAFE_BASE_VARS if parent.get(name)}
    env.setdefault("PATH", os.defpath)
    env.update(extra_env or {})
    return env


def agent_env(
    launch: Launch,
    extra_env: Mapping[str, str] | None = None,
    *,
    parent_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of the agent for ``launch``; nothing else is passed on.

    The contract variables are ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
    ``ANTHROPIC_BASE_URL`` (the base URL without its ``/v1``: the ``anthropic`` SDK and
    Claude Code add it), ``ANTHROPIC_API_KEY`` (the same rollout token),
    ``TETHER_ROLLOUT_ID``, ``TETHER_TASK`` (JSON) and ``TETHER_REWARD_URL``
    (only when the launch has one). The safe base is ``PATH``, ``HOME``,
    ``LANG``, ``TMPDIR``, ``PYTHONPATH`` and ``VIRTUAL_ENV``, each only if set
    in ``parent_env`` (default: ``os.environ``). ``extra_env`` (the config's,
    validated) is added last but cannot replace a contract variable.
    """
    for name in extra_env or {}:
        if name in CONTRACT_VARS or name in FORBIDDEN_VARS:
            raise RunnerConfigError(
                f"extra_env sets {name!r}, which tether controls; remove it from extra_env"
            )
    env = base_env(extra_env, parent_env)
    env["OPENAI_BASE_URL"] = launch.base_url
    env["OPENAI_API_KEY"] = launch.token
    env["ANTHROPIC_BASE_URL"] = launch.base_url.removesuffix("/v1")
    env["ANTHROPIC_API_KEY"] = launch.token
    env["TETHER_ROLLOUT_ID"] = launch.rollout_id
    env["TETHER_TASK"] = json.dumps(launch.task, ensure_ascii=False)
    if launch.reward_url:
        env["TETHER_REWARD_URL"] = launch.reward_url
    return env


def result_for(launch: Launch, status: RolloutStatus, **fields: Any) -> AttemptResult:
    """An :class:`AttemptResult` for ``launch`` (fills its rollout id and attempt)."""
    return AttemptResult(
        rollout_id=launch.rollout_id, attempt=launch.attempt, status=status, **fields
    )


def rebase(launch: Launch, gateway_url: str | None) -> Launch:
    """``launch`` with its gateway part (before ``/rollouts/``) replaced by ``gateway_url``."""
    if not gateway_url:
        return launch

    def moved(url: str | None) -> str | None:
        if url is None:
            return None
        _head, sep, tail = url.partition("/rollouts/")
        return f"{gateway_url.rstrip('/')}{sep}{tail}" if sep else url

    return replace(launch, base_url=moved(launch.base_url), reward_url=moved(launch.reward_url))


def timeout_of(launch: Launch, default_s: float) -> float:
    """The launch's own deadline, or the runner's default."""
    return default_s if launch.timeout_s is None else launch.timeout_s


def infra_of_exit(exit_code: int | None, *, signalled_by_us: bool) -> str | None:
    """``"killed"`` for a death by a kill signal tether did not send, else None."""
    if exit_code is None or exit_code >= 0 or signalled_by_us:
        return None
    return "killed" if -exit_code in FOREIGN_KILL_SIGNALS else None


def unreachable_gateway(output_tail: str) -> bool:
    """Whether a failed agent's last output says it could not connect to the gateway."""
    last = output_tail[-2048:]
    return any(marker in last for marker in GATEWAY_UNREACHABLE_MARKERS)


def exit_error(exit_code: int | None) -> str | None:
    """A one-line reason for a non-zero exit code (negative: killed by that signal)."""
    if exit_code is None or exit_code == 0:
        return None
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"agent was killed by {name}"
    return f"agent exited with code {exit_code}"


T = TypeVar("T")


async def finish_despite_cancel(awaitable: Awaitable[T]) -> T:
    """Await cleanup to its end even if the awaiting task is cancelled meanwhile.

    Used in ``except CancelledError`` blocks (and ``finally``) so a cancelled
    rollout still kills and reaps its processes before the cancellation
    propagates. A cancellation of the caller that arrives during the cleanup
    is not lost: once the cleanup has ended it is raised (``CancelledError``),
    whatever the cleanup returned.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})  # unlike awaiting the task, never cancels it
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation takes precedence
        raise asyncio.CancelledError
    return task.result()


class Attempt:
    """A started attempt: :meth:`wait` for its end, or :meth:`cancel` it.

    ``Attempt(runner, launch)`` starts ``runner.run(launch)`` as a task on the
    running loop; every runner gets start / watch / cancel this way.
    """

    def __init__(self, runner: Runner, launch: Launch) -> None:
        self.launch = launch
        self._task: asyncio.Task[AttemptResult] = asyncio.ensure_future(runner.run(launch))

    def done(self) -> bool:
        """Whether the attempt has ended (its result is ready)."""
        return self._task.done()

    async def wait(self) -> AttemptResult:
        """The attempt's end; cancelled attempts end ``CANCELLED``."""
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # the waiter was cancelled, not the attempt
            return result_for(self.launch, RolloutStatus.CANCELLED, error="attempt was cancelled")

    async def cancel(self) -> AttemptResult:
        """Stop the agent (its runner's way) and return the attempt's end."""
        self._task.cancel()
        return await finish_despite_cancel(self.wait())
