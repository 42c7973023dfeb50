"""Stores and clients the dashboard's tests share (tests/test_dashboard*.py): two run
folders (``runs_dir``), a logged-in in-process client, the page's visible text."""

from __future__ import annotations

import asyncio
import html
import math
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.records import (
    AttemptEnd,
    Call,
    CallStatus,
    GroupFate,
    Phase,
    Place,
    Rollout,
    RunStatus,
    UpdateGroup,
    UpdateRecord,
)
from tether.store import Store

KEY = "dash-admin-key-0123456789"
ORIGIN = "http://127.0.0.1:8322"
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1"><b>bold</b>'
ROOT = Path(__file__).resolve().parents[1]
#: A run's credit settings as its update records hold them (``tether.run``'s Learning).
GRPO = {"advantage": "grpo", "credit": "trajectory", "gamma": 1.0, "signal_only": None,
        "role_weights": {}, "grouping": "index", "state_weight": 1.0}  # fmt: skip
ADV = 0.7071067811865476  # grpo's advantage of rewards 1 and 0 (sample std)


def add_rollout(
    s: Store,
    rid: str,
    run_id: str,
    group: str,
    *,
    reward: float | None,
    calls: list[dict[str, Any]] = (),  # type: ignore[assignment]
    status: str = "succeeded",
    task_id: str = "t1",
    place: Place | None = None,
) -> None:
    s.create_rollout(
        Rollout(id=rid, run_id=run_id, group_id=group, task_id=task_id, task={}, place=place)
    )
    a = s.start_attempt(rid)
    for c in calls:
        s.record_call(Call(rollout_id=rid, seq=0, attempt=a, policy_version=0, **c))
    s.finish_rollout(AttemptEnd(rid, a, status), reward=reward, reward_source="grader")


def _train(step: int, index: int) -> Place:
    """Group 0 of update ``step``, member ``index``."""
    return Place(Phase.TRAIN, step, 0, index)


def call(prompt: list[int], completion: list[int], **kw: Any) -> dict[str, Any]:
    lps = [-0.05 * (i + 1) for i in range(len(completion))]
    return {"prompt_ids": prompt, "completion_ids": completion, "logprobs": lps, **kw}


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """Two run folders: ``good`` (metrics, an eval, a checkpoint, a group of two, a
    hostile rollout, one with no calls, one with a failed engine call) and ``crashed``
    (a run that failed before any metric)."""
    with Store(tmp_path / "good" / "traces.sqlite") as s:
        run = s.create_run(
            {"name": "good", "model": {"path": "nowhere"}, "trainer": {"steps": 4}}, "good-1"
        )
        for step in range(3):
            s.log_metrics(run.id, step, {"reward_mean": 0.25 * step, "loss": 1.0, "rss_mb": 9.0})
        s.log_metrics(run.id, 0, {"eval/sampled_success": 0.5, "eval/greedy_success": 0.25})
        s.log_metrics(run.id, 1, {"groups_dropped": 1.0, "loss": math.nan})
        add_rollout(s, "good-1-s0-g0-0", run.id, "good-1-s0-g0", reward=1.0, place=_train(0, 0),
                 calls=[call([1, 2, 3], [4, 5])])  # fmt: skip
        add_rollout(s, "good-1-s0-g0-1", run.id, "good-1-s0-g0", reward=0.0, place=_train(0, 1),
                 calls=[call([1, 2, 3], [6]), call([1, 2, 3, 6, 9], [7, 8])])  # fmt: skip
        long_line = "y" * 50_000
        hostile = {
            "request": {"messages": [{"role": "user", "content": HOSTILE + long_line},
                                     {"role": "tool", "content": HOSTILE, "tool_call_id": "c1"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": HOSTILE,
                         "tool_calls": [{"function": {"name": HOSTILE, "arguments": HOSTILE}}]}}]},
        }  # fmt: skip
        add_rollout(s, "good-1-s1-g0-0", run.id, "good-1-s1-g0", reward=1.0, place=_train(1, 0),
                 calls=[call([1, 2], [3], **hostile)])  # fmt: skip
        add_rollout(s, "good-1-s1-g0-1", run.id, "good-1-s1-g0", reward=None, status="failed",
                    place=_train(1, 1))  # fmt: skip
        add_rollout(s, "good-1-s2-g0-0", run.id, "good-1-s2-g0", reward=0.5, place=_train(2, 0),
                 calls=[call([1], [2], status=CallStatus.FAILED, error="engine: " + HOSTILE)])  # fmt: skip
        for i in range(2):  # an eval's group: never trained on, so no advantage
            add_rollout(s, f"good-1-eval0-s-g0-{i}", run.id, "good-1-eval0-s-g0", reward=float(i),
                        place=Place(Phase.EVAL, 0, 0, i),
                     calls=[call([1, 2], [3])])  # fmt: skip
        # what the run recorded of its updates: step 0 trained its group (grpo over
        # rewards 1 and 0), step 1 dropped its group (a rollout failed)
        g0, g1 = ("good-1-s0-g0-0", "good-1-s0-g0-1"), ("good-1-s1-g0-0", "good-1-s1-g0-1")
        kept = UpdateGroup(0, g0, GroupFate.KEPT, (ADV, -ADV))
        s.add_update(UpdateRecord(run.id, 0, 1, GRPO, [kept]))
        s.add_update(UpdateRecord(run.id, 1, None, GRPO, [UpdateGroup(0, g1, GroupFate.UNUSABLE)]))
        from tether.records import Checkpoint

        s.add_checkpoint(Checkpoint(run_id=run.id, step=2, path="/ck/step-2"))
    with Store(tmp_path / "crashed" / "traces.sqlite") as s:
        run = s.create_run({"name": "crashed"}, "crashed-1")
        s.set_run_status(run.id, RunStatus.FAILED)
    return tmp_path


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)


async def login(c: httpx.AsyncClient, key: str = KEY) -> httpx.Response:
    return await c.post("/ui/login", data={"key": key}, headers={"Origin": ORIGIN})


def get_all(app: Any, urls: list[str]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with client(app) as c:
            assert (await login(c)).status_code == 303
            return [await c.get(u) for u in urls]

    return asyncio.run(go())


def visible(page: str) -> str:
    """The page's text as a browser shows it (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


Shown = float | dict[int, float] | None


def shown_advantage(text: str) -> Shown:
    """An advantage as a page shows it, read back: ``-`` (none), a number, or one per call
    seq (``0: 0.707 · 1: -0.5``); 3 significant digits."""
    text = html.unescape(text).strip()
    if text == "-":
        return None
    if ":" not in text:
        return float(text)
    return {int(k): float(v) for k, v in (part.split(": ") for part in text.split(" · "))}


def group_advantages(page: str) -> dict[str, Shown]:
    """The rollouts page's groups: rollout id → its advantage as the table shows it."""
    row = r'/rollout/([^"]+)">\d+</a></td><td>[^<]*</td><td>[^<]*</td><td>([^<]*)</td>'
    return {rid: shown_advantage(shown) for rid, shown in re.findall(row, page)}


def rollout_advantage(page: str) -> Shown:
    """The advantage a rollout's page shows (None also where it shows none)."""
    found = re.search(r"<dt>advantage</dt><dd>([^<]*)</dd>", page)
    return None if found is None else shown_advantage(found[1])


def update_row(page: str, step: int) -> tuple[str, str]:
    """The run page's row of update ``step``: (its trained groups, its dropped groups and
    why), as visible text."""
    row = re.search(rf'<tr id="update-{step}">(.*?)</tr>', page, re.S)
    assert row is not None, f"no update {step} on the run page"
    kept = re.search(r'<td class="kept">(.*?)</td>', row[1], re.S)
    dropped = re.search(r'<td class="dropped">(.*?)</td>', row[1], re.S)
    assert kept is not None and dropped is not None
    return visible(kept[1]), visible(dropped[1])
