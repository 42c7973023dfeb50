"""A cold start of ``tether serve``: the port answers ``/healthz`` 503 ``{"status": "loading"}``
while the model loads, 200 once it has; a starter build says what it is and how long."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from rich.console import Console

from tether.cli._starter import starter_model
from tether.starter import Recipe, WarmupRecipe, is_starter

ROOT = Path(__file__).resolve().parents[1]
KEY = "cold-start-admin-key-0123456789"

#: ``tether serve`` whose model load waits for a file (the test's "slow load"), nothing else.
SLOW_LOAD = """\
import sys, time
from pathlib import Path
import tether.cli._serve_run as serve_run
gate, load = Path(sys.argv[1]), serve_run._load_engine
def slow(*args, **kwargs):
    while not gate.exists():
        time.sleep(0.05)
    return load(*args, **kwargs)
serve_run._load_engine = slow
sys.argv = ["tether", *sys.argv[2:]]
from tether.cli import main
main()
"""


def test_healthz_is_503_loading_until_the_model_is_ready_then_200(
    starter_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "loaded"
    cmd = [sys.executable, "-c", SLOW_LOAD, str(gate), "serve", "--model", str(starter_dir)]
    cmd += ["--port", "0", "--store", str(tmp_path / "t.sqlite")]
    env = {**os.environ, "TETHER_ADMIN_KEY": KEY, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    watchdog = threading.Timer(180, proc.kill)  # a server that never says so fails, not hangs
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and "tether gateway on" not in line:
            line = proc.stdout.readline()
        assert "loading the model" in line, line
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found, line
        base = f"http://127.0.0.1:{found.group(1)}"
        deadline = time.monotonic() + 30
        while True:  # the server starts a moment after the line
            try:
                health = httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        admin = {"Authorization": f"Bearer {KEY}"}
        early = httpx.post(f"{base}/admin/rollouts", json={"task": {}}, headers=admin)
        assert early.status_code == 503 and early.headers["retry-after"] == "5"
        assert early.json()["error"]["code"] == "model_loading"
        assert not (tmp_path / "t.sqlite").exists()  # nothing opened before the model

        gate.touch()
        deadline = time.monotonic() + 120
        while (health := httpx.get(f"{base}/healthz", timeout=2)).status_code == 503:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        r = httpx.post(f"{base}/admin/rollouts", json={"task": {}}, headers=admin)
        assert r.status_code == 201, r.text
    finally:
        watchdog.cancel()
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "Traceback" not in out, out[-3000:]


TINY = WarmupRecipe(
    max_steps=6,
    min_steps=3,
    cooldown_steps=3,
    warmup_steps=2,
    batch_size=4,
    eval_every=3,
    probe_size=4,
    lr=3e-3,
)


def test_a_starter_build_says_once_how_long_and_where_then_a_line_per_eval(
    starter_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(starter_dir, cache / starter_dir.name)  # the untrained base: cached
    buf = io.StringIO()
    console = Console(file=buf, width=300)
    folder = starter_model(console, cache_dir=cache, recipe=Recipe(warmup=TINY))
    assert is_starter(folder)
    lines = buf.getvalue().splitlines()
    assert lines[0] == (
        "building the starter model (once, about 6–8 minutes on 2 CPU cores; cached in "
        f"{cache}): a tokenizer, then a supervised warm-up of up to 6 steps, a progress "
        "line every 3"
    )
    steps = [ln for ln in lines if ln.startswith("  warm-up step ")]
    assert [ln.split()[2] for ln in steps] == ["3", "6"], lines
    assert not any("INFO" in ln for ln in lines), lines
    buf.truncate(0)
    assert starter_model(console, cache_dir=cache, recipe=Recipe(warmup=TINY)) == folder
    assert buf.getvalue() == ""  # cached: nothing said
