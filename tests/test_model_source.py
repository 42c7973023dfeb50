"""A misspelled, missing or unreachable model is one fast line, through the real CLI.

The test machine has no network; a local socket stands in for the Hub's proxy, so the
tests see whether a request was made at all (none with ``HF_HUB_OFFLINE=1``) and that a
Hub that never answers is given up on within the timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TETHER = [sys.executable, "-m", "tether.cli"]
ROOT = Path(__file__).resolve().parents[1]
TYPO = "Qwen/Qwen2.5-0.5B-Instrct"


@contextmanager
def _proxy(answer: bool) -> Iterator[tuple[str, list[bytes]]]:
    """A local HTTPS proxy that refuses every CONNECT (``answer``) or never replies."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    seen: list[bytes] = []
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            seen.append(conn.recv(200))
            if answer:
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", seen
    finally:
        srv.close()
        for c in held:
            c.close()


def _tether(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    t0 = time.monotonic()
    r = subprocess.run([*TETHER, *args], capture_output=True, text=True, timeout=120, env=full)
    return r, time.monotonic() - t0


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("offline", ["1", "0"])
def test_misspelled_hub_id_is_one_fast_line(offline: str, tmp_path: Path) -> None:
    with _proxy(answer=True) as (url, seen):
        r, took = _tether(
            "serve",
            "--model",
            TYPO,
            "--store",
            str(tmp_path / "t.sqlite"),
            HTTPS_PROXY=url,
            HF_HUB_OFFLINE=offline,
            HF_HOME=str(tmp_path / "hf"),
        )
    line = _one_line(r)
    assert f"model '{TYPO}' is neither a local folder nor" in line
    assert took < 20, took
    if offline == "1":
        assert seen == [] and "HF_HUB_OFFLINE is set" in line  # not one request
    else:
        assert seen and b"huggingface.co" in seen[0]
        assert "set HF_HUB_OFFLINE=1 to skip the Hub, or pass a folder" in line


def test_a_hub_that_never_answers_is_given_up_on_within_the_timeout(tmp_path: Path) -> None:
    with _proxy(answer=False) as (url, _):
        r, took = _tether(
            "serve",
            "--model",
            TYPO,
            "--store",
            str(tmp_path / "t.sqlite"),
            HTTPS_PROXY=url,
            HF_HUB_OFFLINE="0",
            HF_HUB_ETAG_TIMEOUT="2",
            HF_HOME=str(tmp_path / "hf"),
        )
    assert "reachable on the Hugging Face Hub" in _one_line(r)
    assert took < 20, took


@pytest.mark.parametrize(
    "model,needle",
    [("./no/such/folder", "no model folder at ./no/such/folder"), ("bad name!", "valid hub id")],
)
def test_missing_folders_and_bad_names_never_reach_the_hub(
    model: str, needle: str, tmp_path: Path
) -> None:
    with _proxy(answer=True) as (url, seen):
        r, _ = _tether(
            "serve", "--model", model, "--store", str(tmp_path / "t.sqlite"), HTTPS_PROXY=url
        )
    assert needle in _one_line(r) and seen == []
    if model.startswith("./"):  # a relative path: the error says where it looked
        assert f"(that is {Path.cwd() / model[2:]})" in _one_line(r)


def test_a_folder_without_config_and_a_train_run_with_a_typo(tmp_path: Path) -> None:
    r, _ = _tether(
        "serve",
        "--model",
        str(tmp_path),
        "--store",
        str(tmp_path / "t.sqlite"),
        HF_HOME=str(tmp_path / "hf"),
    )
    assert "has no config.json" in _one_line(r)
    r, took = _tether(
        "train",
        str(ROOT / "examples/calc/config.yaml"),
        f"model.path={TYPO}",
        f"dir={tmp_path}",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    assert f"model '{TYPO}'" in _one_line(r) and took < 60
    r, _ = _tether(  # a relative folder that is not there stays a path (not "no/such", a hub id)
        "train",
        str(ROOT / "examples/calc/config.yaml"),
        "model.path=./no/such",
        f"dir={tmp_path}",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    assert f"no model folder at ./no/such (that is {Path.cwd() / 'no/such'})" in _one_line(r)


def test_a_local_folder_is_used_as_is(starter_dir: Path) -> None:
    from tether.models import model_source

    assert model_source(str(starter_dir)) == str(starter_dir)
