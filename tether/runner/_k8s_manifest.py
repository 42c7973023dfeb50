"""The Kubernetes objects of one rollout attempt: its Job (from the user's template) and Secret.

Pure functions over dicts (what ``kubectl apply`` would read); no client
import. What tether sets on every Job, whatever the template says:

- ``metadata.name`` (``{prefix}-{hash of the rollout id}-a{attempt}``), labels
  ``tether.dev/run``, ``tether.dev/rollout``, ``tether.dev/attempt``,
  ``tether.dev/runner`` (also on the pod), full ids as annotations;
- ``spec.activeDeadlineSeconds`` = the attempt's timeout, ``backoffLimit: 0``
  (tether retries, as new attempts), ``ttlSecondsAfterFinished``;
- pod: ``restartPolicy: Never``, ``automountServiceAccountToken: false``,
  ``runAsNonRoot`` (user 65532 unless the template names one), RuntimeDefault
  seccomp;
- the agent container (the one named ``agent``, else the first):
  ``allowPrivilegeEscalation: false``, ``privileged: false``, all
  capabilities dropped; requests and limits (the config's ``cpu`` /
  ``memory`` where the template has none); the agent environment of
  docs/design.md, with the rollout token from a Secret (``token_as: secret``) or
  as a value (``token_as: env``). The admin key is never among them.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from typing import TYPE_CHECKING, Any

from ._base import FORBIDDEN_VARS, Launch, RunnerConfigError, agent_env, timeout_of

if TYPE_CHECKING:
    from ._config import RunnerConfig

__all__ = ["LABEL", "job_manifest", "job_name", "label_value", "secret_manifest"]

LABEL = "tether.dev"
DEFAULT_UID = 65532  # the "nonroot" user of distroless images
#: The variables that hold the rollout token (both from the Secret's one key with token_as: secret).
TOKEN_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(value: str) -> str:
    """``value`` as a valid label value: allowed characters, at most 63, alphanumeric ends."""
    cleaned = _LABEL_BAD.sub("-", value)
    if len(cleaned) > 63:
        digest = hashlib.sha256(value.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[:54]}-{digest}"
    return cleaned.strip("-._") or "x"


def job_name(prefix: str, launch: Launch) -> str:
    """A DNS-1123 name, unique per rollout attempt and stable across retries of the call."""
    digest = hashlib.sha256(launch.rollout_id.encode()).hexdigest()[:12]
    return f"{prefix}-{digest}-a{launch.attempt}"


def labels_of(launch: Launch, runner_id: str) -> dict[str, str]:
    labels = {
        f"{LABEL}/rollout": label_value(launch.rollout_id),
        f"{LABEL}/attempt": str(launch.attempt),
        f"{LABEL}/runner": runner_id,
    }
    if launch.run_id:
        labels[f"{LABEL}/run"] = label_value(launch.run_id)
    return labels


def secret_manifest(name: str, launch: Launch, labels: dict[str, str]) -> dict[str, Any]:
    """The Secret holding the attempt's rollout token (never the admin key)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": dict(labels)},
        "type": "Opaque",
        "stringData": {"OPENAI_API_KEY": launch.token},
    }


def _agent_container(pod: dict[str, Any], config: RunnerConfig) -> dict[str, Any]:
    containers = pod.setdefault("containers", [])
    if not containers:
        image = config.kubernetes.image
        if not image:
            raise RunnerConfigError(
                "the Job template has no container and kubernetes.image is not set; "
                "add a container to the template or set kubernetes.image"
            )
        containers.append({"name": "agent", "image": image})
    named = [c for c in containers if c.get("name") == "agent"]
    container = named[0] if named else containers[0]
    container.setdefault("name", "agent")
    if config.kubernetes.image and not container.get("image"):
        container["image"] = config.kubernetes.image
    if config.command:
        container["command"] = list(config.command)
        container.pop("args", None)
    if not container.get("image"):
        raise RunnerConfigError(f"container {container['name']!r} has no image; set one")
    return container


def _env(container: dict[str, Any], launch: Launch, config: RunnerConfig, secret: str) -> None:
    for entry in container.get("env", []):
        if entry.get("name") in FORBIDDEN_VARS:
            raise RunnerConfigError(
                f"the Job template sets {entry['name']!r}; the admin key never reaches an "
                "agent: remove it from the template"
            )
    contract = agent_env(launch, config.extra_env, parent_env={})
    env = [e for e in container.get("env", []) if e.get("name") not in contract]
    for name, value in contract.items():
        if name == "PATH":  # the image's own PATH, not the trainer's
            continue
        if name in TOKEN_VARS and config.kubernetes.token_as == "secret":
            ref = {"secretKeyRef": {"name": secret, "key": "OPENAI_API_KEY"}}
            env.append({"name": name, "valueFrom": ref})
        else:
            env.append({"name": name, "value": value})
    container["env"] = env


def _security(pod: dict[str, Any], container: dict[str, Any]) -> None:
    pod_sc = pod.setdefault("securityContext", {})
    pod_sc["runAsNonRoot"] = True
    pod_sc.setdefault("runAsUser", DEFAULT_UID)
    if pod_sc["runAsUser"] == 0:
        raise RunnerConfigError("the Job template runs as user 0 (root); agents run as non-root")
    pod_sc["seccompProfile"] = {"type": "RuntimeDefault"}
    sc = container.setdefault("securityContext", {})
    sc.update(
        allowPrivilegeEscalation=False,
        privileged=False,
        runAsNonRoot=True,
        capabilities={"drop": ["ALL"]},
        seccompProfile={"type": "RuntimeDefault"},
    )


def _resources(container: dict[str, Any], config: RunnerConfig) -> None:
    resources = container.setdefault("resources", {})
    for kind in ("requests", "limits"):
        section = resources.setdefault(kind, {})
        section.setdefault("cpu", config.kubernetes.cpu)
        section.setdefault("memory", config.kubernetes.memory)


def job_manifest(
    config: RunnerConfig,
    launch: Launch,
    *,
    runner_id: str,
    template: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The complete Job of ``launch``, from ``template`` (a Job or a pod template) or nothing."""
    kc = config.kubernetes
    base = copy.deepcopy(template or {})
    if base.get("kind", "Job") != "Job" and "spec" in base and "containers" not in base["spec"]:
        raise RunnerConfigError(f"the template is a {base['kind']}; it must be a batch/v1 Job")
    if "containers" in base.get("spec", {}):  # a bare pod template
        base = {"spec": {"template": base}}
    job: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job", **base}
    name = job_name(kc.name_prefix, launch)
    labels = labels_of(launch, runner_id)
    meta = job.setdefault("metadata", {})
    meta.update(name=name, namespace=kc.namespace)
    meta.pop("generateName", None)
    meta["labels"] = {**meta.get("labels", {}), **labels}
    meta["annotations"] = {
        **meta.get("annotations", {}),
        f"{LABEL}/rollout-id": launch.rollout_id,
        **({f"{LABEL}/run-id": launch.run_id} if launch.run_id else {}),
    }
    spec = job.setdefault("spec", {})
    spec["activeDeadlineSeconds"] = max(1, math.ceil(timeout_of(launch, config.timeout_s)))
    spec["backoffLimit"] = 0
    spec["ttlSecondsAfterFinished"] = kc.ttl_s_after_finished
    pod_template = spec.setdefault("template", {})
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta["labels"] = {**pod_meta.get("labels", {}), **labels}
    pod = pod_template.setdefault("spec", {})
    pod["restartPolicy"] = "Never"
    pod["automountServiceAccountToken"] = False
    if kc.service_account:
        pod["serviceAccountName"] = kc.service_account
    container = _agent_container(pod, config)
    _env(container, launch, config, secret=name)
    _security(pod, container)
    _resources(container, config)
    return job
