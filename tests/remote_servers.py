"""Fake vLLM / SGLang servers for the remote-engine tests, started as real processes.

:func:`fake_server` starts ``tests/fake_vllm.py`` or ``tests/fake_sglang.py`` (FAKES:
tether's embedded engine behind each server's routes, ``tests/fake_backend.py``) with the
flags the real server needs for a transport, as docs/engines.md gives them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from tests.fake_backend import launch_fake

__all__ = ["KINDS", "fake_server", "server_args"]

KINDS = ("vllm", "sglang")
#: What a vLLM server needs in its environment: the dev-mode routes, runtime LoRA loading.
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def server_args(kind: str, transport: str) -> list[str]:
    """The fake's command-line flags: the real server's for ``transport`` (gloo stands in
    for NCCL on the CPU)."""
    if kind == "vllm":
        args = ["--logprobs-mode", "processed_logprobs", "--enable-lora"]
        backend = {"nccl": "nccl", "disk": "disk"}.get(transport)
        if backend:
            args += ["--weight-transfer-config", json.dumps({"backend": backend})]
        return args
    return ["--weight-version", "0", "--enable-lora"]


@contextlib.contextmanager
def fake_server(kind: str, model_dir: str | Path, transport: str = "disk") -> Iterator[str]:
    """A fake ``kind`` server on a free loopback port, serving ``model_dir``; its URL."""
    module = {"vllm": "tests.fake_vllm", "sglang": "tests.fake_sglang"}[kind]
    env = VLLM_ENV if kind == "vllm" else {}
    with launch_fake(module, model_dir, *server_args(kind, transport), env=env) as url:
        yield url
