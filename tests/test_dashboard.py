"""The dashboard's pages over real stores, in-process (the ASGI app through httpx): every
page for awkward stores (empty, a crashed run, a rollout without calls, a failed engine
call, hostile text), the rollouts table against a plain-Python reference, the read-only
store, the vendored chart library. The login and the command are
tests/test_dashboard_auth.py; the browser test is tests/test_dashboard_browser.py."""

from __future__ import annotations

import hashlib
import html
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.dashboard_stores import (
    HOSTILE,
    KEY,
    ROOT,
    get_all,
    visible,
)
from tether.dashboard import Catalog, create_server_app
from tether.records import AttemptEnd, Call, Phase, Place, Reward, RewardSource, Rollout
from tether.store import Store, StoreError

# -- the pages ------------------------------------------------------------------------------


def test_an_empty_folder_and_an_empty_store_render(tmp_path: Path) -> None:
    app = create_server_app(Catalog(runs_dir=tmp_path / "nothing-yet"), KEY)
    (runs,) = get_all(app, ["/ui/"])
    assert runs.status_code == 200 and "No runs yet" in runs.text
    Store(tmp_path / "empty" / "traces.sqlite").close()
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    runs, missing = get_all(app, ["/ui/", "/ui/s/empty/run/nope"])
    assert runs.status_code == 200 and "No runs yet" in runs.text
    assert missing.status_code == 404 and "no run &#39;nope&#39;" in missing.text


def test_runs_and_run_pages_show_status_steps_best_eval_events_and_config(runs_dir: Path) -> None:
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)
    runs, good, crashed, feed, later, idle, ended = get_all(
        app,
        [
            "/ui/",
            "/ui/s/good/run/good-1",
            "/ui/s/crashed/run/crashed-1",
            "/ui/s/good/run/good-1/metrics.json",
            "/ui/s/good/run/good-1/metrics.json?after=11",
            "/ui/s/good/run/good-1/metrics.json?after=13",
            "/ui/s/crashed/run/crashed-1/metrics.json",
        ],
    )
    text = visible(runs.text)
    assert "good" in text and "crashed" in text and "failed" in text
    assert "3 / 4" in text and "50% / 25%" in text  # steps of trainer.steps; best evals
    assert "<polyline" in runs.text  # the reward sparkline
    assert good.status_code == 200 and crashed.status_code == 200
    events = visible(good.text)
    assert "held-out success: sampled 50%, greedy 25%" in events
    assert "1 group(s) dropped: an unusable reward" in events
    assert "checkpoint /ck/step-2" in events
    assert "run failed" in visible(crashed.text) and "No metrics yet" in crashed.text
    data = feed.json()
    assert data["status"] == "running" and data["last"] == 13 and len(data["points"]) == 13
    assert data["head"]["steps"] == "3 / 4" and data["head"]["best"] == "sampled 50%, greedy 25%"
    assert [0, "reward_mean", 0.0] in data["points"]
    assert [1, "loss", None] in data["points"]  # NaN travels as null (valid JSON)
    assert later.json()["points"] == [[1, "groups_dropped", 1.0], [1, "loss", None]]
    # the events come with new points (all of them, as the page lists them) or the run's end
    kinds = [(e["step"], e["kind"]) for e in data["events"]]
    assert (1, "dropped") in kinds and (2, "checkpoint") in kinds
    assert later.json()["events"] == data["events"]
    assert idle.json()["points"] == [] and idle.json()["events"] is None
    assert ended.json()["events"] == [{"step": None, "kind": "end", "text": "run failed"}]


def test_hostile_text_is_escaped_everywhere_and_long_lines_are_cut(runs_dir: Path) -> None:
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)
    (page,) = get_all(app, ["/ui/s/good/rollout/good-1-s1-g0-0"])
    assert page.status_code == 200
    assert "<script>window" not in page.text and "<img src=x" not in page.text
    assert "<b>bold" not in page.text
    assert (
        page.text.count(html.escape(HOSTILE, quote=False)[:40]) >= 4
    )  # message, tool, reply, call
    assert "more characters not shown" in page.text
    scripts = re.findall(r"<script[^>]*>", page.text)
    assert all(re.fullmatch(r'<script src="/ui/static/[\w/.]+">', s) for s in scripts), scripts


def test_a_rollout_without_calls_and_a_failed_engine_call_render(runs_dir: Path) -> None:
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)
    no_calls, failed, evaluated, evals = get_all(
        app,
        [
            "/ui/s/good/rollout/good-1-s1-g0-1",
            "/ui/s/good/rollout/good-1-s2-g0-0",
            "/ui/s/good/rollout/good-1-eval0-s-g0-1",
            "/ui/s/good/run/good-1/rollouts?phase=eval&step=0",
        ],
    )
    assert "A held-out eval rollout: never trained on" in evaluated.text
    assert "advantage</dt><dd>-</dd>" in evaluated.text.replace("\n", "").replace("  ", "")
    rows = re.findall(r'rollout-link" href="[^"]+">([^<]+)<', evals.text)
    assert rows == ["good-1-eval0-s-g0-0", "good-1-eval0-s-g0-1"]
    assert "eval sampled" in evals.text
    assert no_calls.status_code == 200 and "No model calls in this attempt" in no_calls.text
    assert "not usable for training" in no_calls.text
    assert failed.status_code == 200
    assert 'class="status failed">failed' in failed.text and "engine: &lt;script&gt;" in failed.text
    assert "1 failed call(s) left out" in failed.text


def test_a_rollout_shows_tokens_by_logprob_advantages_and_the_merged_sample(
    runs_dir: Path,
) -> None:
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)
    (page,) = get_all(app, ["/ui/s/good/rollout/good-1-s0-g0-1"])
    toks = re.findall(r'<span class="tok p(\d)" data-id="(\d+)" data-lp="([-\d.]+)"', page.text)
    # call 0: token 6; call 1: tokens 7, 8 (bucket = floor(10 p)); the sample repeats them
    assert toks[:3] == [("9", "6", "-0.0500"), ("9", "7", "-0.0500"), ("9", "8", "-0.1000")]
    text = visible(page.text)
    assert "2 call(s) → 1 sample(s), 1 merged" in text  # call 1 extends call 0's sequence
    assert "2 call(s) merged · 7 tokens · 3 trained · advantage -0.707" in text
    assert "adv 0.707" in text  # its group mate (grpo over rewards 1 and 0)


def test_the_outcome_badge_is_the_tasks_and_the_time_is_each_attempts_own(tmp_path: Path) -> None:
    """A rollout whose agent exited cleanly with reward 0 reads as a fail, not as a green
    "succeeded"; the rollouts of one batch (one created_at) show their own times."""
    with Store(tmp_path / "b" / "traces.sqlite") as s:
        s.create_run({}, "b-1")
        for i, (status, reward, success) in enumerate(
            [("succeeded", 1.0, None), ("succeeded", 0.0, None), ("succeeded", 0.5, False),
             ("failed", None, None)]
        ):  # fmt: skip
            rid = f"b-1-s0-g0-{i}"
            s.create_rollout(Rollout(id=rid, run_id="b-1", group_id="b-1-s0-g0", created_at=1.0))
            a = s.start_attempt(rid)
            with s._db.write() as conn:  # the agent started at 10 + i, ran (i + 1) s
                conn.execute("UPDATE rollouts SET started_at = ? WHERE id = ?", (10.0 + i, rid))
            s.finish_rollout(AttemptEnd(rid, a, status, success=success), reward=reward)
            with s._db.write() as conn:
                conn.execute(
                    "UPDATE rollouts SET finished_at = ? WHERE id = ?", (11.0 + 2 * i, rid)
                )
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    table, page = get_all(app, ["/ui/s/b/run/b-1/rollouts", "/ui/s/b/rollout/b-1-s0-g0-1"])
    cells = re.findall(r"<tr>\s*<td><a class=\"rollout-link\".*?</tr>", table.text, re.S)
    outcomes = [re.search(r'class="outcome ([\w-]+)"', c).group(1) for c in cells]
    assert outcomes == ["success", "fail", "fail", "no-reward"]
    assert all('class="status minor succeeded"' in c for c in cells[:3])
    times = [re.findall(r"<td[^>]*>([\d.]+ s)</td>", c) for c in cells]
    assert times == [["1.0 s"], ["2.0 s"], ["3.0 s"], ["4.0 s"]]
    assert 'class="outcome fail">fail' in page.text and "(2.0 s)" in page.text


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the chart's script")
def test_chart_axes_label_tiny_values_and_range_a_constant_or_single_point() -> None:
    """The run page's axes (static/axes.js, run under node): a KL of 1e-9 and a logprob
    gap of 5e-7 get distinct scientific ticks, not "0" on each; a constant series and a
    single step get a range around the value instead of a squashed or 0..100 one."""
    script = ROOT / "tether" / "dashboard" / "static" / "axes.js"
    probe = (
        f"var a = require({json.dumps(str(script))}); console.log(JSON.stringify(["
        "a.ticks([0, 2e-10, 4e-10, 6e-10, 8e-10, 1e-9]), a.ticks([4.4e-7, 4.6e-7, 4.8e-7]),"
        "a.ticks([0, 0.25, 0.5, 0.75, 1]), a.ticks([1000, 1100, 1200]),"
        "a.yRange(0.5, 0.5), a.yRange(0, 0), a.yRange(4e-7, 6e-7), a.xRange(3, 3)]))"
    )
    out = subprocess.run(["node", "-e", probe], capture_output=True, text=True, check=True)
    kl, gap, reward, tok, const, zero, tiny, one = json.loads(out.stdout)
    assert kl == ["0", "0.2e-9", "0.4e-9", "0.6e-9", "0.8e-9", "1.0e-9"]
    assert gap == ["4.4e-7", "4.6e-7", "4.8e-7"]
    assert reward == ["0", "0.25", "0.50", "0.75", "1.00"] and tok == ["1000", "1100", "1200"]
    assert const == pytest.approx([0.45, 0.55]) and zero == [-1, 1]
    assert tiny == pytest.approx([3.9e-7, 6.1e-7]) and one == [2, 4]


# -- the rollouts table against a plain-Python reference -------------------------------------


def _many(path: Path, n: int = 60) -> list[Rollout]:
    rng = random.Random(0)
    with Store(path) as s:
        s.create_run({}, "r")
        for i in range(n):
            rid, step = f"r-s{i % 7}-g{i % 3}-{i}", i % 7
            phase = Phase.EVAL if i % 5 == 3 else Phase.TRAIN  # evals at step 3 too (i = 3, 38)
            s.create_rollout(
                Rollout(id=rid, run_id="r", group_id=f"r-s{step}-g{i % 3}", task_id=f"t{i % 5}",
                        place=Place(phase, step, i % 3, i))
            )  # fmt: skip
            a = s.start_attempt(rid)
            for _ in range(rng.randrange(3)):
                s.record_call(Call(rid, 0, [1], [2, 3], [-0.1, -0.2], 0, attempt=a))
            reward = rng.choice([None, 0.0, 0.5, 1.0, float("nan")])
            s.finish_rollout(AttemptEnd(rid, a, rng.choice(["succeeded", "failed"])), reward=reward)
        return s.list_rollouts()


def test_rollout_pages_filter_sort_and_paginate_like_a_reference(tmp_path: Path) -> None:
    path = tmp_path / "traces.sqlite"
    everything = _many(path)
    with Store(path, read_only=True) as s:
        calls = {r.id: len(s.calls(r.id)) for r in everything}
        cases = [
            ({}, lambda r: True, lambda r: 0),
            ({"status": "succeeded", "sort": "reward"}, lambda r: r.status.value == "succeeded",
             lambda r: (r.reward is None, r.reward or 0)),
            ({"phase": "train", "step": 3, "sort": "calls", "descending": True},
             lambda r: (r.place.phase, r.place.step) == (Phase.TRAIN, 3), lambda r: -calls[r.id]),
            ({"phase": "eval"}, lambda r: r.place.phase is Phase.EVAL, lambda r: 0),
            ({"task_id": "t2", "reward_min": 0.5}, lambda r: r.task_id == "t2"
             and r.reward is not None and r.reward >= 0.5, lambda r: 0),
        ]  # fmt: skip
        for kwargs, keep, key in cases:
            expected = sorted([r for r in everything if keep(r)], key=key)  # stable: creation
            got = []
            for page in range(10):
                total, rows = s.rollout_page("r", **kwargs, offset=page * 7, limit=7)
                got += rows
            assert total == len(expected), kwargs
            assert [r.id for r, _, _ in got] == [r.id for r in expected], kwargs
            assert all(n == calls[r.id] and tok == 2 * n for r, n, tok in got)
        with pytest.raises(StoreError, match="sort"):
            s.rollout_page("r", sort="id; DROP TABLE rollouts")


def test_a_read_only_store_reads_while_another_writes_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "traces.sqlite"
    with pytest.raises(StoreError, match="no trace store"):
        Store(path, read_only=True)
    writer = Store(path)
    run = writer.create_run({}, "r")
    reader = Store(path, read_only=True)
    writer.log_metrics(run.id, 0, {"x": 1.0})
    assert [m.value for _, m in reader.metrics_after(run.id)] == [1.0]
    writer.log_metrics(run.id, 1, {"x": 2.0})
    first = reader.metrics_after(run.id)[0][0]
    assert [(m.step, m.value) for _, m in reader.metrics_after(run.id, first)] == [(1, 2.0)]
    with pytest.raises(StoreError, match="read-only"):
        reader.create_run({})
    with pytest.raises(StoreError, match="read-only"):
        reader.record_reward(Reward("x", 1.0, RewardSource.ADMIN))
    reader.close()
    writer.close()
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="upgrade tether"):
        Store(path, read_only=True)


def test_the_vendored_chart_library_matches_its_readme() -> None:
    folder = ROOT / "tether" / "dashboard" / "static" / "vendor" / "uplot"
    readme = (folder / "README.md").read_text()
    for name, digest in re.findall(
        r"\| `([\w.]+)` \| `uplot@[\d.]+` `[^`]+` \| `([0-9a-f]{64})` \|", readme
    ):
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert "MIT" in (folder / "LICENSE").read_text()
    assert len(re.findall(r"[0-9a-f]{64}", readme)) == 3


def test_the_tooltip_gets_the_top_alternatives_the_agent_asked_for(tmp_path: Path) -> None:
    """Chat and completions shapes of ``logprobs`` both reach the token's ``data-top``."""
    chat = {"choices": [{"message": {"role": "assistant", "content": "ab"}, "logprobs": {
        "content": [{"token": "a", "logprob": -0.1, "top_logprobs": [
            {"token": "a", "logprob": -0.1}, {"token": "<b>", "logprob": -2.5}]},
                    {"token": "b", "logprob": -0.2, "top_logprobs": []}]}}]}  # fmt: skip
    completion = {"choices": [{"text": "ab", "logprobs": {
        "tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"x": -3.0, "a": -0.1}, {"b": -0.2}]}}]}  # fmt: skip
    with Store(tmp_path / "s" / "traces.sqlite") as s:
        s.create_run({}, "r")
        for rid, response in (("r-chat", chat), ("r-text", completion)):
            s.create_rollout(Rollout(id=rid, run_id="r"))
            a = s.start_attempt(rid)
            s.record_call(Call(rid, 0, [1], [5, 6], [-0.1, -0.2], 0, attempt=a, response=response))
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    chat_page, text_page = get_all(app, ["/ui/s/s/rollout/r-chat", "/ui/s/s/rollout/r-text"])
    tops = re.findall(r"data-top='([^']*)'>([^<]*)<", chat_page.text)
    # tojson writes "<" as \u003c inside the attribute: markup never appears raw
    assert "<b>" not in chat_page.text and "\\u003cb\\u003e" in chat_page.text
    assert [(json.loads(html.unescape(t)), text) for t, text in tops] == [
        ([["a", -0.1], ["<b>", -2.5]], "a")
    ]
    tops = re.findall(r"data-top='([^']*)'>([^<]*)<", text_page.text)
    assert [(json.loads(html.unescape(t)), text) for t, text in tops] == [
        ([["a", -0.1], ["x", -3.0]], "a"),
        ([["b", -0.2]], "b"),
    ]


def test_a_run_folder_made_afresh_is_read_afresh(tmp_path: Path) -> None:
    """``tether demo`` replaces its run folder: the dashboard shows the new run, not the
    deleted file it still had open."""
    catalog = Catalog(runs_dir=tmp_path)
    path = tmp_path / "demo" / "traces.sqlite"
    with Store(path) as s:
        s.create_run({"name": "old"}, "old-1")
    assert [r.id for r in catalog.store("demo").list_runs()] == ["old-1"]
    shutil.rmtree(path.parent)
    assert catalog.store("demo") is None
    with Store(path) as s:
        s.create_run({"name": "new"}, "new-1")
    assert [r.id for r in catalog.store("demo").list_runs()] == ["new-1"]
    catalog.close()


def test_the_rollout_page_shows_what_the_grader_raised_and_the_run_its_held_out_reward(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "g" / "traces.sqlite") as s:
        run = s.create_run({"name": "g", "trainer": {"steps": 2}}, "g-1")
        s.log_metrics(run.id, 0, {"reward_mean": 0.0})
        s.log_metrics(run.id, 0, {"eval/sampled_success": 0.5, "eval/sampled_reward_mean": 0.625})
        s.create_rollout(Rollout(id="g-1-s0-g0-0", run_id=run.id, group_id="g-1-s0-g0", task={}))
        a = s.start_attempt("g-1-s0-g0-0")
        s.finish_rollout(
            AttemptEnd(
                "g-1-s0-g0-0",
                a,
                "succeeded",
                error="the grader raised KeyError: 'answr' (grader.py:6 in grade)",
                grader_error="KeyError: 'answr' (grader.py:6 in grade)\nTraceback (most recent "
                'call last):\n  File "/x/grader.py", line 6, in grade\n    return task["answr"]\n'
                "KeyError: 'answr'",
            )
        )
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    page, run_page = get_all(app, ["/ui/s/g/rollout/g-1-s0-g0-0", "/ui/s/g/run/g-1"])
    assert page.status_code == 200
    text = visible(page.text)
    assert "the grader raised" in text
    assert 'File "/x/grader.py", line 6, in grade' in html.unescape(page.text)
    assert 'return task["answr"]' in html.unescape(page.text)
    events = visible(run_page.text)
    assert "held-out success: sampled 50%; mean reward 0.625" in events
    assert "held-out mean reward" in html.unescape(run_page.text)


def test_the_rollout_page_shows_what_the_judge_saw_and_said_escaped(tmp_path: Path) -> None:
    prompt = [
        {"role": "system", "content": "You are a strict grader."},
        {"role": "user", "content": f'<task>{{}}</task> <candidate id="1">{HOSTILE}</candidate>'},
    ]
    scores = {"1": {"explanation": HOSTILE, "score": 0.25}, "2": {"explanation": "ok", "score": 1}}
    judged = {
        "judge": "judge",
        "model": "judge-<i>m</i>",
        "messages": prompt,
        "raw": json.dumps(scores),
        "scores": {"1": 0.25, "2": 1.0},
        "explanations": {"1": HOSTILE, "2": "right"},
        "candidate": "1",
    }
    failed = {"judge": "judge", "model": "m", "messages": prompt, "raw": HOSTILE, "candidate": "2"}
    why = "the judge failed: not JSON"
    with Store(tmp_path / "j" / "traces.sqlite") as s:
        run = s.create_run({"name": "j"}, "j-1")
        for i, (reward, detail) in enumerate([(0.25, judged), (None, failed)]):
            rid = f"j-1-s1-g{i}-0"
            s.create_rollout(Rollout(id=rid, run_id=run.id, group_id=f"j-1-s1-g{i}", task={}))
            a = s.start_attempt(rid)
            fault = None if reward is not None else f"{why}\nthe judge's answer:\n{HOSTILE}"
            s.finish_rollout(
                AttemptEnd(
                    rid,
                    a,
                    "succeeded",
                    error=fault and why,
                    grader_error=fault,
                    grade_detail=detail,
                ),
                reward=reward,
            )
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    pages = get_all(app, ["/ui/s/j/rollout/j-1-s1-g0-0", "/ui/s/j/rollout/j-1-s1-g1-0"])
    for page in pages:
        assert page.status_code == 200
        assert "<script>window" not in page.text and "<img src=x" not in page.text
        assert "<i>m</i>" not in page.text and "<b>bold" not in page.text
    text = visible(pages[0].text)
    assert "the judge judge-<i>m</i>: candidate 1, score 0.25" in text
    assert "1 (this rollout)" in text and "right" in text
    assert text.count(HOSTILE) == 2  # the explanation, the prompt
    assert json.dumps(HOSTILE)[1:-1] in text  # the raw answer
    assert "the judge's prompt (2 messages)" in text and "You are a strict grader." in text
    assert '<details class="judge-prompt">' in pages[0].text  # the prompt starts collapsed
    text = visible(pages[1].text)
    assert "the judge failed" in text and "the grader raised" not in text
    assert "the judge m: candidate 2\n" in text  # no score: the judge failed
