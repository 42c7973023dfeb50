"""``tether serve``'s keys as a user meets them: the admin key file kept across restarts,
record mode enabled by ``--record-key`` / ``TETHER_RECORD_KEYS``, and ``tether train``
using ``TETHER_ADMIN_KEY`` for its own gateway, over the config's key."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers import TETHER, serving

RECORD_KEY = "record-key-0123456789abcdef"


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TETHER_ADMIN_KEY", "TETHER_RECORD_KEYS")
    }
    return {**env, **extra}


def _record_call(base: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": "2+2?"}]}
    return httpx.post(
        f"{base}/v1/chat/completions", json=body, headers=headers, timeout=60
    ).status_code


@pytest.mark.slow
def test_admin_key_file_is_kept_across_restarts_and_record_keys_enable_record_mode(
    starter_dir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "state" / "traces.sqlite"
    key_file = store.parent / "admin_key"
    with serving(starter_dir, store, "--record-key", RECORD_KEY, env=_env()) as served:
        key = key_file.read_text().strip()
        assert key_file.stat().st_mode & 0o777 == 0o600
        admin = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{served.base}/admin/state", headers=admin).status_code == 200
        assert _record_call(served.base, RECORD_KEY) == 200
        assert _record_call(served.base, "not-the-record-key-000000") == 401
        assert _record_call(served.base, None) == 401
    # A restart of the same store keeps the key; the record key comes from the environment.
    with serving(starter_dir, store, env=_env(TETHER_RECORD_KEYS=RECORD_KEY)) as served:
        assert key_file.read_text().strip() == key
        assert httpx.get(f"{served.base}/admin/state", headers=admin).status_code == 200
        assert _record_call(served.base, RECORD_KEY) == 200
    # Without a record key, record mode stays closed.
    with serving(starter_dir, store, env=_env()) as served:
        assert _record_call(served.base, RECORD_KEY) == 401


def test_a_key_file_others_can_read_is_refused_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "traces.sqlite"
    (tmp_path / "admin_key").write_text("k" * 40 + "\n")
    os.chmod(tmp_path / "admin_key", 0o644)
    r = subprocess.run(
        [*TETHER, "serve", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "chmod 600" in lines[0], r.stderr


def test_a_short_record_key_is_refused_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [*TETHER, "serve", "--store", str(tmp_path / "s.sqlite"), "--record-key", "short"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(TETHER_ADMIN_KEY="a" * 32),
    )
    assert r.returncode == 2 and "at least 16 characters" in r.stderr, r.stderr


def test_train_gateway_takes_the_admin_key_from_the_environment(
    starter_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """As ``tether serve`` does: TETHER_ADMIN_KEY wins over the config's gateway.admin_key
    (a run used to let the config win)."""
    from tether.gateway import GatewayConfig
    from tether.run import EvalConfig, RolloutConfig, TasksConfig, TrainConfig, TrainingRun
    from tether.runner import RunnerConfig

    monkeypatch.setenv("TETHER_ADMIN_KEY", "operator-key-0123456789")
    cfg = TrainConfig(
        name="adminkey",
        dir=str(tmp_path),
        gateway=GatewayConfig(admin_key="config-key-0123456789"),
        tasks=TasksConfig(source="calc", train_size=4, val_size=2),
        agent=RunnerConfig(mode="inprocess", entry="tether.starter.calc:agent"),
        rollout=RolloutConfig(n=2, batch_groups=1),
        eval=EvalConfig(tasks=1, samples=1, greedy=False),
    )

    async def go() -> tuple[int, int, int]:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            url = run.server.url
            ok = await asyncio.to_thread(
                httpx.get,
                f"{url}/admin/state",
                headers={"Authorization": "Bearer operator-key-0123456789"},
            )
            bad = await asyncio.to_thread(
                httpx.get, f"{url}/admin/state", headers={"Authorization": "Bearer other"}
            )
            config = await asyncio.to_thread(
                httpx.get,
                f"{url}/admin/state",
                headers={"Authorization": "Bearer config-key-0123456789"},
            )
        return ok.status_code, bad.status_code, config.status_code

    assert asyncio.run(go()) == (200, 401, 401)
