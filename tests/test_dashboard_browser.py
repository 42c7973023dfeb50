"""The dashboard in a real browser (Debian's chromium, driven by Playwright) on a real
training run: the starter model, the calc agent in-process, GRPO through the run's own
gateway, whose ``/ui`` serves the dashboard.

The test logs in, watches the reward curve gain points while the run trains (no page
reload), walks the runs, rollouts and rollout pages, checks the tokens' logprob colours
and their tooltip, shows hostile text as text (no script runs), and is refused without
the key. It saves a screenshot of each page to the run folder; with
``TETHER_DASHBOARD_SCREENSHOTS=DIR`` it also copies the run and rollout pages there
(``docs/dashboard-run.png``, ``docs/dashboard-rollout.png`` come from this test).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ADMIN_KEY
from tether.records import AttemptEnd, Call, Rollout
from tether.run import (
    CheckpointConfig,
    EvalConfig,
    RolloutConfig,
    RunEvent,
    Status,
    TasksConfig,
    TrainConfig,
    TrainerConfig,
    TrainingRun,
)
from tether.runner import RunnerConfig
from tether.store import Store

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STEPS = 12
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).is_file(),
    reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium; .ci/run does it)",
)


class Training:
    """A TrainingRun on its own thread and event loop; it keeps serving after the last
    step until :meth:`finish` (the browser is still looking)."""

    def __init__(self, cfg: TrainConfig, model: Path):
        self.cfg, self.model = cfg, model
        self.lines: list[str] = []
        self.opened, self.release = threading.Event(), threading.Event()
        self.run: TrainingRun | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _event(self, event: RunEvent) -> None:
        if isinstance(event, Status):
            self.lines.append(event.text)

    def _main(self) -> None:
        async def go() -> None:
            async with TrainingRun(self.cfg, model_path=self.model, on_event=self._event) as run:
                self.run = run
                self.opened.set()
                await run.train()
                await asyncio.to_thread(self.release.wait, 300)

        try:
            asyncio.run(go())
        except BaseException as e:  # reported by finish()
            self.error = e
        finally:
            self.opened.set()

    def __enter__(self) -> Training:
        self.thread.start()
        assert self.opened.wait(180) and self.run is not None, self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(120)

    def finish(self) -> None:
        self.__exit__()
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def _config(tmp_path: Path) -> TrainConfig:
    cfg = TrainConfig(
        name="watch",
        dir=str(tmp_path),
        tasks=TasksConfig(source="calc", train_size=40, val_size=2),
        agent=RunnerConfig(
            mode="inprocess", entry="tether.starter.calc:agent", concurrency=4, timeout_s=60
        ),
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=STEPS, lr=1e-3),
        eval=EvalConfig(tasks=2, samples=1, greedy=True, every=4),
        checkpoint=CheckpointConfig(every=0, keep=1),
    )
    cfg.gateway.admin_key = ADMIN_KEY
    cfg.gateway.default_max_tokens = 24
    return cfg


def _steps_stored(path: Path, run_id: str) -> int:
    with Store(path, read_only=True) as s:
        return len(s.metrics(run_id, "reward_mean"))


def _add_hostile_rollout(path: Path, run_id: str, tokenizer: Any) -> str:
    """A finished rollout whose messages, tool result, reply and completion tokens are
    markup that would run script if it were ever parsed as HTML."""
    ids = tokenizer.encode(HOSTILE)
    rid = f"{run_id}-s0-g99-0"
    with Store(path) as s:
        s.create_rollout(Rollout(id=rid, run_id=run_id, group_id=f"{run_id}-s0-g99", task={}))
        a = s.start_attempt(rid)
        s.record_call(
            Call(
                rid,
                0,
                tokenizer.encode("hi"),
                ids,
                [-0.5] * len(ids),
                0,
                attempt=a,
                request={
                    "messages": [
                        {"role": "user", "content": HOSTILE + "z" * 50_000},
                        {"role": "tool", "content": HOSTILE, "tool_call_id": "c0"},
                    ]
                },
                response={"choices": [{"message": {"role": "assistant", "content": HOSTILE}}]},
            )
        )
        s.finish_rollout(AttemptEnd(rid, a, "succeeded"), reward=1.0, reward_source="grader")
    return rid


@pytest.mark.slow
def test_watch_a_real_run_in_a_browser(starter_dir: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    cfg = _config(tmp_path)
    run_dir = tmp_path / "watch"
    store = run_dir / "traces.sqlite"
    shots: dict[str, Path] = {}
    with Training(cfg, starter_dir) as training, sync_playwright() as pw:
        run = training.run
        assert run is not None
        base = f"{run.server.url}/ui"
        line = next(ln for ln in training.lines if ln.startswith("dashboard: "))
        assert line.startswith(f"dashboard: {base}/  (log in with the admin key: ")
        run_url = f"{base}/s/watch/run/{run.run_record.id}"
        deadline = time.monotonic() + 300
        while _steps_stored(store, run.run_record.id) < 1:  # the first point exists
            assert time.monotonic() < deadline and training.error is None, training.error
            time.sleep(0.2)

        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(60_000)

        # refused without the key: the login form, at the page's own URL; the data too
        refused = page.goto(run_url)
        assert refused is not None and refused.status == 401
        expect(page.locator("input[name=key]")).to_be_visible()
        assert page.request.get(f"{run_url}/metrics.json").status == 401
        page.fill("input[name=key]", "not-the-admin-key")
        page.click("button[type=submit]")
        expect(page.locator("#login-error")).to_have_text("wrong admin key")
        shots["login"] = run_dir / "dashboard-login.png"
        page.screenshot(path=shots["login"])
        assert not context.cookies()

        # log in: back on the run page, with an HttpOnly, SameSite=Strict cookie
        page.fill("input[name=key]", ADMIN_KEY)
        page.click("button[type=submit]")
        page.wait_for_url(run_url)
        (cookie,) = context.cookies()
        assert (
            cookie["httpOnly"]
            and cookie["sameSite"] == "Strict"
            and ADMIN_KEY not in cookie["value"]
        )
        assert ADMIN_KEY not in page.url

        # the reward curve gains points while the run trains, without a reload
        reward = page.locator('.chart[data-title="reward"]')
        expect(reward).to_have_attribute("data-points", re.compile(r"\d+"))
        page.evaluate("window.__still_here = 1")
        before = int(reward.get_attribute("data-points") or 0)
        assert page.locator("#run-status").text_content() == "running"
        assert before < STEPS
        page.wait_for_function(
            "n => Number(document.querySelector('.chart[data-title=\"reward\"]').dataset.points) > n",
            arg=before,
            timeout=240_000,
        )
        assert page.evaluate("window.__still_here") == 1
        assert page.locator("canvas").count() >= 2  # uPlot drew (reward, loss, ...)
        # to the last step and the last eval (the run holds its gateway open after them)
        expect(reward).to_have_attribute("data-points", str(STEPS), timeout=300_000)
        held_out = page.locator('.chart[data-title="held-out success"]')
        expect(held_out).to_have_attribute("data-points", "4", timeout=120_000)  # 0 4 8 12
        expect(page.locator('[data-field="steps"]')).to_have_text(f"{STEPS} / {STEPS}")
        # the events table grew with the run, still without a reload
        expect(page.locator("#events tr.ev.eval")).to_have_count(4)
        assert page.evaluate("window.__still_here") == 1
        shots["run"] = run_dir / "dashboard-run.png"
        page.screenshot(path=shots["run"])  # the window: the header and the first curves

        page.goto(f"{base}/")
        expect(page.locator("#runs")).to_contain_text("watch")
        expect(page.locator("#runs")).to_contain_text(f"{STEPS} / {STEPS}")
        shots["runs"] = run_dir / "dashboard-runs.png"
        page.screenshot(path=shots["runs"])

        # rollouts: filter a step, sort by tokens
        page.goto(f"{run_url}/rollouts?step=3&sort=tokens&desc=1")
        rows = page.locator("#rollouts tbody tr")
        expect(rows).to_have_count(4)  # 2 groups × 2
        for i in range(4):
            assert rows.nth(i).locator("td").nth(2).text_content() == "3"
        expect(page.locator(".group")).to_have_count(2)
        shots["rollouts"] = run_dir / "dashboard-rollouts.png"
        page.screenshot(path=shots["rollouts"], full_page=True)

        # a rollout: tokens coloured by logprob, the tooltip, the training sample
        rows.first.locator("a.rollout-link").click()
        tokens = page.locator(".tokens.completion .tok")
        expect(tokens.first).to_be_visible()
        classes = tokens.evaluate_all("els => els.map(e => e.className)")
        assert classes and all(re.fullmatch(r"tok p\d", c) for c in classes)
        colours = tokens.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
        assert all(c not in ("rgba(0, 0, 0, 0)", "transparent") for c in colours)
        tokens.first.hover()
        tip = page.locator("#tip")
        expect(tip).to_be_visible()
        expect(tip).to_contain_text("token id")
        expect(tip).to_contain_text("logprob")
        expect(page.locator("#samples .sample")).not_to_have_count(0)
        shots["rollout"] = run_dir / "dashboard-rollout.png"
        page.screenshot(path=shots["rollout"], full_page=True)

        # hostile text stays text; no script from the store ever runs
        rid = _add_hostile_rollout(store, run.run_record.id, run.tokenizer)
        page.goto(f"{base}/s/watch/rollout/{rid}")
        expect(page.locator(".message.user pre.msg")).to_contain_text(HOSTILE)
        expect(page.locator(".message.tool pre.msg")).to_contain_text(HOSTILE)
        expect(page.locator(".reply pre.msg")).to_contain_text(HOSTILE)
        page.locator(".tokens.completion .tok").nth(1).hover()
        expect(page.locator("#tip")).to_be_visible()
        assert page.locator("main img").count() == 0
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert "more characters not shown" in (page.text_content("main") or "")

        # another browser without the cookie is refused everywhere
        other = browser.new_context().new_page()
        for url in (f"{base}/", run_url, f"{base}/s/watch/rollout/{rid}"):
            response = other.goto(url)
            assert response is not None and response.status == 401
            expect(other.locator("input[name=key]")).to_be_visible()
        browser.close()
    training.finish()
    for path in shots.values():
        assert path.stat().st_size > 10_000, path
    target = os.environ.get("TETHER_DASHBOARD_SCREENSHOTS")
    if target:
        for name in ("run", "rollout"):
            shutil.copy(shots[name], Path(target) / f"dashboard-{name}.png")
