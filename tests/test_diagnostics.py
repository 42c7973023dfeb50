"""Per-step learning diagnostics: batch statistics from known samples, and the step line."""

from __future__ import annotations

import io
import math

import pytest
import torch
from rich.console import Console

from tether.cli._progress import Progress
from tether.records import Call
from tether.run import EvalProgress, EvalStart, StepDone, StepReport, batch_diagnostics
from tether.trainer.algorithms import compute_advantages
from tether.trainer.samples import build_samples


def _call(rid: str, seq: int, prompt: list[int], n: int) -> Call:
    return Call(rid, seq, prompt, list(range(50, 50 + n)), [-0.5] * n, 0)


def test_batch_diagnostics_of_a_known_batch() -> None:
    """Two groups of two: one with a reward spread, one where both rollouts scored 1."""
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    adv = compute_advantages(rewards, "dr_grpo")  # r − group mean: +0.5, −0.5, 0, 0
    rollouts = [
        [_call("a", 0, [1, 2], 3), _call("a", 1, [1, 2, 50, 51, 52, 7], 2)],  # merged: 5 tokens
        [_call("b", 0, [1, 2], 1)],
        [_call("c", 0, [1, 3], 4)],
        [],  # a rollout whose calls all failed: 0 tokens
    ]
    samples, _ = build_samples(rollouts, adv.advantages.flatten().tolist())
    got = batch_diagnostics(samples, len(rollouts), adv.num_groups, adv.zero_variance_groups)
    assert got["zero_variance_frac"] == 0.5
    # per token: 5 × +0.5, 1 × −0.5, 4 × 0 → mean 0.2, population std by hand
    values = [0.5] * 5 + [-0.5] + [0.0] * 4
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    assert got["adv_mean"] == pytest.approx(0.2) and got["adv_mean"] == pytest.approx(mean)
    assert got["adv_std"] == pytest.approx(std)
    assert got["response_len_mean"] == pytest.approx((5 + 1 + 4 + 0) / 4)
    assert got["response_len_max"] == 5.0
    empty = batch_diagnostics([], 0, 0, 0)
    assert empty == dict.fromkeys(empty, 0.0)


def _line(metrics: dict[str, float], step: int = 11, total: int = 40) -> str:
    console = Console(file=io.StringIO(), width=300)
    Progress(total, console=console, live=False)(StepDone(StepReport(step, metrics)))
    return console.file.getvalue().rstrip("\n")


STEP = {
    "reward_mean": 0.375,
    "success": 0.375,
    "gen_tokens_per_s": 1600.0,
    "logprob_gap": 5e-7,
    "policy_version": 148.0,
    "step_s": 2.6,
    "groups_dropped": 0.0,
}


def test_step_line_shows_entropy_and_zero_variance_share() -> None:
    line = _line({**STEP, "entropy": 0.4213, "zero_variance_frac": 3 / 8}, step=147, total=150)
    assert "  H 0.42  zero-var 38%  " in line
    assert len(line) <= 122, line  # the README's widest real step line plus the two fields
    # a step without an update (every group had equal rewards) has no entropy
    line = _line({**STEP, "zero_variance_frac": 1.0})
    assert "  H -  zero-var 100%  " in line


def test_live_table_has_the_new_columns() -> None:
    console = Console(file=io.StringIO(), width=200)
    progress = Progress(4, console=console, live=False)
    progress(StepDone(StepReport(1, {**STEP, "entropy": 1.25, "zero_variance_frac": 0.25})))
    console.print(progress._render())
    text = console.file.getvalue()
    assert "entropy" in text and "zero-var" in text and "1.25" in text and "25%" in text


def test_eval_progress_says_the_share_done() -> None:
    """6 rollouts: the first quarter is passed at 2 done, which is 33%, not "25%"; a tick
    passing several quarters prints once."""
    console = Console(file=io.StringIO(), width=200)
    progress = Progress(1, console=console, live=False)
    for n in (6, 2):
        progress(EvalStart(step=0, rollouts=n, what="2 tasks"))
        for _ in range(n):
            progress(EvalProgress())
    lines = [ln.split(",")[0] for ln in console.file.getvalue().splitlines() if "eval:" in ln]
    assert lines == [
        "  eval: 2/6 rollouts (33%)", "  eval: 3/6 rollouts (50%)", "  eval: 5/6 rollouts (83%)",
        "  eval: 1/2 rollouts (50%)", "  eval: 2/2 rollouts (100%)",
    ]  # fmt: skip


def test_step_line_shows_the_groups_kept_and_flat_with_filter_groups() -> None:
    line = _line({**STEP, "groups_kept": 8.0, "groups_no_signal": 5.0, "rollouts_extra": 16.0})
    assert "  zero-var -  groups 8 kept 5 flat +16 rollouts  gen 1600 tok/s  " in line
    assert "groups" not in _line(STEP)  # without rollout.filter_groups: as before
