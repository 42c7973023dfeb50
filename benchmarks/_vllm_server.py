"""A REAL vLLM OpenAI server for the benchmarks, started with the flags tether needs
(docs/engines.md) in a process group of its own, stopped with its engine and workers;
and ``tether serve --engine vllm`` in front of a server.

The Python that runs it: ``--vllm-python`` / ``TETHER_VLLM_PYTHON``, else ``.venv-vllm``
(``make .venv-vllm/.installed``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx

__all__ = ["default_python", "free_port", "tether_serve", "vllm_server"]

ROOT = Path(__file__).resolve().parent.parent
#: tests/remote_servers.py's real-server flags: fp32, a 256 MiB KV cache, tether's logprobs
#: mode, no chunked prefill (the CPU build needs it off), runtime LoRA up to r=16.
FLAGS = ["--dtype", "float32", "--kv-cache-memory-bytes", str(256 << 20),
         "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
         "--no-enable-chunked-prefill", "--enable-lora", "--max-lora-rank", "16"]  # fmt: skip
ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def default_python() -> str:
    return os.environ.get("TETHER_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(python: str, model_dir: Path, timeout_s: float = 600) -> Iterator[str]:
    """The server on a free loopback port; its URL once ``/health`` answers."""
    port = free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--port", str(port), *FLAGS]  # fmt: skip
    # a SIGTERM (timeout, kill) unwinds through the finally below, so the server goes too
    signal.signal(signal.SIGTERM, _exit)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env={**os.environ, **ENV}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            yield _ready(proc, f"http://127.0.0.1:{port}", log, timeout_s)
        finally:
            _stop(proc)


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _ready(proc: subprocess.Popen[bytes], url: str, log: IO[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"the vLLM server exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url
        time.sleep(1)
    raise SystemExit(f"the vLLM server at {url} was not ready within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group; SIGKILL it if anything is left after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@contextlib.contextmanager
def tether_serve(
    engine_url: str, model: Path, store: Path, *, record_key: str = "", admin_key: str = ""
) -> Iterator[str]:
    """``tether serve --engine vllm --engine-url URL`` in its own process (record mode with
    ``record_key``); its URL once ``/healthz`` answers."""
    import sys

    port = free_port()
    cmd = [sys.executable, "-m", "tether.cli", "serve", "--model", str(model), "--port", str(port),
           "--engine", "vllm", "--engine-url", engine_url, "--store", str(store),
           "--log-level", "warning"] + (["--record-key", record_key] if record_key else [])  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if admin_key:
        env["TETHER_ADMIN_KEY"] = admin_key
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise SystemExit(f"tether serve did not answer at {url} (exit code {proc.poll()})")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
