"""Rollouts at the gateway: open, retry, authorize, finish, reward, read.

:class:`RolloutLifecycle` is the half of :class:`~tether.gateway.Gateway` that manages
rollouts: their tokens, their sampling overrides and the seeds of their calls (the
other half, ``calls``, serves model calls). It works on the gateway's store, keys and
config, and drops a finished rollout's conversation from the render cache.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tether.engine import SamplingParams
from tether.records import (
    AttemptEnd,
    Call,
    Place,
    Reward,
    RewardSource,
    Rollout,
    RolloutStatus,
    agent_task,
)
from tether.store import Store

from .._config import GatewayConfig
from .._errors import Conflict, Forbidden, InvalidRequest, UnknownRollout
from .auth import Keys, check_rollout_id, check_rollout_token, hash_token, new_token

__all__ = ["OpenedRollout", "RolloutLifecycle"]


@dataclass(frozen=True)
class OpenedRollout:
    """What an agent needs: give it ``base_url`` and ``token`` (never the admin key)."""

    rollout_id: str
    attempt: int
    token: str
    base_url: str
    reward_url: str

    @property
    def anthropic_base_url(self) -> str:
        """The base URL for Anthropic clients (``ANTHROPIC_BASE_URL``): ``base_url`` without
        its ``/v1``, which the ``anthropic`` SDK adds."""
        return self.base_url.removesuffix("/v1")

    def as_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "token": self.token,
            "base_url": self.base_url,
            "anthropic_base_url": self.anthropic_base_url,
            "reward_url": self.reward_url,
        }


@dataclass
class _Attempt:
    """What the gateway keeps of a rollout's current attempt while it runs (in memory: it
    matters while the rollout runs in this process), read without a store look-up."""

    attempt: int
    overrides: dict[str, float]  # the sampling overrides (``open_rollout(sampling=...)``)
    seed_base: bytes  # the base of its calls' derived seeds (RolloutLifecycle)
    draws: int = 0  # the seeds drawn so far: the index of the next call


class RolloutLifecycle:
    """Rollouts, their tokens, their sampling overrides and their calls' seeds.

    A sampled call whose request carries no ``seed`` gets one derived from
    ``seed`` (the run's), the rollout's id within its run (the ``{run_id}-``
    prefix removed), the attempt and the call's index in the attempt (its
    ``seq`` for an agent that calls one at a time). What a rollout samples then
    depends neither on the order in which concurrent agents' calls reach the
    engine nor on the run id, so a rerun or a resumed run with the same seed
    samples the same tokens from the same weights.
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        config: GatewayConfig,
        end_conversation: Callable[[tuple[str, int]], None],
        seed: int,
    ) -> None:
        self.store = store
        self.keys = keys
        self.config = config
        # what the model calls keep per conversation (rendered history, a lost server mark)
        self.end_conversation = end_conversation
        self.seed = seed
        # Rollouts created without a run id belong to this run (``tether serve`` sets it).
        self.default_run_id: str | None = None
        # rollout id -> its current attempt's overrides and seeds, set when it starts, so
        # that a call reads the store once (to authorize) and this dict
        self._attempts: dict[str, _Attempt] = {}

    def overrides(self, rollout_id: str) -> dict[str, float]:
        """The sampling overrides of the rollout (``open_rollout(sampling=...)``), or {}."""
        current = self._attempts.get(rollout_id)
        return current.overrides if current is not None else {}

    def _seed_base(self, rollout_id: str, run_id: str | None, attempt: int) -> bytes:
        name = rollout_id.removeprefix(f"{run_id}-") if run_id else rollout_id
        return f"{self.seed}\0{name}\0{attempt}".encode()

    def _run_of(self, rollout_id: str) -> str | None:
        rollout = self.store.get_rollout(rollout_id)
        return rollout.run_id if rollout is not None else None

    def derived_seed(self, rollout_id: str, attempt: int) -> int:
        """The seed of the attempt's next call (see the class docstring); counts the call."""
        current = self._attempts.get(rollout_id)
        if current is None or current.attempt != attempt:  # not started here (a restart)
            overrides = current.overrides if current is not None else {}
            base = self._seed_base(rollout_id, self._run_of(rollout_id), attempt)
            current = self._attempts[rollout_id] = _Attempt(attempt, overrides, base)
        index = current.draws
        current.draws += 1
        digest = hashlib.blake2b(current.seed_base + b"\0%d" % index, digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 2

    def seeded(self, params: SamplingParams, rollout_id: str, attempt: int) -> SamplingParams:
        """``params`` with the derived seed of the attempt's next call, if it samples unseeded."""
        if params.seed is None and params.temperature > 0:
            return replace(params, seed=self.derived_seed(rollout_id, attempt))
        return params

    def open_rollout(
        self,
        task: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
        run_id: str | None = None,
        group_id: str | None = None,
        task_id: str | None = None,
        sampling: dict[str, float] | None = None,
        queued: bool = False,
        place: Place | None = None,
    ) -> OpenedRollout:
        """Create a rollout, start its first attempt and mint its token.

        ``place``: where the training loop puts it in its run (phase, step, group, index),
        stored with it; None for a rollout opened outside the loop.

        ``sampling`` overrides what the agent asks for (``temperature``,
        ``top_p``) on every call of this rollout: the trainer uses it to
        evaluate an unchanged agent greedily. ``queued``: the attempt waits
        for a runner, which calls :meth:`mark_running` when it starts the
        agent (the agent's first call does it too); else it is running now.
        The stored task is what the agent reads: a ``grader`` field is never kept.
        """
        rid = check_rollout_id(rollout_id) if rollout_id else f"r-{uuid.uuid4().hex[:16]}"
        if self.store.get_rollout(rid) is not None:
            raise Conflict(f"rollout {rid!r} already exists", param="rollout_id")
        run = run_id or self.default_run_id
        self.store.create_rollout(
            Rollout(
                id=rid,
                run_id=run,
                task_id=task_id,
                group_id=group_id,
                task=agent_task(task or {}),  # as the agent reads it: no "grader" field
                place=place,
            )
        )
        if sampling:
            unknown = set(sampling) - {"temperature", "top_p"}
            if unknown:
                raise InvalidRequest(
                    f"sampling overrides {sorted(unknown)} are not supported", param="sampling"
                )
        return self._start(rid, queued, sampling, run)

    def retry_rollout(
        self, rollout_id: str, *, sampling: dict[str, float] | None = None, queued: bool = False
    ) -> OpenedRollout:
        """Start a new attempt (after a failure or timeout); the old token then gets 409.

        ``sampling`` restores the overrides given to :meth:`open_rollout`
        (finishing the failed attempt dropped them).
        """
        return self._start(rollout_id, queued, sampling, self._run_of(rollout_id))

    def mark_running(self, rollout_id: str, attempt: int) -> None:
        """A ``queued`` attempt's agent has started (runners call this); no-op if running."""
        self.store.mark_running(rollout_id, attempt)

    def _start(
        self, rollout_id: str, queued: bool, sampling: dict[str, float] | None, run_id: str | None
    ) -> OpenedRollout:
        """Start an attempt; ``sampling`` (when given) replaces the rollout's overrides."""
        token = new_token()
        previous = self.store.rollout_auth(rollout_id)
        attempt = self.store.start_attempt(rollout_id, hash_token(token), queued=queued)
        if previous is not None and previous[2]:
            self.keys.supersede(previous[2], hash_token(token))
        before = self._attempts.get(rollout_id)
        overrides = dict(sampling) if sampling else before.overrides if before else {}
        base = self._seed_base(rollout_id, run_id, attempt)
        self._attempts[rollout_id] = _Attempt(attempt, overrides, base)
        base = self.config.base_url
        return OpenedRollout(
            rollout_id=rollout_id,
            attempt=attempt,
            token=token,
            base_url=f"{base}/rollouts/{rollout_id}/v1",
            reward_url=f"{base}/rollouts/{rollout_id}/reward",
        )

    def current_attempt(self, rollout_id: str) -> int:
        """The attempt the rollout is at (to end it without knowing which: the admin API);
        UnknownRollout when there is no such rollout."""
        auth = self.store.rollout_auth(rollout_id)
        if auth is None:
            raise UnknownRollout(f"no rollout {rollout_id!r}")
        return auth[1]

    def finish_rollout(
        self,
        end: AttemptEnd,
        *,
        reward: float | None = None,
        source: RewardSource = RewardSource.GRADER,
        final_answer: str | None = None,
    ) -> Rollout:
        """End a rollout's attempt as ``end`` says (its token stops working), with an
        optional final reward; the store keeps ``end`` with the attempt
        (:meth:`Store.finish_rollout`, :meth:`Store.attempts`)."""
        rollout_id, attempt = end.rollout_id, end.attempt
        self._attempts.pop(rollout_id, None)
        auth = self.store.rollout_auth(rollout_id)
        self.end_conversation((rollout_id, attempt))  # it takes no more calls
        if (
            auth is not None
            and auth[0] is RolloutStatus.QUEUED
            and auth[1] == attempt >= 1
            and RolloutStatus(end.status) is not RolloutStatus.CANCELLED
        ):  # its runner ran it without saying so: queued → running → final, never a jump
            self.store.mark_running(rollout_id, attempt)
        return self.store.finish_rollout(
            end,
            reward=reward,
            reward_source=source if reward is not None else None,
            final_answer=final_answer,
        )

    def record_reward(
        self,
        rollout_id: str,
        value: float,
        *,
        call_seq: int | None = None,
        attempt: int | None = None,
        source: RewardSource = RewardSource.AGENT,
    ) -> None:
        """Record a reward for the rollout's ``attempt`` (default: its current one).

        An agent's reward (``source`` AGENT) needs ``gateway.allow_agent_rewards``.
        """
        if source is RewardSource.AGENT and not self.config.allow_agent_rewards:
            raise Forbidden(
                "this run does not accept rewards from agents (gateway.allow_agent_rewards is off)",
            )
        if attempt is None:
            attempt = self.current_attempt(rollout_id)
        self.store.record_reward(
            Reward(
                rollout_id=rollout_id,
                value=float(value),
                source=source,
                attempt=attempt,
                call_seq=call_seq,
            )
        )

    def authorize(self, rollout_id: str, token: str | None) -> int:
        """The rollout's current attempt if ``token`` is its own (400/401/403/409 otherwise).

        A queued attempt whose agent calls is evidently running: it is marked so.
        """
        check_rollout_id(rollout_id)
        auth = self.store.rollout_auth(rollout_id)
        attempt = check_rollout_token(token, auth, self.keys, self.store.token_in_use)
        if auth is not None and auth[0] is RolloutStatus.QUEUED:
            self.mark_running(rollout_id, attempt)
        return attempt

    def rollouts(
        self, *, run_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[Rollout]:
        """The stored rollouts, newest first, by run and status (a status name)."""
        try:
            st = RolloutStatus(status) if status else None
        except ValueError:
            raise InvalidRequest(f"unknown status {status!r}", param="status") from None
        return self.store.list_rollouts(run_id=run_id, status=st, limit=limit)

    def rollout(self, rollout_id: str) -> tuple[Rollout, list[Call]]:
        """One rollout and its calls (404 if there is none)."""
        check_rollout_id(rollout_id)
        rollout = self.store.get_rollout(rollout_id)
        if rollout is None:
            raise UnknownRollout(f"no rollout {rollout_id!r}")
        return rollout, self.store.calls(rollout_id)
