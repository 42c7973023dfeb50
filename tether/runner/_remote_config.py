"""Settings of the runners beyond one machine: ``runner.ray`` and ``runner.kubernetes``.

Plain validated dataclasses; they import neither Ray nor the Kubernetes client
(both optional extras), so a config naming them can be checked anywhere.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._base import RunnerConfigError

__all__ = ["KubernetesConfig", "RayConfig"]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?")


def _positive(section: str, name: str, value: object, *, integer: bool = False) -> None:
    kinds = int if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type, operator]
        kind = "an integer" if integer else "a number"
        raise RunnerConfigError(f"{name} ({value!r}) must be {kind} > 0")


@dataclass
class RayConfig:
    """Where and with what each Ray task (one rollout attempt) runs.

    - ``address``: an existing cluster (``"auto"``, ``"ray://head:10001"``); None
      starts a local Ray instance with ``local_num_cpus`` CPUs.
    - ``num_cpus`` / ``num_gpus`` / ``memory_mb`` / ``resources``: what one
      attempt reserves (Ray's scheduling resources; custom ones by name).
    - ``runtime_env``: passed to Ray as is (e.g. ``{"working_dir": "."}``).
    """

    #: An existing Ray cluster ("auto", "ray://head:10001"); None starts a local Ray instance.
    address: str | None = None
    #: CPUs of the local Ray instance started when address is None; None: Ray's own choice.
    local_num_cpus: int | None = None
    #: CPUs one attempt reserves (Ray scheduling resource).
    num_cpus: float = 1.0
    #: GPUs one attempt reserves.
    num_gpus: float = 0.0
    #: Memory one attempt reserves, in MiB; None reserves none.
    memory_mb: int | None = None
    #: Custom Ray resources one attempt reserves, by name.
    resources: dict[str, float] = field(default_factory=dict)
    #: Passed to Ray as it is (e.g. {"working_dir": "."}).
    runtime_env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive("ray", "num_cpus", self.num_cpus)
        if self.num_gpus < 0:
            raise RunnerConfigError(f"num_gpus ({self.num_gpus!r}) must be >= 0")
        if self.memory_mb is not None:
            _positive("ray", "memory_mb", self.memory_mb, integer=True)
        if self.local_num_cpus is not None:
            _positive("ray", "local_num_cpus", self.local_num_cpus, integer=True)
        for name, amount in self.resources.items():
            _positive("ray", f"resources[{name!r}]", amount)


@dataclass
class KubernetesConfig:
    """How each rollout attempt becomes a Kubernetes Job.

    - ``template``: a YAML file holding a Job (or a bare pod template) with the
      agent's image, command and resources; without one, ``image`` plus the
      runner's ``command`` make the container.
    - ``namespace``, ``kubeconfig``/``context`` (default: in-cluster config when
      running in a pod, else ``~/.kube/config``).
    - ``token_as``: ``"secret"`` (a Secret per attempt, read through
      ``secretKeyRef``) or ``"env"`` (a plain env value in the Job spec).
    - ``cpu`` / ``memory``: requests and limits set when the template has none.
    - ``ttl_s_after_finished``: how long finished Jobs stay for inspection.
    - ``jobs_per_s`` / ``burst``: Job creation rate limit (a token bucket).
    - ``resync_s``: the watch is restarted (and Jobs listed) at least this often.
    """

    #: Namespace of the Jobs (a DNS label).
    namespace: str = "default"
    #: A YAML file holding a Job (or a bare pod template) with the agent's image, command
    #: and resources; without one, image plus the runner's command make the container.
    template: str | None = None
    #: Container image of the agent when there is no template.
    image: str | None = None
    #: Kubeconfig file; None: the in-cluster config inside a pod, else ~/.kube/config.
    kubeconfig: str | None = None
    #: Kubeconfig context; None: its current one.
    context: str | None = None
    #: How a pod gets its rollout token: "secret" (a Secret per attempt, read through
    #: secretKeyRef) or "env" (a plain env value in the Job spec).
    token_as: str = "secret"
    #: CPU request and limit set when the template has none.
    cpu: str = "1"
    #: Memory request and limit set when the template has none.
    memory: str = "1Gi"
    #: Seconds finished Jobs stay for inspection.
    ttl_s_after_finished: int = 600
    #: Job creation rate limit (a token bucket's rate).
    jobs_per_s: float = 5.0
    #: Job creation burst (the token bucket's size).
    burst: int = 10
    #: The watch is restarted (and Jobs listed) at least this often, in seconds.
    resync_s: float = 30.0
    #: Prefix of the Job names (a DNS label of at most 20 characters).
    name_prefix: str = "tether"
    #: Service account of the pods; None: the namespace's default.
    service_account: str | None = None

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace):
            raise RunnerConfigError(
                f"namespace ({self.namespace!r}) must be a DNS label (a-z, 0-9, '-')"
            )
        if not _DNS_LABEL.fullmatch(self.name_prefix) or len(self.name_prefix) > 20:
            raise RunnerConfigError(
                f"name_prefix ({self.name_prefix!r}) must be a DNS label of "
                "at most 20 characters, e.g. 'tether'"
            )
        if self.token_as not in ("secret", "env"):
            raise RunnerConfigError(f"token_as ({self.token_as!r}) must be 'secret' or 'env'")
        if self.template is not None and not Path(self.template).is_file():
            raise RunnerConfigError(
                f"template ({self.template!r}) must be an existing YAML file "
                "holding a Job; see deploy/kubernetes/job-template.yaml"
            )
        for name in ("cpu", "memory"):
            if not _QUANTITY.fullmatch(str(getattr(self, name))):
                raise RunnerConfigError(
                    f"{name} ({getattr(self, name)!r}) must be a Kubernetes "
                    "quantity, e.g. '500m', '2', '1Gi'"
                )
        if isinstance(self.ttl_s_after_finished, bool) or self.ttl_s_after_finished < 0:
            raise RunnerConfigError(
                f"ttl_s_after_finished ({self.ttl_s_after_finished!r}) must be >= 0"
            )
        _positive("kubernetes", "jobs_per_s", self.jobs_per_s)
        _positive("kubernetes", "burst", self.burst, integer=True)
        _positive("kubernetes", "resync_s", self.resync_s)
