"""The run's config and its record: typed fields, no mutation at run time, a final status.

- ``TrainConfig.resume`` is a typed field (``tether train --resume`` sets it);
  ``rollout.temperature`` (never read) is gone;
- async mode's sanity warnings come from ``TrainConfig.__post_init__``;
- a ``TrainingRun`` leaves its config as given (the effective gateway config,
  with the made admin key and the server's URL, is ``run.gateway_config``);
- a run's store record ends ``finished``, ``failed`` or ``interrupted``, and
  ``tether rollouts list`` shows it;
- ``tether serve`` reads a config file and dotted overrides; its flags win.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tether.cli._serve_run import ServeConfig, serve_config
from tether.configio import build, dump, load_config
from tether.errors import Interrupted, UserError
from tether.gateway import DEFAULT_PORT
from tether.records import Rollout, RunStatus
from tether.run import (
    EvalConfig,
    RolloutConfig,
    RunConfig,
    TasksConfig,
    TrainConfig,
    TrainingRun,
)
from tether.runner import RunnerConfig
from tether.store import Store

ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_run_config_loads_neither_fastapi_nor_uvicorn() -> None:
    code = (
        "import sys, tether.run.config, tether.trainer.config; "
        "loaded = [m for m in ('fastapi', 'uvicorn') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


def test_resume_is_a_typed_field_and_rollout_temperature_is_gone() -> None:
    assert load_config(TrainConfig, None, ["resume=true"]).resume is True
    assert TrainConfig().resume is False
    with pytest.raises(UserError, match="temperature"):
        build(TrainConfig, {"rollout": {"temperature": 0.7}})


def _async(**run: object) -> dict:
    return {
        "agent": {"mode": "inprocess", "entry": "tether.starter.calc:agent", "concurrency": 4},
        "rollout": {"n": 4, "batch_groups": 2},
        "run": {"mode": "async", **run},
    }


def test_async_sanity_warnings_come_from_the_config(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tether.run._run_config")
    build(TrainConfig, _async(max_groups_in_flight=8, max_policy_lag=1))
    text = caplog.text
    assert "agent.concurrency (4) is below max_groups_in_flight × rollout.n (32)" in text
    assert "max_groups_in_flight (8) is above (max_policy_lag + 1) × batch_groups (4)" in text
    caplog.clear()
    build(TrainConfig, {**_async(), "run": {"mode": "sync"}})  # sync: no async warnings
    assert caplog.text == ""
    with pytest.raises(UserError, match="max_groups_in_flight"):
        build(TrainConfig, _async(max_groups_in_flight=1))  # below batch_groups: never works


def _cfg(tmp_path: Path, name: str) -> TrainConfig:
    return TrainConfig(
        name=name,
        dir=str(tmp_path),
        tasks=TasksConfig(source="calc", train_size=4, val_size=2),
        agent=RunnerConfig(mode="inprocess", entry="tether.starter.calc:agent"),
        rollout=RolloutConfig(n=2, batch_groups=1),
        run=RunConfig(mode="async", hold_timeout_s=7.0),
        eval=EvalConfig(tasks=1, samples=1, greedy=False),
    )


def _record(tmp_path: Path, name: str) -> tuple[RunStatus, dict]:
    with Store(tmp_path / name / "traces.sqlite") as store:
        (run,) = store.list_runs()
        return run.status, run.config


def test_a_run_changes_no_config_and_ends_with_its_status(
    starter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_ADMIN_KEY", raising=False)

    async def go(name: str, exc: BaseException | None) -> TrainingRun:
        cfg = _cfg(tmp_path, name)
        before = dump(cfg)
        run = TrainingRun(cfg, model_path=starter_dir)
        with pytest.raises(type(exc)) if exc else contextlib.nullcontext():
            async with run:
                assert _record(tmp_path, name)[0] is RunStatus.RUNNING
                if exc is not None:
                    raise exc
        assert dump(cfg) == before  # admin key, public URL, hold timeout: not written into cfg
        return run

    run = asyncio.run(go("ok", None))
    g = run.gateway_config
    assert g is not None and g.admin_key and g.public_url == run.server.url
    assert g.admission_timeout_s == 7.0  # async mode: run.hold_timeout_s
    status, config = _record(tmp_path, "ok")
    assert status is RunStatus.FINISHED
    assert config["resume"] is False and config["extra"] == {}  # a training run's record
    asyncio.run(go("boom", RuntimeError("boom")))
    assert _record(tmp_path, "boom")[0] is RunStatus.FAILED
    asyncio.run(go("stopped", Interrupted(2)))  # Ctrl-C
    assert _record(tmp_path, "stopped")[0] is RunStatus.INTERRUPTED
    asyncio.run(go("cancelled", asyncio.CancelledError()))  # how Interrupts stops a run
    assert _record(tmp_path, "cancelled")[0] is RunStatus.INTERRUPTED

    async def evaluate() -> None:  # tether eval's record says it is not a training run
        async with TrainingRun(_cfg(tmp_path, "ev"), model_path=starter_dir, command="eval"):
            pass

    asyncio.run(evaluate())
    assert _record(tmp_path, "ev")[1]["extra"] == {"command": "eval"}


def test_rollouts_list_shows_each_runs_status(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite"
    with Store(db) as store:
        for run_id, status in (("r-done", RunStatus.FINISHED), ("r-stop", RunStatus.INTERRUPTED)):
            store.create_run({"name": run_id}, run_id=run_id)
            store.set_run_status(run_id, status)
            store.create_rollout(Rollout(id=f"{run_id}-0", run_id=run_id, task={"q": "1+1"}))
    r = subprocess.run(
        [sys.executable, "-m", "tether.cli", "rollouts", "list", "--store", str(db)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    header, *rows = [line.split("\t") for line in r.stdout.splitlines()]
    col = header.index("run_status")
    assert {row[0]: row[col] for row in rows} == {
        "r-done-0": "finished",
        "r-stop-0": "interrupted",
    }


def test_serve_reads_a_file_and_overrides_and_its_flags_win(tmp_path: Path) -> None:
    conf = tmp_path / "serve.yaml"
    conf.write_text(
        "model: some/model\nmax_batch_size: 8\n"
        "gateway:\n  port: 9100\n  log_prompts: true\n  max_tokens: 1024\n"
    )
    cfg = serve_config(str(conf), ["gateway.max_n=4"], {"port": 9200, "device": None})
    assert (cfg.model, cfg.max_batch_size, cfg.device) == ("some/model", 8, "cpu")
    g = cfg.gateway
    assert (g.port, g.log_prompts, g.max_tokens, g.max_n) == (9200, True, 1024, 4)
    # no file: the first word may already be an override
    bare = serve_config("gateway.record_keys=[" + "k" * 16 + "]", [], {})
    assert bare.gateway.record_keys == ("k" * 16,) and bare.store == ServeConfig().store
    with pytest.raises(UserError, match="did you mean"):
        serve_config(None, ["gateway.log_prompt=true"], {})


def test_a_gateway_section_keeps_the_training_gateway_on_a_free_port(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Setting any ``gateway.*`` key of a run once reset its port to serve's 8321, so a run
    collided with a running ``tether serve`` (or another run). Unset, the port is free."""
    cfg = load_config(TrainConfig, None, ["gateway.default_max_tokens=24"])
    assert cfg.gateway.port is None and cfg.gateway.default_max_tokens == 24
    cfg = dataclasses.replace(_cfg(tmp_path, "port"), gateway=cfg.gateway)
    with socket.socket() as taken:  # 8321 busy, as with a `tether serve` running
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # already busy is the same situation
            taken.bind(("127.0.0.1", DEFAULT_PORT))
            taken.listen()

        async def go() -> int:
            async with TrainingRun(cfg, model_path=starter_dir) as run:
                return run.server.port

        assert asyncio.run(go()) not in (0, DEFAULT_PORT)
    assert serve_config(None, [], {}).gateway.port is None  # serve resolves it to 8321


# -- every size, count and ratio is checked when the config is loaded -----------------------

BAD_VALUES = [
    ("tasks.train_size=0", r"tasks\.train_size \(0\) must be >= 1; "),
    ("tasks.val_size=-1", r"tasks\.val_size \(-1\) must be >= 0; "),
    (
        "tasks.val_size=0",
        r"tasks\.val_size \(0\) must be >= 1 with eval\.enabled: .*eval\.enabled=false",
    ),
    ("rollout.batch_groups=0", r"rollout\.batch_groups \(0\) must be >= 1; "),
    ("rollout.n=1", r"rollout\.n \(1\) must be >= 2"),
    ("model.max_batch_size=0", r"model\.max_batch_size \(0\) must be >= 1; "),
    (
        "model.train_dtype=fp16",
        r"model\.train_dtype \('fp16'\) must be one of 'float32', 'bfloat16'",
    ),
    ("model.rollout_dtype=int4", r"model\.rollout_dtype \('int4'\) must be one of 'float32', "),
    ("checkpoint.keep=0", r"checkpoint\.keep \(0\) must be >= 1; "),
    ("checkpoint.every=-1", r"checkpoint\.every \(-1\) must be >= 0; "),
    ("eval.every=-1", r"eval\.every \(-1\) must be >= 0"),
    ("eval.tasks=0", r"eval\.tasks \(0\) and eval\.samples \(4\) must be >= 1"),
    ("eval.temperature=-0.5", r"eval\.temperature \(-0\.5\) must be a finite number >= 0"),
    ("eval.temperature=nan", r"eval\.temperature \(nan\) must be a finite number >= 0"),
]


@pytest.mark.parametrize(("override", "message"), BAD_VALUES)
def test_a_bad_size_count_or_choice_is_one_line_at_load_time(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        load_config(TrainConfig, None, [override])
    assert "\n" not in str(err.value)


def test_val_size_zero_is_fine_without_evals() -> None:
    cfg = load_config(TrainConfig, None, ["tasks.val_size=0", "eval.enabled=false"])
    assert cfg.tasks.val_size == 0


def test_train_size_zero_through_the_cli_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    config = str(ROOT / "examples/calc/config.yaml")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "train",
            config,
            f"dir={tmp_path}",
            "tasks.train_size=0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
    assert "tasks.train_size (0) must be >= 1" in r.stderr
    assert not (tmp_path / "calc").exists()  # refused before anything was made
