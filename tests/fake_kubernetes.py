"""FakeKubernetes: an in-process fake of the few Kubernetes API calls the Job runner makes.

No cluster can run on the test machines, so this FastAPI app answers the
official ``kubernetes`` client over HTTP on loopback, with the shapes the
real API server returns for: Secrets (create, delete, delete collection),
Jobs (create, list, watch, delete, delete collection), Pods (list by
``job-name``, read log). A created Job "runs" on a fake kubelet: after
``start_s`` a pod appears and the Job becomes active; after ``run_s`` it
ends as the Job's *fate* says. The fate comes from ``fate_of(job)`` (by
default the ``fate`` key of the agent's ``TETHER_TASK``):

- ``succeed``: pod Succeeded (exit 0), Job condition ``Complete``;
- ``fail``: container exits 3, Job ``Failed`` / ``BackoffLimitExceeded``;
- ``evict``: pod ``Failed`` with reason ``Evicted`` (and a ``DisruptionTarget``
  condition), Job ``Failed`` / ``BackoffLimitExceeded``;
- ``deadline``: Job ``Failed`` / ``DeadlineExceeded``;
- ``hang``: stays active until deleted.

``drop_events`` makes the watch miss a Job's final event, so only a resync
(a new list) can see it end.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

__all__ = ["FakeKubernetes"]


def _default_fate(job: dict[str, Any]) -> str:
    container = job["spec"]["template"]["spec"]["containers"][0]
    for entry in container.get("env", []):
        if entry["name"] == "TETHER_TASK":
            return json.loads(entry["value"]).get("fate", "succeed")
    return "succeed"


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels") or {}
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    return JSONResponse(body, status_code=code)


class FakeKubernetes:
    """The fake API server's state and app. ``with FakeKubernetes() as k8s: k8s.url``."""

    def __init__(
        self,
        *,
        fate_of: Callable[[dict[str, Any]], str] = _default_fate,
        start_s: float = 0.05,
        run_s: float = 0.2,
        logs: str = "thinking\nanswer: 4\n",
    ) -> None:
        self.fate_of, self.start_s, self.run_s, self.logs = fate_of, start_s, run_s, logs
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        self.created: list[tuple[float, str]] = []  # (time, job name) of each creation
        self.deleted_jobs: list[str] = []
        self.drop_events: set[str] = set()  # job names whose final event the watch misses
        self.watch_requests = 0
        self._rv = 0
        self._watchers: list[tuple[str | None, asyncio.Queue[dict[str, Any]]]] = []
        self.app = self._build()

    # -- state ----------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, kind: str, job: dict[str, Any]) -> None:
        job["metadata"]["resourceVersion"] = self._next_rv()
        if kind == "MODIFIED" and job["metadata"]["name"] in self.drop_events:
            return
        for selector, queue in self._watchers:
            if _matches(job, selector):
                queue.put_nowait({"type": kind, "object": copy.deepcopy(job)})

    def _start(self, name: str) -> None:
        job = self.jobs.get(name)
        if job is None:
            return
        pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
        labels = {**job["spec"]["template"]["metadata"].get("labels", {}), "job-name": name}
        self.pods[pod_name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "uid": str(uuid.uuid4()),
            },
            "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
            "status": {"phase": "Running"},
        }
        job["status"] = {"active": 1, "startTime": "2025-01-01T00:00:00Z"}
        self._emit("MODIFIED", job)
        fate = self.fate_of(job)
        if fate != "hang":
            asyncio.get_running_loop().call_later(self.run_s, self._finish, name, pod_name, fate)

    def _finish(self, name: str, pod_name: str, fate: str) -> None:
        job, pod = self.jobs.get(name), self.pods.get(pod_name)
        if job is None or pod is None:
            return
        done = {"type": "Complete", "status": "True"}
        failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                  "message": "Job has reached the specified backoff limit"}  # fmt: skip
        if fate == "succeed":
            pod["status"] = {"phase": "Succeeded", "containerStatuses": [_terminated(0)]}
            job["status"] = {"succeeded": 1, "conditions": [done]}
        elif fate == "fail":
            pod["status"] = {"phase": "Failed", "containerStatuses": [_terminated(3)]}
            job["status"] = {"failed": 1, "conditions": [failed]}
        elif fate == "evict":
            pod["status"] = {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
                ],
            }
            job["status"] = {"failed": 1, "conditions": [failed]}
        elif fate == "deadline":
            pod["status"] = {"phase": "Failed", "containerStatuses": [_terminated(137)]}
            deadline = {**failed, "reason": "DeadlineExceeded",
                        "message": "Job was active longer than specified deadline"}  # fmt: skip
            job["status"] = {"failed": 1, "conditions": [deadline]}
        self._emit("MODIFIED", job)

    # -- the API --------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI()
        fake = self

        @app.post("/api/v1/namespaces/{ns}/secrets")
        async def create_secret(ns: str, request: Request) -> Any:
            body = await request.json()
            name = body["metadata"]["name"]
            if name in fake.secrets:
                return _status(409, "AlreadyExists", f'secrets "{name}" already exists')
            body["metadata"].update(namespace=ns, uid=str(uuid.uuid4()),
                                    resourceVersion=fake._next_rv())  # fmt: skip
            fake.secrets[name] = body
            return JSONResponse(body, status_code=201)

        @app.delete("/api/v1/namespaces/{ns}/secrets/{name}")
        async def delete_secret(ns: str, name: str) -> Any:
            if fake.secrets.pop(name, None) is None:
                return _status(404, "NotFound", f'secrets "{name}" not found')
            return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

        @app.delete("/api/v1/namespaces/{ns}/secrets")
        async def delete_secrets(ns: str, labelSelector: str | None = None) -> Any:
            for name in [n for n, s in fake.secrets.items() if _matches(s, labelSelector)]:
                del fake.secrets[name]
            return {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []}

        @app.post("/apis/batch/v1/namespaces/{ns}/jobs")
        async def create_job(ns: str, request: Request) -> Any:
            body = await request.json()
            name = body["metadata"]["name"]
            if name in fake.jobs:
                return _status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            body["metadata"].update(namespace=ns, uid=str(uuid.uuid4()))
            body["status"] = {}
            fake.jobs[name] = body
            fake.created.append((time.monotonic(), name))
            fake._emit("ADDED", body)
            asyncio.get_running_loop().call_later(fake.start_s, fake._start, name)
            return JSONResponse(copy.deepcopy(body), status_code=201)

        @app.get("/apis/batch/v1/namespaces/{ns}/jobs")
        async def list_jobs(
            ns: str,
            labelSelector: str | None = None,
            watch: bool = False,
            timeoutSeconds: int | None = None,
        ) -> Any:
            if watch:
                fake.watch_requests += 1
                return StreamingResponse(fake._watch(labelSelector, timeoutSeconds or 30))
            items = [copy.deepcopy(j) for j in fake.jobs.values() if _matches(j, labelSelector)]
            meta = {"resourceVersion": str(fake._rv)}
            return {"kind": "JobList", "apiVersion": "batch/v1", "metadata": meta, "items": items}

        @app.delete("/apis/batch/v1/namespaces/{ns}/jobs/{name}")
        async def delete_job(ns: str, name: str) -> Any:
            return fake._delete_job(name) or _status(404, "NotFound", f'jobs "{name}" not found')

        @app.delete("/apis/batch/v1/namespaces/{ns}/jobs")
        async def delete_jobs(ns: str, labelSelector: str | None = None) -> Any:
            for name in [n for n, j in fake.jobs.items() if _matches(j, labelSelector)]:
                fake._delete_job(name)
            return {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": []}

        @app.get("/api/v1/namespaces/{ns}/pods")
        async def list_pods(ns: str, labelSelector: str | None = None) -> Any:
            items = [copy.deepcopy(p) for p in fake.pods.values() if _matches(p, labelSelector)]
            meta = {"resourceVersion": str(fake._rv)}
            return {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}

        @app.get("/api/v1/namespaces/{ns}/pods/{name}/log")
        async def pod_log(ns: str, name: str) -> Any:
            if name not in fake.pods:
                return _status(404, "NotFound", f'pods "{name}" not found')
            return PlainTextResponse(fake.logs)

        return app

    def _delete_job(self, name: str) -> dict[str, Any] | None:
        job = self.jobs.pop(name, None)
        if job is None:
            return None
        self.deleted_jobs.append(name)
        for pod_name in [
            n for n, p in self.pods.items() if p["metadata"]["labels"].get("job-name") == name
        ]:
            del self.pods[pod_name]  # propagationPolicy Background: the pods go too
        self._emit("DELETED", job)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    async def _watch(self, selector: str | None, timeout_s: int) -> Any:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (selector, queue)
        self._watchers.append(entry)
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except asyncio.TimeoutError:
                    break
                yield json.dumps(event) + "\n"
        finally:
            self._watchers.remove(entry)

    # -- serving --------------------------------------------------------------------

    def __enter__(self) -> FakeKubernetes:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, args=([sock],), daemon=True)
        self._thread.start()
        while not self._server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.force_exit = True  # open watches end with the server, as on a restart
        self._thread.join(timeout=10)

    def kubeconfig(self, path: Any) -> str:
        """Write a kubeconfig naming this server; return its path."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(cfg))
        return str(path)


def _terminated(code: int) -> dict[str, Any]:
    reason = "Completed" if code == 0 else "Error"
    return {"name": "agent", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}}}  # fmt: skip
