"""Which engine serves the model: :class:`EngineConfig` (the run config's ``engine:``).

``kind: transformers`` (the default) is the embedded engine, configured under
``model:``; ``vllm`` and ``sglang`` are servers the user started (docs/engines.md),
reached at ``urls`` and sent new weights after every update by ``transport``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from tether.errors import UserError

__all__ = ["EngineConfig", "EngineKind"]

EngineKind = Literal["transformers", "vllm", "sglang"]


@dataclass
class EngineConfig:
    #: transformers (embedded, the default; configured under model:), vllm or sglang
    #: (servers you start; docs/engines.md has their command lines).
    kind: EngineKind = "transformers"
    #: The servers' base URLs (vllm, sglang), e.g. [http://gpu-host:8000]; several are
    #: replicas: a rollout sticks to one, a dead one's rollouts retry on the others.
    urls: list[str] = field(default_factory=list)
    #: How new weights reach the servers after each update: disk (full weights as
    #: safetensors, then the server reloads them), lora (the adapter folder, loaded at
    #: runtime; needs trainer.lora) or nccl (a broadcast from the trainer over a process
    #: group the servers join).
    transport: Literal["disk", "lora", "nccl"] = "disk"
    #: A folder the trainer writes and every server reads (disk and lora transports);
    #: default: the run folder's weights/ (so trainer and servers share a file system).
    weights_dir: str | None = None
    #: Pushed weight folders kept in weights_dir (older ones are deleted).
    keep_weights: int = 2
    #: The trainer's address as the servers reach it (nccl transport).
    nccl_address: str = "127.0.0.1"
    #: The port of the broadcast group's store on the trainer (nccl); 0 picks a free one.
    nccl_port: int = 0
    #: nccl (tensors on the GPU) or gloo (on the CPU; what the tests use).
    nccl_backend: Literal["nccl", "gloo"] = "nccl"
    #: The servers' API key (sent as a Bearer token); default: $TETHER_ENGINE_API_KEY.
    api_key: str | None = field(default=None, repr=False)
    #: Seconds one generation request may take before it fails as a timeout.
    timeout_s: float = 600.0
    #: Seconds between health checks of the servers (a down one is retried).
    health_interval_s: float = 5.0
    #: Seconds with no server up before the engine is lost: calls wait for one to come
    #: back until then, and a run stops on one line naming the servers (at least three
    #: health checks).
    lost_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.kind not in ("transformers", "vllm", "sglang"):
            raise UserError(
                f"engine.kind ({self.kind!r}) must be one of 'transformers', 'vllm', 'sglang'"
            )
        if isinstance(self.urls, str):  # engine.urls=http://host:8000 on the command line
            self.urls = [self.urls]
        if self.kind != "transformers" and not self.urls:
            raise UserError(
                f"engine.kind={self.kind} needs the servers' URLs: engine.urls=[http://HOST:PORT]"
            )
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise UserError(f"engine.urls: {url!r} must start with http:// or https://")
        if self.transport not in ("disk", "lora", "nccl"):
            raise UserError(
                f"engine.transport ({self.transport!r}) must be one of 'disk', 'lora', 'nccl'"
            )
        if self.keep_weights < 1:
            raise UserError(f"engine.keep_weights ({self.keep_weights}) must be >= 1")
        if not 0 <= self.nccl_port < 65536:
            raise UserError(f"engine.nccl_port ({self.nccl_port}) must be in 0..65535")
        for name in ("timeout_s", "health_interval_s", "lost_after_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"engine.{name} ({value}) must be a number > 0")

    @property
    def remote(self) -> bool:
        return self.kind != "transformers"
