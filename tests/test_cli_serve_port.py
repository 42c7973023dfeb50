"""``tether serve`` binds its port before loading the model: ``--port 0`` takes a free port
and every URL it prints or hands to agents has that port; a port in use is one line."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai

from tests.helpers import TETHER

KEY = "serve-port-admin-key-0123456789"


def test_port_0_serves_on_the_port_it_prints_and_hands_out(
    starter_dir: Path, tmp_path: Path
) -> None:
    cmd = [*TETHER, "serve", "--model", str(starter_dir), "--port", "0"]
    cmd += ["--store", str(tmp_path / "traces.sqlite")]
    env = {**os.environ, "TETHER_ADMIN_KEY": KEY}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and "tether gateway on" not in line:
            line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found and found.group(1) != "0", line
        base = f"http://127.0.0.1:{found.group(1)}"
        admin = {"Authorization": f"Bearer {KEY}"}
        deadline = time.monotonic() + 120
        while True:  # served from the bind on: 503 "loading" until the model has loaded
            try:
                r = httpx.post(f"{base}/admin/rollouts", json={"task": {}}, headers=admin)
                if r.status_code != 503:
                    break
            except httpx.ConnectError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert r.status_code == 201, r.text
        opened = r.json()
        assert opened["base_url"].startswith(f"{base}/rollouts/"), opened["base_url"]
        client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["token"], max_retries=0)
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "2 + 2?"}], max_tokens=4
        )
        assert reply.choices[0].message is not None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_port_in_use_is_one_line_before_the_model_loads(
    starter_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [*TETHER, "serve", "--port", str(port), "--store", str(tmp_path / "t.sqlite")]
        cmd += ["--model", str(starter_dir)]
        done = subprocess.run(
            cmd, env={**os.environ, "TETHER_ADMIN_KEY": KEY}, capture_output=True, text=True
        )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0], done.stderr
    assert "--port" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "t.sqlite").exists()  # refused before the model and the store
