"""The Kubernetes Job runner: manifests field by field, and the real client against FakeKubernetes."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_kubernetes import FakeKubernetes
from tests.helpers import ADMIN_KEY
from tether.configio import build
from tether.engine.testing import NullEngine
from tether.errors import UserError
from tether.gateway import Gateway, GatewayConfig
from tether.records import Phase, RolloutStatus, Task
from tether.run import collect_groups
from tether.runner import (
    KubernetesConfig,
    Launch,
    RunnerConfig,
    RunnerConfigError,
    make_runner,
)
from tether.runner._base import rebase
from tether.runner._k8s_manifest import job_manifest, job_name, label_value

pytest.importorskip("kubernetes")

TEMPLATE = """
    apiVersion: batch/v1
    kind: Job
    metadata:
      labels: {team: rl}
    spec:
      backoffLimit: 6
      template:
        spec:
          restartPolicy: OnFailure
          automountServiceAccountToken: true
          containers:
            - name: agent
              image: registry.example/agent:1
              command: [python, agent.py]
              env:
                - {name: MY_SETTING, value: "1"}
                - {name: OPENAI_API_KEY, value: leaked-in-template}
              resources:
                requests: {cpu: 250m}
              securityContext:
                privileged: true
                capabilities: {add: [NET_ADMIN]}
"""


def launch(i: int = 0, task: dict | None = None, **kw: Any) -> Launch:
    return Launch(
        f"run1:s0:g0:{i}",
        kw.pop("attempt", 1),
        f"http://10.0.0.5:8321/rollouts/run1:s0:g0:{i}/v1",
        f"tr-token-{i}",
        task or {"q": "2+2"},
        reward_url=None,
        timeout_s=kw.pop("timeout_s", 90.5),
        run_id="run1",
    )


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_manifest_field_by_field(tmp_path: Path) -> None:
    template = tmp_path / "job.yaml"
    template.write_text(textwrap.dedent(TEMPLATE))
    config = RunnerConfig(
        runner="kubernetes",
        extra_env={"LOG_LEVEL": "info"},
        gateway_url="http://gw.tether.svc:8321",
        kubernetes=KubernetesConfig(template=str(template), namespace="agents", memory="2Gi"),
    )

    job = job_manifest(
        config, rebase(launch(7), config.gateway_url), runner_id="rabc", template=_yaml(template)
    )
    meta, spec = job["metadata"], job["spec"]
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert meta["name"] == job_name("tether", launch(7)) and len(meta["name"]) <= 63
    assert meta["namespace"] == "agents"
    assert meta["labels"] == {
        "team": "rl",
        "tether.dev/rollout": "run1-s0-g0-7",
        "tether.dev/attempt": "1",
        "tether.dev/runner": "rabc",
        "tether.dev/run": "run1",
    }
    assert meta["annotations"]["tether.dev/rollout-id"] == "run1:s0:g0:7"
    assert spec["activeDeadlineSeconds"] == 91 and spec["backoffLimit"] == 0
    assert spec["ttlSecondsAfterFinished"] == 600
    assert spec["template"]["metadata"]["labels"]["tether.dev/rollout"] == "run1-s0-g0-7"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/agent:1"
    assert container["command"] == ["python", "agent.py"]
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "2Gi"},
        "limits": {"cpu": "1", "memory": "2Gi"},
    }
    env = env_of(container)
    assert env == {
        "MY_SETTING": "1",
        "OPENAI_BASE_URL": "http://gw.tether.svc:8321/rollouts/run1:s0:g0:7/v1",
        "OPENAI_API_KEY": {"secretKeyRef": {"name": meta["name"], "key": "OPENAI_API_KEY"}},
        "ANTHROPIC_BASE_URL": "http://gw.tether.svc:8321/rollouts/run1:s0:g0:7",
        "ANTHROPIC_API_KEY": {"secretKeyRef": {"name": meta["name"], "key": "OPENAI_API_KEY"}},
        "TETHER_ROLLOUT_ID": "run1:s0:g0:7",
        "TETHER_TASK": '{"q": "2+2"}',
        "LOG_LEVEL": "info",
    }
    assert "tr-token-7" not in str(job) and ADMIN_KEY not in str(job)
    config.kubernetes.token_as = "env"
    as_env = job_manifest(config, launch(7), runner_id="rabc", template=_yaml(template))
    assert env_of(as_env["spec"]["template"]["spec"]["containers"][0])["OPENAI_API_KEY"] == (
        "tr-token-7"
    )


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())


def test_manifest_and_config_errors(tmp_path: Path) -> None:
    config = RunnerConfig(runner="kubernetes", command=["agent"])
    with pytest.raises(RunnerConfigError, match=r"no container and kubernetes\.image"):
        job_manifest(config, launch(), runner_id="r")
    admin = {"spec": {"containers": [{"image": "a", "env": [{"name": "TETHER_ADMIN_KEY"}]}]}}
    with pytest.raises(RunnerConfigError, match="admin key never reaches"):
        job_manifest(config, launch(), runner_id="r", template=admin)
    root = {"spec": {"securityContext": {"runAsUser": 0}, "containers": [{"image": "a"}]}}
    with pytest.raises(RunnerConfigError, match="root"):
        job_manifest(config, launch(), runner_id="r", template=root)
    with pytest.raises(RunnerConfigError, match=r"kubernetes\.template"):
        RunnerConfig(runner="kubernetes")
    with pytest.raises(UserError, match=r"namespace \('Bad_NS'\) must be a DNS label"):
        build(
            RunnerConfig,
            {"runner": "kubernetes", "command": "a", "kubernetes": {"namespace": "Bad_NS"}},
        )
    with pytest.raises(RunnerConfigError, match="mode"):
        RunnerConfig(runner="kubernetes", mode="pool", entry="m:f")
    assert label_value("a" * 100).startswith("a" * 54) and len(label_value("a" * 100)) == 63


# --- against the fake API server -------------------------------------------------------


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        fake.kubeconfig_path = fake.kubeconfig(tmp_path / "kubeconfig")
        yield fake


def runner_config(k8s: FakeKubernetes, **kube: Any) -> RunnerConfig:
    kc = {"image": "agent:1", "kubeconfig": k8s.kubeconfig_path, "resync_s": 30.0, **kube}
    return RunnerConfig(runner="kubernetes", command=["python", "agent.py"],
                        kubernetes=KubernetesConfig(**kc), max_output_bytes=1024)  # fmt: skip


async def test_jobs_end_as_their_pods_did(k8s: FakeKubernetes) -> None:
    runner = make_runner(runner_config(k8s))
    fates = ["succeed", "fail", "evict", "deadline"]
    results = await asyncio.gather(
        *(runner.run(launch(i, {"fate": f})) for i, f in enumerate(fates))
    )
    ok, failed, evicted, deadline = results
    assert ok.status is RolloutStatus.SUCCEEDED and ok.final_answer == "answer: 4"
    assert "thinking" in ok.output_tail and ok.infra is None
    assert failed.status is RolloutStatus.FAILED and failed.exit_code == 3
    assert failed.infra is None and "code 3" in (failed.error or "")
    assert evicted.status is RolloutStatus.FAILED and evicted.infra == "evicted"
    assert "low on resource" in (evicted.error or "")
    assert deadline.status is RolloutStatus.TIMEOUT and deadline.infra is None
    assert len(k8s.created) == 4 and k8s.secrets == {}  # each token's Secret deleted at the end
    assert k8s.watch_requests == 1  # one watch for all attempts, no poll per rollout
    await runner.close()
    assert k8s.jobs == {}


async def test_a_missed_event_is_seen_at_resync(k8s: FakeKubernetes) -> None:
    runner = make_runner(runner_config(k8s, resync_s=1.0))
    k8s.drop_events.add(job_name("tether", launch(0)))
    result = await asyncio.wait_for(runner.run(launch(0)), 10)
    assert result.status is RolloutStatus.SUCCEEDED
    assert k8s.watch_requests >= 2  # seen by the list that precedes the next watch
    await runner.close()


async def test_cancel_and_close_delete_jobs_and_secrets(k8s: FakeKubernetes) -> None:
    runner = make_runner(runner_config(k8s))
    cancelled = asyncio.ensure_future(runner.run(launch(0, {"fate": "hang"})))
    closed = asyncio.ensure_future(runner.run(launch(1, {"fate": "hang"})))
    while len(k8s.pods) < 2:
        await asyncio.sleep(0.02)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert job_name("tether", launch(0)) in k8s.deleted_jobs
    await runner.close()
    assert (await closed).status is RolloutStatus.CANCELLED
    assert k8s.jobs == {} and k8s.pods == {} and k8s.secrets == {}


async def test_job_creation_is_rate_limited(k8s: FakeKubernetes) -> None:
    runner = make_runner(runner_config(k8s, jobs_per_s=5.0, burst=1))
    await asyncio.gather(*(runner.run(launch(i)) for i in range(4)))
    await runner.close()
    times = sorted(t for t, _ in k8s.created)
    assert times[-1] - times[0] >= 3 / 5.0 * 0.9  # 4 Jobs at 5/s with a burst of 1


async def test_evicted_attempt_is_retried_as_a_new_job(
    k8s: FakeKubernetes, tokenizer: Any, store: Any
) -> None:
    k8s.fate_of = lambda job: (
        "evict" if job["metadata"]["labels"]["tether.dev/attempt"] == "1" else "succeed"
    )
    gw = Gateway(NullEngine(), tokenizer, store, GatewayConfig(admin_key=ADMIN_KEY))
    run = store.create_run({}, run_id="k8s1")
    runner = make_runner(runner_config(k8s))
    collected = await collect_groups(
        gw,
        runner,
        [Task("t0", {"q": "1"})],
        2,
        grader=lambda t, a: 1.0,
        run_id=run.id,
        phase=Phase.TRAIN,
        step=0,
    )
    await runner.close()
    assert [(o.status, o.attempt) for o in collected.outcomes] == [
        (RolloutStatus.SUCCEEDED, 2),
        (RolloutStatus.SUCCEEDED, 2),
    ]
    attempts = sorted(name.rsplit("-", 1)[1] for _, name in k8s.created)
    assert attempts == ["a1", "a1", "a2", "a2"]


def test_missing_client_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(RunnerConfigError, match=r"pip install 'tether\[kubernetes\]'"):
        make_runner(RunnerConfig(runner="kubernetes", command=["a"]))
