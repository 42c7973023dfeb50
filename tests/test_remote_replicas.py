"""Two vLLM replicas, one killed mid-run: the run finishes on the other.

``tether train`` (a real process) serves its rollouts from two vLLM servers (real
processes: FAKES, tests/fake_backend.py, or the real vLLM under ``make test-vllm``). Once
the first weight push has reached replica A, the test pauses A (``keep``: calls that reach
it are held) and, as soon as A holds a call of step 2 (its ``/load``), kills it (SIGKILL):
so a call is certain to break off, however fast the server answers. Calls that reach it
fail (recorded as failed calls naming it); they are retried (the agent's SDK retries a
502, and an attempt whose call could not reach a server is retried as an infrastructure
fault), on replica B from then on. The run ends normally, no rollout is left running, and
the pushes after the kill reach B alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.remote_servers import fake_server
from tether.records import CallStatus, RolloutStatus
from tether.store import Store

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "calc" / "config.yaml"
#: vLLM's flag for ``/load``, the count of requests in flight (held ones too)
LOAD_TRACKING = ("--enable-server-load-tracking",)


def _start_run(tmp: Path, model: Path, urls: list[str]) -> subprocess.Popen[str]:
    args = [
        f"dir={tmp}", f"model.path={model}", "engine.kind=vllm", f"engine.urls=[{','.join(urls)}]",
        "engine.health_interval_s=0.5", "tasks.train_size=16", "tasks.val_size=2",
        "agent.mode=inprocess", "agent.entry=tether.starter.calc:agent", "agent.max_attempts=3",
        "rollout.n=4", "rollout.batch_groups=2",
        "rollout.grader=tests.test_cli_runs:grade_alternately", "eval.enabled=false",
        "gateway.default_max_tokens=16", "run.collapse_patience=0", "trainer.steps=3",
        "checkpoint.every=0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "tether.cli", "train", str(CONFIG), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _hold_a_step_2_call(url: str, run: subprocess.Popen[str]) -> None:
    """Once the push of v1 has reached the server at ``url`` (its version is 1 and the
    push resumed it), pause it (``keep``) and return when it holds a call."""
    deadline = time.monotonic() + 400
    with httpx.Client(base_url=url, timeout=10) as client:
        while run.poll() is None and time.monotonic() < deadline:
            pushed = client.get("/weight_info").json().get("weight_version") == "1"
            if pushed and not client.get("/is_paused").json()["is_paused"]:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the run pushed no weights v1 to replica A")
        client.post("/pause", params={"mode": "keep"}).raise_for_status()
        while run.poll() is None and time.monotonic() < deadline:
            if client.get("/load").json()["server_load"] > 0:
                return
            time.sleep(0.01)
    raise AssertionError("no call of step 2 reached replica A")


def _kill_server(url: str) -> None:
    """SIGKILL the process listening at ``url``'s port: no graceful shutdown, so the calls
    in flight there break off."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    pids = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port}
    pids.discard(None)
    assert pids, f"nothing listens at {url}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_replicas_rollouts_finish_on_the_other(starter_dir: Path, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(contextlib.ExitStack())
        a = first.enter_context(fake_server("vllm", starter_dir, extra=LOAD_TRACKING))
        b = stack.enter_context(fake_server("vllm", starter_dir))
        run = _start_run(tmp_path, starter_dir, [a, b])
        _hold_a_step_2_call(a, run)
        _kill_server(a)  # replica A dies (SIGKILL) with a call of step 2 on it
        first.close()
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, out[-4000:]
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        run_id = store.list_runs()[0].id
        versions = [m.value for m in store.metrics(run_id, "policy_version")]
        rollouts = store.list_rollouts(run_id=run_id)
        calls = [c for r in rollouts for c in store.calls(r.id)]
    assert versions == [1.0, 2.0, 3.0]
    assert all(r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED) for r in rollouts)
    lost = [c for c in calls if c.status is CallStatus.FAILED]
    assert lost and all(f"cannot reach the vLLM server at {a}" in (c.error or "") for c in lost)
    answered = [c for c in calls if c.status is CallStatus.OK]
    assert {c.policy_version for c in answered} == {0, 1, 2}  # steps 2 and 3 served by B
    assert sum(r.status is RolloutStatus.SUCCEEDED for r in rollouts) == 24  # none lost
