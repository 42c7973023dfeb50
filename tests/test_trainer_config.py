"""Every size, count and ratio of ``trainer:`` is checked when the config is built: one
line that names the value, the rule and the fix, before anything runs."""

from __future__ import annotations

import pytest

from tether.configio import load_config
from tether.errors import UserError
from tether.run.config import TrainConfig

BAD = [
    ("trainer.steps=0", r"trainer.steps \(0\) must be > 0"),
    ("trainer.lr=-1e-4", r"trainer.lr \(-0.0001\) must be > 0"),
    ("trainer.weight_decay=-0.1", r"trainer.weight_decay \(-0.1\) must be >= 0"),
    ("trainer.collapse_patience=-1", r"trainer.collapse_patience \(-1\) must be >= 0"),
    ("trainer.betas=[0.9,1.5]", r"trainer.betas \(\[0.9, 1.5\]\) must be two numbers in \[0, 1\)"),
    ("trainer.mode=fast", r"trainer.mode \('fast'\) must be one of 'sync', 'async'"),
    ("trainer.lag_policy=keep", r"trainer.lag_policy \('keep'\) must be one of"),
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
        TrainConfig, None, ["trainer.lora.r=4", "trainer.betas=[0.9,0.95]", "trainer.mode=async"]
    )
    assert cfg.trainer.lora is not None and cfg.trainer.lora.r == 4
    assert tuple(cfg.trainer.betas) == (0.9, 0.95) and cfg.trainer.mode == "async"
