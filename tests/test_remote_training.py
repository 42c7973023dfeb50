"""``tether train`` with engine.kind=vllm / sglang against the fake servers (real processes):
every transport pushes each update, the servers report the versions, every recorded call
carries the version that produced it, and the trainer's self-check sees the same logprobs.

The fakes are FAKES (tests/fake_backend.py: tether's embedded engine behind each server's
routes, fp32), so the logprob gap is ~0 here; a bf16 server's is larger (docs/engines.md).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.remote_servers import REAL, fake_server
from tether.store import Store

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "calc" / "config.yaml"

_NO_NCCL = pytest.mark.skipif(REAL, reason="vLLM's CPU build has no NCCL to push weights over")
CASES = [
    ("vllm", "disk"),
    ("vllm", "lora"),
    pytest.param("vllm", "nccl", marks=_NO_NCCL),
    ("sglang", "disk"),
    ("sglang", "lora"),
]


def _train(
    tmp: Path, model: Path, url: str, kind: str, transport: str
) -> subprocess.CompletedProcess:
    args = [
        f"dir={tmp}",
        f"model.path={model}",
        f"engine.kind={kind}",
        f"engine.urls=[{url}]",
        f"engine.transport={transport}",
        "engine.nccl_backend=gloo",
        "tasks.train_size=10",
        "tasks.val_size=2",
        "agent.mode=inprocess",
        "agent.entry=tether.starter.calc:agent",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "rollout.grader=tests.test_cli_runs:grade_alternately",
        "eval.enabled=false",
        "gateway.default_max_tokens=16",
        "run.collapse_patience=0",
        "trainer.steps=2",
        "checkpoint.every=0",
    ]
    if transport == "lora":
        args += ["trainer.lora.r=4", "trainer.lora.alpha=8", "trainer.lr=1e-3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", "train", str(CONFIG), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip


async def _server_version(kind: str, url: str) -> int:
    from tether.engine import EngineConfig, connect_engine

    engine = await connect_engine(EngineConfig(kind=kind, urls=[url]))  # type: ignore[arg-type]
    await engine.close()
    return engine.policy_version


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "transport"), CASES)
def test_a_run_trains_through_the_servers(
    kind: str, transport: str, starter_dir: Path, tmp_path: Path
) -> None:
    with fake_server(kind, starter_dir, transport) as url:
        r = _train(tmp_path, starter_dir, url, kind, transport)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert asyncio.run(_server_version(kind, url)) == 2  # two updates, two pushes
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        run = store.list_runs()[0]
        gaps = [m.value for m in store.metrics(run.id, "logprob_gap_max")]
        versions = [m.value for m in store.metrics(run.id, "policy_version")]
        rollouts = store.list_rollouts(run_id=run.id)
        calls = [c for ro in rollouts for c in store.calls(ro.id)]
    assert versions == [1.0, 2.0]
    assert gaps and max(gaps) <= 1e-5, gaps  # fp32 fake: the trainer sees the server's logprobs
    assert calls and all(c.completion_ids for c in calls)
    # rollouts of step k ran on the weights pushed after step k-1: versions 0 then 1
    assert sorted({c.policy_version for c in calls}) == [0, 1]
    if transport != "nccl":
        pushed = sorted(p.name for p in (tmp_path / "calc" / "weights").iterdir())
        assert pushed == (["v1", "v2"] if transport == "disk" else ["lora-v1", "lora-v2"])


@pytest.mark.slow
def test_a_second_run_resets_a_server_an_earlier_run_pushed_to(
    starter_dir: Path, tmp_path: Path
) -> None:
    """The server holds the first run's weights (v2); the second run pushes its own
    starting weights as v0 first, so its first rollouts come from what its trainer holds."""
    with fake_server("vllm", starter_dir, "disk") as url:
        first = _train(tmp_path / "a", starter_dir, url, "vllm", "disk")
        assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
        second = _train(tmp_path / "b", starter_dir, url, "vllm", "disk")
        assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    out = second.stdout + second.stderr
    assert (
        "the servers serve v2, from an earlier run: pushing the run's starting weights as v0" in out
    )
    with Store(tmp_path / "b" / "calc" / "traces.sqlite") as store:
        run = store.list_runs()[0]
        gaps = [m.value for m in store.metrics(run.id, "logprob_gap_max")]
        versions = [m.value for m in store.metrics(run.id, "policy_version")]
    assert versions == [1.0, 2.0] and max(gaps) <= 1e-5, gaps
