"""The ``tether`` command as a user runs it: a real ``tether serve`` process, then the rollouts views."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import TETHER, serving
from tether.store import Store


def _run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TETHER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_serve_then_call_with_openai_then_list_and_show(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    store = tmp_path / "traces.sqlite"
    env = {**os.environ, "TETHER_ADMIN_KEY": "cli-admin-key"}
    with serving(starter_dir, store, "--log-level", "warning", env=env) as served:
        base = served.base
        admin = {"Authorization": "Bearer cli-admin-key"}
        opened = httpx.post(
            f"{base}/admin/rollouts", json={"task": {"q": 1}, "rollout_id": "r-cli"}, headers=admin
        ).json()
        client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["token"], max_retries=0)
        reply = client.chat.completions.create(
            model="policy", max_tokens=8, messages=[{"role": "user", "content": "What is 2 + 2?"}]
        )
        assert reply.choices[0].message.role == "assistant"
        assert (
            httpx.post(
                f"{base}/admin/rollouts/r-cli/finish", json={"reward": 1.0}, headers=admin
            ).status_code
            == 200
        )
        with httpx.Client(base_url=base) as ui:  # the dashboard at /ui, behind the same key
            assert ui.get("/ui/").status_code == 401
            login = ui.post("/ui/login", data={"key": "cli-admin-key"}, headers={"Origin": base})
            assert login.status_code == 303
            page = ui.get("/ui/s/serve/rollout/r-cli")
            assert page.status_code == 200 and '<span class="tok p' in page.text
    assert f"dashboard: {base}/ui/" in served.logs
    assert "cli-admin-key" not in served.logs  # the admin key is never printed
    listed = _run("rollouts", "list", "--store", str(store))
    assert listed.returncode == 0 and "r-cli" in listed.stdout and "succeeded" in listed.stdout
    shown = _run("rollouts", "show", "r-cli", "--store", str(store))
    assert shown.returncode == 0, shown.stderr
    assert "call 0" in shown.stdout and "logprob" in shown.stdout
    assert opened["token"] not in shown.stdout + listed.stdout
    # The token column is each completion token's text, decoded with the served model's tokenizer.
    with Store(store) as db:
        ids = db.calls("r-cli")[0].completion_ids
    rows = [ln.split() for ln in shown.stdout.splitlines()]
    by_id = {int(r[-3]): r for r in rows if len(r) >= 5 and r[-3].isdigit() and r[0].isdigit()}
    assert ids and set(ids) <= set(by_id)
    for tid in ids:
        text = repr(tokenizer.decode([tid], skip_special_tokens=False))
        assert " ".join(by_id[tid][1:-3]) == text, (tid, text, by_id[tid])
    assert "token text not shown" not in shown.stdout


@pytest.mark.parametrize("command", ["serve", "train"])
def test_non_loopback_bind_without_key_is_refused_in_one_line(command: str, tmp_path: Path) -> None:
    """One rule for every command (tether.gateway.resolve_admin_key): a run used to make a
    key nobody was told about; now it refuses, like serve, before loading the model."""
    env = {k: v for k, v in os.environ.items() if k != "TETHER_ADMIN_KEY"}
    args = {
        "serve": ["--host", "0.0.0.0", "--store", str(tmp_path / "s.sqlite")],
        "train": ["examples/calc/config.yaml", "gateway.host=0.0.0.0", f"dir={tmp_path}"],
    }[command]
    r = subprocess.run(
        [*TETHER, command, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "TETHER_ADMIN_KEY" in lines[0], r.stderr
    assert "loading the model" not in r.stdout + r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["rollouts", "list", "--store", "/nonexistent/x.sqlite"], "no trace store"),
        (["train", "/nonexistent.yaml"], "not found"),
        (["train", "examples/calc/config.yaml", "trainer.lrr=1"], "did you mean"),
    ],
)
def test_cli_errors_are_one_line_with_the_fix(args: list[str], needle: str) -> None:
    r = _run(*args)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_train_from_the_example_config_with_overrides(starter_dir: Path, tmp_path: Path) -> None:
    """``tether train CONFIG key=value ...``: evaluates, trains, evaluates, and ends with the
    summary line, the memory self-check and a checkpoint ``tether eval`` can load."""
    root = Path(__file__).resolve().parents[1]
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        "tasks.train_size=20",
        "tasks.val_size=2",
        "agent.mode=inprocess",
        "agent.entry=tether.starter.calc:agent",
        "rollout.n=2",
        "rollout.batch_groups=2",
        "trainer.steps=2",
        "eval.tasks=2",
        "eval.samples=2",
        "eval.greedy=true",
        "checkpoint.every=2",
        "gateway.default_max_tokens=24",
    ]
    out = _run("train", str(root / "examples/calc/config.yaml"), *overrides, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "held-out success: before " in out.stdout and ", 2 steps, " in out.stdout
    assert "  [greedy: " in out.stdout  # printed as text, not swallowed as console markup
    assert "memory: " in out.stdout and "after update 2" in out.stdout
    ckpt = tmp_path / "calc" / "checkpoints" / "step-000002"
    assert (ckpt / "model").is_dir()
    evaluated = _run(
        "eval", str(root / "examples/calc/config.yaml"), *overrides, "--checkpoint", str(ckpt)
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "held-out success: sampled " in evaluated.stdout


def test_demo_shows_warmup_progress_lines_only_while_building() -> None:
    import io
    import logging

    from rich.console import Console

    from tether.cli._starter import echo_logs

    out = io.StringIO()
    console = Console(file=out, width=200)
    warmup = logging.getLogger("tether.starter._warmup")
    with echo_logs("tether.starter", console):
        warmup.info("warm-up step %d  copy acc %.3f", 50, 0.25)
    warmup.info("after the build")
    assert "warm-up step 50  copy acc 0.250" in out.getvalue()
    assert "after the build" not in out.getvalue()
    assert not logging.getLogger("tether.starter").handlers
