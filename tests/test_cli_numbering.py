"""One step numbering everywhere, read back from one real run (the shared tracked run of
tests/tracking_run.py: 2 updates, evals before and after, every tracking sink).

Step N is the N-th update, from 1, as checkpoints ``step-0000NN`` always said; the eval
before training is at step 0, the one after update N at step N. The progress lines, the
store's metrics and rollouts, TensorBoard, the export, the report, the checkpoint folders
and the dashboard's JSON feed all say so.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from tests.tracking_run import Tracked
from tether.cli._track_run import run_export
from tether.dashboard import Catalog, create_server_app
from tether.errors import UserError
from tether.store import Store
from tether.tracking import step_samples, write_report

UPDATES, EVALS = [1, 2], [0, 2]
KEY = "numbering-admin-key-0123456789"
ORIGIN = "http://127.0.0.1:8322"


def _steps(rows: list[tuple[int, str]], name: str) -> list[int]:
    return sorted(s for s, n in rows if n == name)


def test_the_progress_lines_count_updates_from_one(tracked: Tracked) -> None:
    lines = tracked.output.splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == ["1/2", "2/2"]
    evals = [int(m[1]) for ln in lines if (m := re.match(r"eval @ step (\d+):", ln))]
    assert evals == EVALS
    starts = [int(m[1]) for ln in lines if (m := re.match(r"evaluating at step (\d+):", ln))]
    assert starts == EVALS


def test_store_metrics_rollouts_and_checkpoints_say_the_same_steps(tracked: Tracked) -> None:
    with Store(tracked.run_dir / "traces.sqlite") as store:
        rows = [(m.step, m.name) for m in store.metrics(tracked.run_id)]
        ckpts = [c.step for c in store.checkpoints(tracked.run_id)]
        groups = {r.group_id for r in store.list_rollouts(run_id=tracked.run_id)}
    tags = [g.removeprefix(f"{tracked.run_id}-") for g in groups]
    assert _steps(rows, "reward_mean") == UPDATES
    assert _steps(rows, "policy_version") == UPDATES
    assert _steps(rows, "eval/sampled_success") == EVALS
    # a sync update's groups are {run}-s{N}-g{k}, an eval's {run}-eval{N}-s-g{k} / -g-g{k}
    assert sorted({int(m[1]) for t in tags if (m := re.fullmatch(r"s(\d+)-g\d+", t))}) == UPDATES
    evals = {int(m[1]) for t in tags if (m := re.fullmatch(r"eval(\d+)-[sg]-g\d+", t))}
    assert sorted(evals) == EVALS
    policy = {s: v["policy_version"] for s, v in tracked.metrics.items() if "policy_version" in v}
    assert policy == {1: 1.0, 2: 2.0}  # update N made policy version N
    assert ckpts == [2]
    assert sorted(p.name for p in (tracked.run_dir / "checkpoints").iterdir()) == ["step-000002"]


def test_tensorboard_scalars_and_samples_use_the_run_steps(tracked: Tracked) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tracked.run_dir / "tensorboard"), size_guidance={"tensors": 0})
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/reward_mean")] == UPDATES
    assert [e.step for e in ea.Scalars("eval/sampled_success")] == EVALS
    assert [e.step for e in ea.Tensors("samples/text_summary")] == UPDATES


def test_export_rows_and_samples_use_the_run_steps(tracked: Tracked, tmp_path: Path) -> None:
    quiet = Console(quiet=True)
    out = tmp_path / "rollouts.jsonl"
    run_export(str(tracked.run_dir), None, "jsonl", out, samples=False, step=None,
               run_id=None, console=quiet)  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({r["step"] for r in rows if r["kind"] == "train"}) == UPDATES
    assert sorted({r["step"] for r in rows if r["kind"] == "eval_sampled"}) == EVALS
    for row in rows:
        if row["kind"] == "train":
            assert row["group_id"].startswith(f"{tracked.run_id}-s{row['step']}-g")
    with Store(tracked.run_dir / "traces.sqlite") as store:
        assert step_samples(store).step == 2  # the last update
        for n in UPDATES:  # update N trained on the samples PolicyTrainer.update got N-th
            assert len(step_samples(store, n).samples) == len(tracked.samples[n - 1])
    samples = tmp_path / "samples.jsonl"
    run_export(str(tracked.run_dir), None, "jsonl", samples, samples=True, step=1,
               run_id=None, console=quiet)  # fmt: skip
    assert {json.loads(line)["step"] for line in samples.read_text().splitlines()} == {1}
    with pytest.raises(UserError) as e:  # after `step 2/2`, --step 2 is the last, 0 is none
        run_export(str(tracked.run_dir), None, "jsonl", samples, samples=True, step=0,
                   run_id=None, console=quiet)  # fmt: skip
    assert str(e.value) == "step 0 is not in this store: pass --step between 1 and 2"


def test_report_counts_updates_as_the_store_does(tracked: Tracked, tmp_path: Path) -> None:
    with Store(tracked.run_dir / "traces.sqlite") as store:
        page = write_report(store, tmp_path / "report.html", "tracked").read_text()
    held = re.findall(r"<tr><td>(\d+)</td><td>[\d.]+%</td>", page)
    assert [int(s) for s in held] == EVALS
    assert "(update 0) -&gt; after" in page and "(update 2)</p>" in page
    assert "2 updates;" in page


def _get_all(app: Any, urls: list[str]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as c:
            login = await c.post("/ui/login", data={"key": KEY}, headers={"Origin": ORIGIN})
            assert login.status_code == 303
            return [await c.get(u) for u in urls]

    return asyncio.run(go())


def test_dashboard_feed_draws_rewards_from_one_and_evals_from_zero(tracked: Tracked) -> None:
    app = create_server_app(Catalog(runs_dir=tracked.run_dir.parent), KEY)
    run = f"/ui/s/{tracked.run_dir.name}/run/{tracked.run_id}"
    feed, rollout = _get_all(
        app, [f"{run}/metrics.json", f"/ui/s/tracked/rollout/{tracked.run_id}-s2-g0-0"]
    )
    assert feed.status_code == 200, feed.text
    points = [(p[0], p[1]) for p in feed.json()["points"]]
    assert _steps(points, "reward_mean") == UPDATES
    assert _steps(points, "eval/sampled_success") == EVALS
    events = feed.json()["events"]
    assert [e["step"] for e in events if e["kind"] == "eval"] == EVALS
    assert [e["step"] for e in events if e["kind"] == "checkpoint"] == [2]
    assert rollout.status_code == 200 and "(train, step 2)" in rollout.text
