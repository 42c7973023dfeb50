"""An engine that dies: the run stops on one line, ``/healthz`` says why.

- ``tether train`` whose only vLLM server (a fake, a real process) is SIGKILLed mid-run
  exits non-zero within 90 s with one error line naming the server, no eval after it
  and no before → after summary (the remote engine waits ``LOST_AFTER_S`` = 30 s for
  the server to come back, then is lost: ``tether/engine/_remote.py``); with two
  replicas it stops once both are gone, naming each;
- ``tether serve`` in front of that server answers ``/healthz`` 503 with the reason
  while it is down, and a chat call a 502 naming it once it is lost;
- the embedded engine's worker thread dies: calls fail with ``EngineLost``, ``/healthz``
  answers 503, and ``tether train`` stops with one line. The thread is killed the way
  CPython lets one thread kill another (``PyThreadState_SetAsyncExc``, what thread-killing
  tools use): ``SystemExit`` raised in it at the next line it runs, an exception its
  step does not catch, as a library's ``sys.exit()`` or a fault in its own bookkeeping
  would be.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import serving
from tests.remote_servers import fake_server
from tests.test_remote_replicas import _kill_server
from tether.engine import EngineLost, RemoteEngine, SamplingParams, TransformersEngine, server_api
from tether.engine._replicas import ReplicaSet, cause
from tether.gateway import create_app

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "calc" / "config.yaml"
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 4}


def test_no_replica_up_is_an_outage_lost_after_the_grace_period() -> None:
    with pytest.raises(httpx.ConnectError) as refused:
        httpx.get("http://127.0.0.1:9", timeout=5)  # nothing listens at port 9
    assert cause(refused.value) == "cannot reach it: connection refused"
    replicas = ReplicaSet(["http://a:8000", "http://b:8000"])
    a, b = replicas.replicas
    replicas.mark_down(a, "cannot reach it: connection refused")
    assert replicas.outage("vLLM", 30) is None  # b is up
    replicas.mark_down(b, "the connection broke: server disconnected")
    down = replicas.outage("vLLM", 30)
    assert down is not None and not down.lost
    assert down.why == (
        "every vLLM server went away (http://a:8000: cannot reach it: connection refused; "
        "http://b:8000: the connection broke: server disconnected)"
    )
    lost = replicas.outage("vLLM", 0)
    assert lost is not None and lost.lost and str(lost.error()).endswith("; restart them")
    replicas.mark_up(b)  # one came back within the grace period
    assert replicas.outage("vLLM", 0) is None


async def test_healthz_of_a_gateway_whose_server_cannot_be_reached_is_503_naming_it(
    make_gateway: Any,
) -> None:
    """Asked before any call (``tether serve`` after the hand-over), the engine checks its
    server first: none listens at port 9, so it is down, not yet lost."""
    engine = RemoteEngine(server_api("vllm"), ["http://127.0.0.1:9"])
    transport = httpx.ASGITransport(app=create_app(make_gateway(engine)))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            r = await client.get("/healthz")
    finally:
        await engine.close()
    assert r.status_code == 503
    assert r.json() == {
        "status": "down",
        "error": "the vLLM server at http://127.0.0.1:9 went away (cannot reach it: "
        "connection refused)",
    }


# -- a remote server dies ------------------------------------------------------------


def _train(tmp: Path, model: Path, *args: str) -> subprocess.Popen[str]:
    """``tether train`` of the calc example on the starter, 3 updates, evals on, a
    checkpoint after each update; ``args`` say which engine and agent."""
    common = [
        f"dir={tmp}", f"model.path={model}", "tasks.train_size=16", "tasks.val_size=2",
        "agent.mode=inprocess", "agent.max_attempts=3", "rollout.n=4", "rollout.batch_groups=2",
        "rollout.grader=tests.test_cli_runs:grade_alternately", "eval.tasks=2", "eval.samples=1",
        "eval.greedy=false", "eval.every=0", "gateway.default_max_tokens=16",
        "run.collapse_patience=0", "trainer.steps=3", "checkpoint.every=1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "tether.cli", "train", str(CONFIG), *common, *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-4000:]
    return errors[0]


def _wait_for_step_2_calls(db: Path, run: subprocess.Popen[str]) -> None:
    """Until the run has recorded a call on the weights of the first push (v1)."""
    deadline = time.monotonic() + 400
    while run.poll() is None and time.monotonic() < deadline:
        if db.exists():
            with (
                contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c,
                contextlib.suppress(sqlite3.OperationalError),  # tables not made yet
            ):
                if c.execute("SELECT 1 FROM calls WHERE policy_version = 1").fetchone():
                    return
        time.sleep(0.02)
    raise AssertionError("the run recorded no call on weights v1")


def _killed_at_update_2(
    tmp: Path, model: Path, urls: list[str]
) -> tuple[subprocess.Popen[str], str, str, float]:
    """``tether train`` served by ``urls``, every one SIGKILLed while update 2's rollouts
    run; the finished run, its stdout and stderr, and the seconds from the kill to its end
    (it is killed itself past 90 s)."""
    run = _train(
        tmp, model, "engine.kind=vllm", f"engine.urls=[{','.join(urls)}]",
        "agent.entry=tether.starter.calc:agent",
    )  # fmt: skip
    try:
        _wait_for_step_2_calls(tmp / "calc" / "traces.sqlite", run)
        for url in urls:
            _kill_server(url)
        killed = time.monotonic()
        out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    return run, out, err, time.monotonic() - killed


@pytest.mark.slow
def test_train_stops_when_its_only_vllm_server_dies(starter_dir: Path, tmp_path: Path) -> None:
    with fake_server("vllm", starter_dir) as url:
        run, out, err, took = _killed_at_update_2(tmp_path, starter_dir, [url])
    assert run.returncode == 1, out[-2000:] + err[-4000:]
    assert took < 90
    line = _error_line(err)
    went = f"error: the vLLM server at {url} went away (cannot reach it: connection refused)"
    assert line.startswith(went), line
    assert " at update 2; restart it; resume from step-000001 with: " in line, line
    assert line.endswith(" --resume"), line
    assert "held-out success" not in out + err and "->" not in out + err
    assert "collapsed" not in err


@pytest.mark.slow
def test_train_stops_when_every_replica_is_gone(starter_dir: Path, tmp_path: Path) -> None:
    """One replica down, the other serves (tests/test_remote_replicas.py); both down for
    the grace period, the run stops on one line naming each and why."""
    with fake_server("vllm", starter_dir) as a, fake_server("vllm", starter_dir) as b:
        run, out, err, _ = _killed_at_update_2(tmp_path, starter_dir, [a, b])
    assert run.returncode == 1, out[-2000:] + err[-4000:]
    refused = "cannot reach it: connection refused"
    assert _error_line(err).startswith(
        f"error: every vLLM server went away ({a}: {refused}; {b}: {refused}) at update 2; "
        "restart them; resume from step-000001 with: "
    ), err[-2000:]
    assert "held-out success" not in out + err


@pytest.mark.slow
def test_serve_says_503_then_502_naming_the_server_that_died(
    starter_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "TETHER_ADMIN_KEY": "lost-admin-key"}
    admin = {"Authorization": "Bearer lost-admin-key"}
    with (
        fake_server("vllm", starter_dir) as url,
        serving(
            starter_dir,
            tmp_path / "traces.sqlite",
            "engine.health_interval_s=0.5",
            "--engine",
            "vllm",
            "--engine-url",
            url,
            env=env,
        ) as served,  # fmt: skip
        httpx.Client(base_url=served.base, timeout=90) as gw,
    ):
        opened = gw.post("/admin/rollouts", json={"task": {}}, headers=admin).json()
        chat = f"{opened['base_url']}/chat/completions"
        auth = {"Authorization": f"Bearer {opened['token']}"}
        assert gw.post(chat, json=CHAT, headers=auth).status_code == 200
        _kill_server(url)
        health = _until(lambda: gw.get("/healthz"), lambda r: r.status_code == 503, 20)
        assert health.json()["status"] == "down"  # calls wait for it to come back, for 30 s
        went = f"the vLLM server at {url} went away (cannot reach it: connection refused)"
        assert health.json()["error"] == went
        failed = gw.post(chat, json=CHAT, headers=auth)  # waits out the grace period
        assert failed.status_code == 502, failed.text
        message = failed.json()["error"]["message"]
        assert message == f"engine failed: {went}; restart it", message
        lost = gw.get("/healthz")
        assert lost.status_code == 503 and lost.json()["status"] == "lost"


def _until(get: Any, ok: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not ok(got := get()):
        assert time.monotonic() < deadline, got.text
        time.sleep(0.2)
    return got


# -- the embedded engine's worker thread dies ----------------------------------------


def kill_engine_thread() -> None:
    """Raise ``SystemExit`` in the embedded engine's worker thread (see the module
    docstring); it is raised when the thread next runs Python code (its next request)."""
    (worker,) = [t for t in threading.enumerate() if t.name == "tether-engine"]
    assert worker.ident is not None
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(worker.ident), ctypes.py_object(SystemExit)
    )
    assert hit == 1


async def test_a_dead_worker_thread_fails_calls_and_healthz_says_why(
    starter_dir: Path, make_gateway: Any
) -> None:
    engine = TransformersEngine.from_pretrained(str(starter_dir))
    gw = make_gateway(engine)
    opened = gw.open_rollout({}, rollout_id="r-1")
    transport = httpx.ASGITransport(app=create_app(gw))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            kill_engine_thread()
            with pytest.raises(EngineLost, match=r"worker thread died \(SystemExit\(\)\)"):
                await engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
            health = await client.get("/healthz")
            chat = await client.post(
                "/rollouts/r-1/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": f"Bearer {opened.token}"},
            )
    finally:
        await engine.close()
    assert health.status_code == 503 and health.json() == {
        "status": "lost",
        "error": "the embedded engine's worker thread died (SystemExit())",
    }
    assert chat.status_code == 502
    assert chat.json()["error"]["message"] == (
        "engine failed: the embedded engine's worker thread died (SystemExit()); "
        "its traceback is in the log above"
    )


_agent_runs = itertools.count()
#: The agent run that kills the worker: the first of update 2 (2 eval rollouts, then 8
#: per update).
KILL_AT = 2 + 8


async def killing_agent(task: dict[str, Any], client: Any) -> str:
    """The calc agent; the first rollout of update 2 kills the engine's thread first."""
    from tether.starter.calc import agent

    if next(_agent_runs) == KILL_AT:
        kill_engine_thread()
    return await agent(task, client)


@pytest.mark.slow
def test_train_stops_when_the_embedded_worker_thread_dies(
    starter_dir: Path, tmp_path: Path
) -> None:
    run = _train(tmp_path, starter_dir, "agent.entry=tests.test_engine_lost:killing_agent")
    with contextlib.ExitStack() as stack:
        stack.callback(run.kill)
        out, err = run.communicate(timeout=300)
    assert run.returncode == 1, out[-2000:] + err[-4000:]
    line = _error_line(err)
    assert line.startswith(
        "error: the embedded engine's worker thread died (SystemExit()) at update 2; its "
        f"traceback is in the log above; resume from step-000001 with: tether train {CONFIG} "
    ), line
    assert line.endswith(" --resume"), line
    assert "held-out success" not in out + err
