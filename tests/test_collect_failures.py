"""Whatever fails during a collection, every rollout it opened ends ``succeeded``, ``failed``
or ``cancelled``: none is left ``queued`` or ``running`` in the store.

Sync (``collect_groups``): a grader returning a malformed result, a runner raising for
one rollout while its siblings still run. Async (``AsyncRollouts``): one rollout of a
group raising while its siblings wait; ``stop()`` still ends them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tether.engine.testing import FakeEngine
from tether.errors import UserError
from tether.records import Phase, Place, RolloutStatus, Split, Task
from tether.run import collect_groups
from tether.run._async import AsyncPolicy, AsyncRollouts
from tether.run._collect import Collector
from tether.runner import AttemptResult, Launch
from tether.trainer.errors import TrainerError

RUN = "run-fail"
OPEN = (RolloutStatus.QUEUED, RolloutStatus.RUNNING)


class ScriptedRunner:
    """Rollout ``-g0-1`` does ``first``; every other one waits for ``release`` (or ends at once)."""

    def __init__(self, gw: Any, first: str = "answer", wait: bool = False):
        self.gw, self.first, self.wait = gw, first, wait
        self.release = asyncio.Event()

    async def run(self, launch: Launch) -> AttemptResult:
        self.gw.mark_running(launch.rollout_id, launch.attempt)
        if launch.rollout_id.endswith("-g0-1") and self.first == "raise":
            await asyncio.sleep(0.05)
            raise RuntimeError("the runner lost its worker pool")
        if self.wait and not launch.rollout_id.endswith("-g0-1"):
            await self.release.wait()
        return AttemptResult(launch.rollout_id, launch.attempt, RolloutStatus.SUCCEEDED, 0, "42")


def _tasks(k: int) -> list[Task]:
    return [Task(id=f"t{i}", data={"i": i}, split=Split.TRAIN) for i in range(k)]


def _left_open(store: Any) -> list[str]:
    return [r.id for s in OPEN for r in store.list_rollouts(run_id=RUN, status=s)]


def _malformed(task: dict[str, Any], answer: str | None) -> Any:
    return {"score": 1.0} if task["i"] == 0 else 1.0


async def test_a_malformed_grade_ends_every_rollout_of_the_batch(make_gateway: Any) -> None:
    gw = make_gateway(FakeEngine())
    gw.store.create_run({}, run_id=RUN)
    with pytest.raises(UserError, match=r"rollout\.grader returned"):
        await collect_groups(
            gw,
            ScriptedRunner(gw),
            _tasks(3),
            2,
            grader=_malformed,
            run_id=RUN,
            phase=Phase.TRAIN,
            step=0,
        )
    assert _left_open(gw.store) == []
    statuses = {r.id: r.status for r in gw.store.list_rollouts(run_id=RUN)}
    assert statuses[f"{RUN}-s0-g0-0"] is RolloutStatus.FAILED  # its grade was the bug
    assert statuses[f"{RUN}-s0-g2-1"] is RolloutStatus.SUCCEEDED  # graded before the raise
    # each rollout stores its place (update 0, group 2, member 1), not read from its id
    assert gw.store.get_rollout(f"{RUN}-s0-g2-1").place == Place(Phase.TRAIN, 0, 2, 1)


async def test_a_runner_raising_cancels_the_rollouts_still_running(make_gateway: Any) -> None:
    gw = make_gateway(FakeEngine())
    gw.store.create_run({}, run_id=RUN)
    runner = ScriptedRunner(gw, first="raise", wait=True)
    with pytest.raises(RuntimeError, match="lost its worker pool"):
        await asyncio.wait_for(
            collect_groups(
                gw, runner, _tasks(2), 2, grader=None, run_id=RUN, phase=Phase.TRAIN, step=0
            ),
            10,
        )
    assert _left_open(gw.store) == []
    statuses = {r.status for r in gw.store.list_rollouts(run_id=RUN)}
    assert statuses <= {RolloutStatus.FAILED, RolloutStatus.CANCELLED}


async def test_async_a_failed_rollout_cancels_its_siblings_and_stop_ends_the_rest(
    make_gateway: Any,
) -> None:
    gw = make_gateway(FakeEngine())
    gw.store.create_run({}, run_id=RUN)
    runner = ScriptedRunner(gw, first="raise", wait=True)

    async def learn(groups: Any, dropped: Any) -> dict[str, float]:
        return {}

    collector = Collector(gw, gw.store, runner, run_id=RUN, grader=lambda task, answer: 1.0)
    ar = AsyncRollouts(
        collector,
        lambda i: _tasks(i + 1)[i],
        3,
        AsyncPolicy(1, 2, 0, "drop"),
        learn=learn,
        version=lambda: 0,
    )
    with pytest.raises(TrainerError, match="a rollout group failed"):
        await asyncio.wait_for(ar.step(0), 10)
    await asyncio.wait_for(ar.stop(), 10)
    assert _left_open(gw.store) == []
    g0 = {r.status for r in gw.store.list_rollouts(group_id=f"{RUN}-a-g0")}
    assert g0 <= {RolloutStatus.FAILED, RolloutStatus.CANCELLED}, g0


async def test_cancelled_before_any_attempt_began_every_opened_rollout_ends(
    make_gateway: Any,
) -> None:
    """A collection (or an async group) cancelled after it opened its rollouts but before
    their attempts' tasks first ran: the attempts never saw the cancel, yet none of the
    rollouts is left ``queued`` (they once were)."""
    gw = make_gateway(FakeEngine())
    gw.store.create_run({}, run_id=RUN)
    runner = ScriptedRunner(gw, wait=True)
    sync = asyncio.ensure_future(
        collect_groups(gw, runner, _tasks(2), 2, grader=None, run_id=RUN, phase=Phase.TRAIN, step=1)
    )
    await asyncio.sleep(0)  # opened, now awaiting the attempts' tasks, which have not run
    assert len(gw.store.list_rollouts(run_id=RUN)) == 4
    sync.cancel()
    await asyncio.gather(sync, return_exceptions=True)

    async def learn(groups: Any, dropped: Any) -> dict[str, float]:
        return {}

    collector = Collector(gw, gw.store, runner, run_id=RUN, grader=lambda task, answer: 1.0)
    ar = AsyncRollouts(
        collector, lambda i: _tasks(i + 1)[i], 2, AsyncPolicy(1, 2, 0, "drop"),
        learn=learn, version=lambda: 0,
    )  # fmt: skip
    ar.fill()
    await asyncio.sleep(0)  # both groups opened, their attempts not begun
    assert len(gw.store.list_rollouts(run_id=RUN)) == 8
    assert await ar.stop() == 2
    assert _left_open(gw.store) == []
    assert {r.status for r in gw.store.list_rollouts(run_id=RUN)} == {RolloutStatus.CANCELLED}
