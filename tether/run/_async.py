"""Async mode: groups keep running while the trainer updates between them.

:class:`AsyncRollouts` keeps up to ``max_in_flight`` groups (one task × ``n``
rollouts each) running through the collector (``_collect``: opening, attempts,
grading, ending), starting a new group whenever one finishes; its policy
(:class:`AsyncPolicy`) is how many run, how many make an update, how stale one
may be and, with ``rollout.filter_groups``, which are dropped without signal.
Per update (:meth:`AsyncRollouts.step`):

1. wait until ``batch_groups`` finished groups within the lag bound are ready
   (``wait_s``);
2. close admission at the gateway and wait until no model call is in flight
   (``drain_s``); calls that arrive now are held, not refused;
3. learn on the first ``batch_groups`` ready groups in the order they
   finished: update, push the weights (the engine's version rises by one);
4. reopen admission; the held calls run on the new weights
   (``paused_s``, ``calls_held``, ``hold_s``).

Ready groups beyond the batch and unfinished groups carry over; each group
is trained at most once, and none is kept once trained or dropped: a run
keeps counts (:meth:`AsyncRollouts.stats`), and ``watch``, when set, is shown
each group's fate as it is decided. A group's lag is the version of the weights it
would train minus the oldest policy version among its calls. Beyond
``max_lag``, ``lag_policy="drop"`` discards it as soon as it is seen
(``groups_dropped_lag``); ``"reweight"`` keeps it, and the loss's ratio
against the recorded engine logprobs (plus ``trainer.tis_cap``) accounts
for the older behaviour policy. The version only changes at an update, so
checking when a group is ready and again after each update is the same as
checking when it is trained.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tether.records import GroupFate, Phase, Place, Task, UpdateGroup
from tether.run._collect import Collector
from tether.run._finish import RolloutOutcome
from tether.run._learn import decided
from tether.trainer.errors import TrainerError

__all__ = ["AsyncPolicy", "AsyncRollouts", "Group", "Watch", "group_lag"]

log = logging.getLogger(__name__)

#: learns from a step's batch; given the groups dropped since the last update too (lag, no
#: signal), for the update's record
Learn = Callable[[list[list[RolloutOutcome]], list[UpdateGroup]], Awaitable[dict[str, float]]]
#: shown each decided group's fate: ``"trained"`` (a step's batch), ``"dropped_lag"`` or
#: ``"dropped_no_signal"``, with the groups
Watch = Callable[[str, list["Group"]], None]


@dataclass
class Group:
    """One finished group: ``index`` is its place in the data order."""

    index: int
    group_id: str
    outcomes: list[RolloutOutcome]

    @property
    def oldest_version(self) -> int | None:
        versions = [c.policy_version for o in self.outcomes for c in o.calls]
        return min(versions) if versions else None


def group_lag(group: Group, version: int) -> int:
    """Policy versions between ``version`` and the group's oldest call (0 without calls)."""
    oldest = group.oldest_version
    return 0 if oldest is None else version - oldest


_FATES = {"dropped_lag": GroupFate.LAG, "dropped_no_signal": GroupFate.NO_SIGNAL}


@dataclass(frozen=True)
class AsyncPolicy:
    """Async mode's policy: up to ``max_in_flight`` groups run at once and ``batch_groups``
    ready ones make an update; a group more than ``max_lag`` versions behind is dropped
    (``lag_policy`` ``"drop"``) or trained anyway (``"reweight"``). With
    rollout.filter_groups, ``signal`` says whether a finished, trainable group would teach
    anything, and up to ``max_flat`` groups without it are dropped per update."""

    batch_groups: int
    max_in_flight: int
    max_lag: int
    lag_policy: str
    signal: Callable[[list[RolloutOutcome]], bool] | None = None
    max_flat: int = 0

    def __post_init__(self) -> None:
        if self.max_in_flight < self.batch_groups:
            raise TrainerError(
                f"max_in_flight ({self.max_in_flight}) must be >= batch_groups "
                f"({self.batch_groups})"
            )


class AsyncRollouts:
    """The group scheduler and the pause → drain → update → resume step of async mode:
    group ``i`` is ``n`` rollouts of ``task_at(i)``, from ``first_group`` on; ``learn``
    trains a step's batch, ``version`` is the engine's policy version."""

    def __init__(
        self,
        collector: Collector,
        task_at: Callable[[int], Task],
        n: int,
        policy: AsyncPolicy,
        *,
        learn: Learn,
        version: Callable[[], int],
        first_group: int = 0,
    ):
        self.collector, self.task_at, self.n, self.policy = collector, task_at, n, policy
        self.learn, self.version = learn, version
        self.first_group = self.next_index = first_group
        self.running: dict[int, asyncio.Task[None]] = {}
        self.ready: deque[Group] = deque()
        self._flat_this_step = 0  # groups dropped without signal this update (filter_groups)
        self._dropped: list[UpdateGroup] = []  # since the last update, for its record
        #: groups trained, dropped for lag and dropped without signal (none is kept)
        self.counts: Counter[str] = Counter()
        self.watch: Watch | None = None
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._stopped = False

    # -- the groups ----------------------------------------------------------------

    def fill(self) -> None:
        """Start groups until ``max_in_flight`` are running."""
        while (
            not self._stopped
            and self._error is None
            and len(self.running) < self.policy.max_in_flight
        ):
            i = self.next_index
            self.next_index += 1
            self.running[i] = asyncio.create_task(self._group(i), name=f"tether-group-{i}")

    async def _group(self, index: int) -> None:
        """Run group ``index``; its rollouts' place's step is the update they are opened
        for: the policy version now + 1 (the update they feed unless other groups are
        ahead of them or they are dropped)."""
        gid = self.collector.group_id(Place(Phase.ASYNC), index)
        try:
            task = self.task_at(index)
            at = Place(Phase.ASYNC, self.version() + 1)
            outcomes = await self.collector.group(index, task, self.n, at)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a store or gateway fault: stop the run, loudly
            log.exception("group %s failed", gid)
            self._error = exc
        else:
            self.ready.append(Group(index, gid, outcomes))
        finally:
            self.running.pop(index, None)
            self._changed.set()
        self.fill()

    def _decided(self, fate: str, groups: list[Group]) -> None:
        """Count the groups' fate and show it to ``watch``; a dropped group goes into the
        next update's record; the groups are not kept."""
        self.counts[fate] += len(groups)
        if fate in _FATES:
            self._dropped += [decided(g.outcomes, _FATES[fate]) for g in groups]
        if self.watch is not None and groups:
            self.watch(fate, groups)

    def _drop_stale(self) -> int:
        if self.policy.lag_policy != "drop":
            return 0
        version, bound = self.version(), self.policy.max_lag
        fresh = [g for g in self.ready if group_lag(g, version) <= bound]
        stale = [g for g in self.ready if group_lag(g, version) > bound]
        self.ready = deque(fresh)
        self._decided("dropped_lag", stale)
        return len(stale)

    def _drop_flat(self) -> None:
        """rollout.filter_groups: drop ready groups without signal, as _filter_groups.py does in
        sync mode, while this update's budget lasts; the scheduler has already started
        other groups in their place. Past the budget they reach the update, which trains
        the groups with signal among them (fewer than batch_groups, as sync does)."""
        signal = self.policy.signal
        if signal is None:
            return
        kept: deque[Group] = deque()
        for g in self.ready:
            if self._flat_this_step < self.policy.max_flat and not signal(g.outcomes):
                self._decided("dropped_no_signal", [g])
                self._flat_this_step += 1
            else:
                kept.append(g)
        self.ready = kept

    async def wait_ready(self) -> int:
        """Wait until ``batch_groups`` groups within the lag bound are ready; return the drops."""
        dropped = 0
        while True:
            if self._error is not None:
                raise TrainerError(f"a rollout group failed: {self._error!r}") from self._error
            dropped += self._drop_stale()
            self._drop_flat()
            if len(self.ready) >= self.policy.batch_groups:
                return dropped
            if self._stopped:
                raise TrainerError("async rollouts were stopped")
            self._changed.clear()
            await self._changed.wait()

    async def stop(self) -> int:
        """Cancel the running groups (their rollouts end as cancelled); return how many."""
        self._stopped = True
        tasks = list(self.running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    # -- one update ------------------------------------------------------------------

    async def step(self, step: int) -> dict[str, float]:
        """Wait for a batch, pause admission, drain, learn, resume; the step's metrics."""
        t0 = time.perf_counter()
        self.fill()
        dropped = await self.wait_ready()
        t1 = time.perf_counter()
        gw = self.collector.gateway
        before = gw.admission_state()
        await gw.pause()
        t2 = time.perf_counter()
        try:
            # Groups that finished during the drain; the version has not moved, so the
            # batch_groups fresh ones found by wait_ready are still there.
            dropped += self._drop_stale()
            self._drop_flat()
            version = self.version()
            batch = [self.ready.popleft() for _ in range(self.policy.batch_groups)]
            self._decided("trained", batch)
            lags = [group_lag(g, version) for g in batch]
            gone, self._dropped = self._dropped, []
            m = await self.learn([g.outcomes for g in batch], gone)
        finally:
            gw.resume()
        t3 = time.perf_counter()
        if self.policy.signal is not None:
            flat, self._flat_this_step = self._flat_this_step, 0
            m["groups_no_signal"] = m.get("groups_no_signal", 0.0) + flat
            m["groups_extra"], m["rollouts_extra"] = float(flat), float(flat * self.n)
        after = gw.admission_state()
        calls = [c for g in batch for o in g.outcomes for c in o.calls]
        m.update(
            {
                "wait_s": t1 - t0,
                "drain_s": t2 - t1,
                "paused_s": t3 - t1,
                "calls_held": float(after["held_total"] - before["held_total"]),
                "hold_s": after["held_seconds"] - before["held_seconds"],
                "groups_dropped_lag": float(dropped),
                "groups_carried": float(len(self.ready) + len(self.running)),
                "policy_lag_max": float(max(lags)),
                "call_lag_mean": sum(version - c.policy_version for c in calls)
                / max(len(calls), 1),
                # the trained batch's tokens per second of this step (generation overlaps updates)
                "gen_tokens_per_s": sum(len(c.completion_ids) for c in calls) / max(t3 - t0, 1e-9),
                **{f"lag_hist/{k}": float(v) for k, v in sorted(Counter(lags).items())},
            }
        )
        return m

    def stats(self) -> dict[str, Any]:
        """Totals: groups started, trained, dropped for lag and without signal, ready, running."""
        return {
            "started": self.next_index - self.first_group,
            "trained": self.counts["trained"],
            "dropped_lag": self.counts["dropped_lag"],
            "dropped_no_signal": self.counts["dropped_no_signal"],
            "ready": len(self.ready),
            "running": len(self.running),
        }
