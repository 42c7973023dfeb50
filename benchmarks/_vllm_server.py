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
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

__all__ = ["default_python", "free_port", "tether_serve", "vllm_server"]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the server launcher lives in tests/

from tests.remote_servers import real_server  # noqa: E402


def default_python() -> str:
    return os.environ.get("TETHER_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(python: str, model_dir: Path) -> Iterator[str]:
    """The server (tests/remote_servers.py's ``real_server``: the flags tether needs, its
    own process group) on a free loopback port; its URL once ``/health`` answers. A
    SIGTERM (a timeout, a kill) unwinds through its teardown, so the server goes too."""
    signal.signal(signal.SIGTERM, _exit)
    old = os.environ.get("TETHER_VLLM_PYTHON")
    os.environ["TETHER_VLLM_PYTHON"] = python
    try:
        with real_server("vllm", model_dir, "lora") as url:
            yield url
    finally:
        if old is None:
            os.environ.pop("TETHER_VLLM_PYTHON", None)
        else:
            os.environ["TETHER_VLLM_PYTHON"] = old


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def tether_serve(
    engine_url: str, model: Path, store: Path, *, record_key: str = "", admin_key: str = ""
) -> Iterator[str]:
    """``tether serve --engine vllm --engine-url URL`` in its own process (record mode with
    ``record_key``); its URL once ``/healthz`` answers."""
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
