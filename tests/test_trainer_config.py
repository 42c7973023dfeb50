"""Every size, count and ratio of ``trainer:`` is checked when the config is built: one
line that names the value, the rule and the fix, before anything runs. The keys that
moved to ``run:`` still load under their old ``trainer.`` names, with one notice each."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tether.configio import build, dump, load_config
from tether.errors import UserError
from tether.run.config import TrainConfig

BAD = [
    ("trainer.steps=0", r"trainer.steps \(0\) must be > 0"),
    ("trainer.lr=-1e-4", r"trainer.lr \(-0.0001\) must be > 0"),
    ("trainer.weight_decay=-0.1", r"trainer.weight_decay \(-0.1\) must be >= 0"),
    ("run.collapse_patience=-1", r"run.collapse_patience \(-1\) must be >= 0"),
    ("trainer.betas=[0.9,1.5]", r"trainer.betas \(\[0.9, 1.5\]\) must be two numbers in \[0, 1\)"),
    ("run.mode=fast", r"run.mode \('fast'\) must be one of 'sync', 'async'"),
    ("run.lag_policy=keep", r"run.lag_policy \('keep'\) must be one of"),
    ("trainer.max_tokens_per_micro_batch=0", r"max_tokens_per_micro_batch \(0\) must be > 0"),
    ("trainer.lora.r=0", r"trainer.lora.r \(0\) must be > 0"),
    ("trainer.lora.dropout=1.0", r"trainer.lora.dropout \(1.0\) must be in \[0, 1\)"),
    ("trainer.lora.target_modules=[]", r"trainer.lora.target_modules is empty"),
]


@pytest.mark.parametrize(("override", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_trainer_value_is_one_line_at_load_time(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        load_config(TrainConfig, None, [override])
    assert "\n" not in str(err.value)


def test_good_values_load() -> None:
    cfg = load_config(
        TrainConfig, None, ["trainer.lora.r=4", "trainer.betas=[0.9,0.95]", "run.mode=async"]
    )
    assert cfg.trainer.lora is not None and cfg.trainer.lora.r == 4
    assert tuple(cfg.trainer.betas) == (0.9, 0.95) and cfg.run.mode == "async"


MOVED = {
    "mode": "async",
    "max_groups_in_flight": 16,
    "max_policy_lag": 2,
    "lag_policy": "reweight",
    "hold_timeout_s": 5.0,
    "processes": 1,
    "collapse_patience": 3,
}


def _notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tether.configio"]


def test_old_trainer_keys_load_as_run_keys_with_one_notice_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "config.yaml"
    path.write_text("trainer:\n  lr: 0.001\n  mode: async\n  collapse_patience: 3\n")
    cfg = load_config(TrainConfig, path, ["trainer.max_policy_lag=2"])
    assert (cfg.run.mode, cfg.run.collapse_patience, cfg.run.max_policy_lag) == ("async", 3, 2)
    assert cfg.trainer.lr == 0.001
    assert sorted(_notices(caplog)) == [
        f"config key trainer.{k} is now run.{k}; please write run.{k}"
        for k in ("collapse_patience", "max_policy_lag", "mode")
    ]
    old = build(TrainConfig, {"trainer": dict(MOVED)})
    assert dump(old) == dump(build(TrainConfig, {"run": dict(MOVED)}))
    assert dump(old)["run"] == MOVED and not set(MOVED) & set(dump(old)["trainer"])


def test_run_keys_load_without_a_notice(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    cfg = load_config(TrainConfig, None, ["run.mode=async", "run.hold_timeout_s=5"])
    assert cfg.run.mode == "async" and cfg.run.hold_timeout_s == 5.0
    assert _notices(caplog) == []


def test_an_old_and_a_new_key_together_is_one_line() -> None:
    with pytest.raises(UserError) as err:
        load_config(TrainConfig, None, ["trainer.mode=async", "run.mode=sync"])
    assert str(err.value) == (
        "override trainer.mode=async: trainer.mode is the old name of run.mode: keep only run.mode"
    )
