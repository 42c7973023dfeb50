"""Kubernetes runner: one Job per rollout attempt, through the official ``kubernetes`` client.

Per attempt: wait for the creation rate limit (a token bucket,
``kubernetes.jobs_per_s`` / ``burst``), create the token's Secret (with
``token_as: secret``) and the Job (:mod:`._k8s_manifest`), wait for the Job's
end, read the pod's log tail, delete the Secret. The Job itself stays until
``ttlSecondsAfterFinished``.

Completion is seen through one watch per runner on the Jobs labelled with
its id, not one poll per rollout; the watch is restarted every
``resync_s`` after a full list, so an event lost on the way (a dropped
connection, a restarted API server) delays an attempt's end by at most one
resync. How a finished Job maps to an attempt:

=====================================================  ================================
Job / pod                                              attempt
=====================================================  ================================
``Complete``                                           SUCCEEDED
``Failed``, ``DeadlineExceeded``                       TIMEOUT
``Failed``, pod evicted / preempted                    FAILED, ``infra="evicted"``
``Failed``, pod's node lost                            FAILED, ``infra="node_lost"``
``Failed``, pod gone (deleted from outside)            FAILED, ``infra="killed"``
``Failed``, container exited non-zero                  FAILED (the agent's failure)
deleted by someone else before it ended                FAILED, ``infra="killed"``
=====================================================  ================================

Cancelling an attempt, or :meth:`KubernetesRunner.close`, deletes its Jobs
(and their pods, ``propagationPolicy: Background``) and Secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tether.records import RolloutStatus

from ._base import (
    AttemptResult,
    Launch,
    RunnerConfigError,
    finish_despite_cancel,
    rebase,
    result_for,
)
from ._k8s_manifest import LABEL, job_manifest, secret_manifest
from ._runner_base import RunnerBase
from ._tail import Tail

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["KubernetesRunner", "TokenBucket"]

log = logging.getLogger(__name__)

EVICTION_REASONS = {"Evicted", "Preempting", "PreemptionByScheduler", "EvictionByEvictionAPI"}
NODE_LOST_REASONS = {"NodeLost", "DeletionByTaintManager", "TerminationByKubelet", "NodeShutdown"}


class TokenBucket:
    """At most ``rate`` acquisitions a second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)


def _api_clients(config: RunnerConfig) -> tuple[Any, Any]:
    try:
        from kubernetes import client
        from kubernetes import config as kube_config
    except ImportError:
        raise RunnerConfigError(
            "runner 'kubernetes' needs the Kubernetes client; install it with: "
            "pip install 'tether[kubernetes]'"
        ) from None
    kc = config.kubernetes
    cfg = client.Configuration()
    if kc.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=cfg)
    else:
        kube_config.load_kube_config(
            config_file=kc.kubeconfig, context=kc.context, client_configuration=cfg
        )
    api_client = client.ApiClient(cfg)
    return client.BatchV1Api(api_client), client.CoreV1Api(api_client)


def _load_template(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise RunnerConfigError(f"kubernetes.template ({path!r}) must hold one YAML mapping")
    return data


def _raw(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


class KubernetesRunner(RunnerBase):
    """Runs each attempt as a Job; see the module docstring."""

    def __init__(self, config: RunnerConfig) -> None:
        super().__init__(config)
        self.kc = config.kubernetes
        self.batch, self.core = _api_clients(config)
        self.template = _load_template(self.kc.template)
        self.runner_id = f"r{secrets.token_hex(5)}"
        self.selector = f"{LABEL}/runner={self.runner_id}"
        self._bucket = TokenBucket(self.kc.jobs_per_s, self.kc.burst)
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._resp: Any = None  # the open watch response, closed by close()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.watch_restarts = 0  # how many times the watch was (re)started after a list

    # -- the watch ------------------------------------------------------------------

    def _ensure_watch(self) -> None:
        if self._watcher is None:
            self._loop = asyncio.get_running_loop()
            self._watcher = threading.Thread(target=self._watch_loop, daemon=True)
            self._watcher.start()

    def _watch_loop(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        ns = self.kc.namespace
        while not self._stop.is_set():
            try:
                listed = _raw(
                    self.batch.list_namespaced_job(
                        ns, label_selector=self.selector, _preload_content=False
                    )
                )
                for job in listed.get("items", []):
                    self._seen(job, deleted=False)
                self.watch_restarts += 1
                resp = self.batch.list_namespaced_job(
                    ns,
                    label_selector=self.selector,
                    watch=True,
                    resource_version=listed["metadata"].get("resourceVersion"),
                    timeout_seconds=max(1, int(self.kc.resync_s)),
                    _preload_content=False,
                    _request_timeout=self.kc.resync_s + 10,
                )
                self._resp = resp
                try:
                    for line in iter_resp_lines(resp):
                        if self._stop.is_set():
                            break
                        if line:
                            event = json.loads(line)
                            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                                self._seen(event["object"], deleted=event["type"] == "DELETED")
                finally:
                    resp.release_conn()
            except Exception as exc:  # the API server away: try again after a pause
                if not self._stop.is_set():
                    log.warning("Kubernetes watch failed (%s); retrying", exc)
                    self._stop.wait(1.0)

    def _seen(self, job: dict[str, Any], *, deleted: bool) -> None:
        """Thread side: resolve the attempt waiting on ``job`` if the Job has ended."""
        name = job.get("metadata", {}).get("name")
        status = job.get("status") or {}
        ended = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if (ended or deleted) and self._loop is not None:
            outcome = {**job, "_deleted": deleted and not ended}
            self._loop.call_soon_threadsafe(self._resolve, name, outcome)

    def _resolve(self, name: str, job: dict[str, Any]) -> None:
        future = self._waiting.get(name)
        if future is not None and not future.done():
            future.set_result(job)

    # -- attempts -------------------------------------------------------------------

    async def _run(self, launch: Launch) -> AttemptResult:
        launch = rebase(launch, self.config.gateway_url)
        job = job_manifest(self.config, launch, runner_id=self.runner_id, template=self.template)
        name, ns = job["metadata"]["name"], self.kc.namespace
        self._ensure_watch()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[name] = future
        started = time.monotonic()
        try:
            await self._bucket.acquire()
            if self.kc.token_as == "secret":
                secret = secret_manifest(name, launch, job["metadata"]["labels"])
                await asyncio.to_thread(
                    self.core.create_namespaced_secret, ns, secret, _preload_content=False
                )
            await asyncio.to_thread(
                self.batch.create_namespaced_job, ns, job, _preload_content=False
            )
            ended = await future
            return await self._result(launch, name, ended, time.monotonic() - started)
        except asyncio.CancelledError:
            await finish_despite_cancel(self._delete(name))
            raise
        except Exception as exc:
            if type(exc).__name__ != "ApiException" and not isinstance(exc, OSError):
                raise
            return result_for(
                launch,
                RolloutStatus.FAILED,
                error=f"Kubernetes API error for Job {name}: {str(exc).splitlines()[0]}",
                infra="unschedulable",
                duration_s=time.monotonic() - started,
            )
        finally:
            self._waiting.pop(name, None)
            if self.kc.token_as == "secret":
                await finish_despite_cancel(self._delete_secret(name))

    async def _result(
        self, launch: Launch, name: str, job: dict[str, Any], duration: float
    ) -> AttemptResult:
        if self._closed:
            return result_for(
                launch, RolloutStatus.CANCELLED, error="runner closed", duration_s=duration
            )
        if job.get("_deleted"):
            return result_for(
                launch,
                RolloutStatus.FAILED,
                error=f"Job {name} was deleted before it ended",
                infra="killed",
                duration_s=duration,
            )
        conditions = {c["type"]: c for c in job.get("status", {}).get("conditions") or []}
        pod = await self._pod(name)
        tail = await self._log_tail(pod)
        fields: dict[str, Any] = {
            "final_answer": tail.last_line(),
            "output_tail": tail.text(),
            "duration_s": duration,
        }
        if "Complete" in conditions:
            return result_for(launch, RolloutStatus.SUCCEEDED, exit_code=0, **fields)
        failed = conditions.get("Failed", {})
        if failed.get("reason") == "DeadlineExceeded":
            return result_for(
                launch,
                RolloutStatus.TIMEOUT,
                error=f"Job {name} ran past activeDeadlineSeconds and was stopped",
                **fields,
            )
        pod_status = (pod or {}).get("status", {})
        disruption = [
            c.get("reason")
            for c in pod_status.get("conditions") or []
            if c.get("type") == "DisruptionTarget"
        ]
        reasons = {pod_status.get("reason"), *disruption}
        code = _exit_code(pod_status)
        if reasons & EVICTION_REASONS:
            infra, error = "evicted", f"pod of Job {name} was evicted: {pod_status.get('message')}"
        elif reasons & NODE_LOST_REASONS:
            infra, error = "node_lost", f"the node of Job {name} was lost"
        elif pod is None:  # deleted from outside (kubectl delete pod, a node drain)
            infra, error = "killed", f"the pod of Job {name} disappeared before it ended"
        else:
            infra = None
            error = f"agent container exited with code {code}" if code else failed.get("message")
        return result_for(
            launch,
            RolloutStatus.FAILED,
            exit_code=code,
            error=error or f"Job {name} failed",
            infra=infra,
            **fields,
        )

    async def _pod(self, job_name: str) -> dict[str, Any] | None:
        listed = _raw(
            await asyncio.to_thread(
                self.core.list_namespaced_pod,
                self.kc.namespace,
                label_selector=f"job-name={job_name}",
                _preload_content=False,
            )
        )
        pods = listed.get("items") or []
        return pods[-1] if pods else None

    async def _log_tail(self, pod: dict[str, Any] | None) -> Tail:
        tail = Tail(self.config.max_output_bytes)
        if pod is None:
            return tail
        try:
            resp = await asyncio.to_thread(
                self.core.read_namespaced_pod_log,
                pod["metadata"]["name"],
                self.kc.namespace,
                tail_lines=1000,
                limit_bytes=4 * self.config.max_output_bytes,
                _preload_content=False,
            )
            tail.add(resp.data)
        except Exception as exc:  # logs are a courtesy: the pod may be gone
            log.info("no log for pod %s: %s", pod["metadata"]["name"], exc)
        return tail

    async def _delete(self, name: str) -> None:
        try:
            await asyncio.to_thread(
                self.batch.delete_namespaced_job,
                name,
                self.kc.namespace,
                propagation_policy="Background",
                _preload_content=False,
            )
        except Exception as exc:
            log.info("could not delete Job %s: %s", name, exc)

    async def _delete_secret(self, name: str) -> None:
        try:
            await asyncio.to_thread(
                self.core.delete_namespaced_secret, name, self.kc.namespace, _preload_content=False
            )
        except Exception as exc:
            log.info("could not delete Secret %s: %s", name, exc)

    async def close(self) -> None:
        """Delete this runner's Jobs (running ones return CANCELLED) and Secrets; stop the watch."""
        self._closed = True
        ns = self.kc.namespace
        for call in (
            self.batch.delete_collection_namespaced_job,
            self.core.delete_collection_namespaced_secret,
        ):
            try:
                await asyncio.to_thread(
                    call,
                    ns,
                    label_selector=self.selector,
                    propagation_policy="Background",
                    _preload_content=False,
                )
            except Exception as exc:
                log.warning("could not delete the runner's objects: %s", exc)
        for name, future in list(self._waiting.items()):
            if not future.done():
                future.set_result({"metadata": {"name": name}, "_deleted": True})
        self._stop.set()
        if self._resp is not None:  # end the open watch now, not at its timeout
            with contextlib.suppress(Exception):
                self._resp.shutdown()
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.join, 5.0)


def _exit_code(pod_status: dict[str, Any]) -> int | None:
    for container in pod_status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode") is not None:
            return int(terminated["exitCode"])
    return None
