"""Fake vLLM / SGLang servers for the remote-engine tests, started as real processes.

:func:`fake_server` starts ``tests/fake_vllm.py`` or ``tests/fake_sglang.py`` (FAKES:
tether's embedded engine behind each server's routes, ``tests/fake_backend.py``) with the
flags the real server needs for a transport, as docs/engines.md gives them.

With ``TETHER_REAL_SERVERS=1`` (``dev/gpu_check.sh`` on a GPU machine) it starts the REAL
server instead, ``vllm serve`` or ``python -m sglang.launch_server`` with those flags and
``--dtype float32``, and skips the test, with the reason, where the package is not
importable: the same cases then run against the real server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fake_backend import _stop, launch_fake

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
    """A fake ``kind`` server on a free loopback port, serving ``model_dir``; its URL (the
    real server with ``TETHER_REAL_SERVERS=1``)."""
    if os.environ.get("TETHER_REAL_SERVERS") == "1":
        with real_server(kind, model_dir, transport) as url:
            yield url
        return
    module = {"vllm": "tests.fake_vllm", "sglang": "tests.fake_sglang"}[kind]
    env = VLLM_ENV if kind == "vllm" else {}
    with launch_fake(module, model_dir, *server_args(kind, transport), env=env) as url:
        yield url


@contextlib.contextmanager
def real_server(kind: str, model_dir: str | Path, transport: str) -> Iterator[str]:
    """The real ``kind`` server on a free port (skips the test when it is not installed)."""
    if importlib.util.find_spec(kind) is None:
        pytest.skip(f"{kind} is not importable here: the real-server check needs it")
    from tests.helpers import free_port

    port = free_port()
    if kind == "vllm":
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(model_dir), "--port", str(port), "--dtype", "float32",
               "--generation-config", "vllm", *server_args(kind, transport)]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
               "--port", str(port), "--dtype", "float32", *server_args(kind, transport)]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **VLLM_ENV}, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield _ready(proc, f"http://127.0.0.1:{port}", log)
        finally:
            _stop(proc)


def _ready(proc: subprocess.Popen[bytes], url: str, log: object, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)  # type: ignore[attr-defined]
            tail = log.read().decode(errors="replace")[-3000:]  # type: ignore[attr-defined]
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url
        time.sleep(1)
    raise TimeoutError(f"the server at {url} was not ready within {timeout} s")
