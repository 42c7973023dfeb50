"""Build the engine a config names: :func:`connect_engine` for vLLM and SGLang servers.

``engine.kind`` picks the server adapter (``_vllm.VLLMServer``, ``_sglang.SGLangServer``,
imported on first use) and :meth:`RemoteEngine.connect` checks every replica before the
run starts. The embedded engine (``kind: transformers``) is built by the run itself,
since it shares weights with the trainer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tether.engine._config import EngineConfig
from tether.engine._remote import RemoteEngine
from tether.engine._server_api import PauseMode, ServerAPI

__all__ = ["connect_engine", "server_api"]


def server_api(kind: str) -> ServerAPI:
    """The adapter for ``kind`` (``vllm`` or ``sglang``)."""
    if kind == "vllm":
        from tether.engine._vllm import VLLMServer

        return VLLMServer()
    if kind == "sglang":
        from tether.engine._sglang import SGLangServer

        return SGLangServer()
    raise ValueError(f"no server adapter for engine.kind={kind!r} (vllm or sglang)")


async def connect_engine(
    cfg: EngineConfig,
    *,
    weights_dir: str | os.PathLike[str] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    lora_config: Mapping[str, Any] | None = None,
    pause_mode: PauseMode = "wait",
) -> RemoteEngine:
    """The remote engine of ``cfg`` (``cfg.weights_dir`` wins over ``weights_dir``)."""
    return await RemoteEngine.connect(
        server_api(cfg.kind),
        list(cfg.urls),
        transport=cfg.transport,
        weights_dir=cfg.weights_dir or weights_dir,
        model_dir=model_dir,
        lora_config=lora_config,
        keep_weights=cfg.keep_weights,
        nccl=(cfg.nccl_address, cfg.nccl_port, cfg.nccl_backend),
        api_key=cfg.api_key,
        timeout_s=cfg.timeout_s,
        health_interval_s=cfg.health_interval_s,
        lost_after_s=cfg.lost_after_s,
        pause_mode=pause_mode,
    )
