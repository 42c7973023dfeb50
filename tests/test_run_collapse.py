"""A run whose reward stays at 0 stops after ``run.collapse_patience`` steps, saying
why: a policy that earned reward and lost it collapsed (:class:`PolicyCollapsed`); one
that never earned any never changed, and the grader or the agent is to blame
(:class:`NoLearningSignal`, naming a rollout to look at)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.records import AttemptEnd, Phase, Place, Rollout
from tether.run._diagnostics import check_collapse, first_rollout, no_signal_line
from tether.store import Store
from tether.trainer.errors import NoLearningSignal, PolicyCollapsed

ROOT = Path(__file__).resolve().parents[1]
TETHER = [sys.executable, "-m", "tether.cli"]


def _step(reward: float, zero_var: float = 1.0, version: int = 0) -> dict[str, float]:
    return {"reward_mean": reward, "zero_variance_frac": zero_var, "policy_version": float(version)}


def _check(step: int, steps: list[dict[str, float]], patience: int = 3) -> None:
    check_collapse(step, steps, patience, 2e-4, lambda: "run-s0-g0-0")


def test_reward_zero_from_the_start_is_no_signal_not_a_collapse() -> None:
    with pytest.raises(NoLearningSignal) as caught:
        _check(3, [_step(0.0) for _ in range(3)])
    assert str(caught.value) == (
        "every group's rewards are equal (all 0) for 3 steps, so no update changed the "
        "policy (still v0): nothing to learn from — check the grader and the agent: first "
        "rollout run-s0-g0-0 (`tether rollouts show run-s0-g0-0`); run.collapse_patience=0 "
        "trains on regardless"
    )
    assert "lr" not in str(caught.value) and "collapsed" not in str(caught.value)
    _check(2, [_step(0.0) for _ in range(2)])  # not yet patience steps
    _check(3, [_step(0.0) for _ in range(3)], patience=0)  # 0: never


def test_reward_lost_after_gains_is_a_collapse() -> None:
    history = [_step(0.5, 0.2, 1), _step(0.25, 0.5, 2)]
    history += [_step(0.0, 1.0, 3) for _ in range(2, 5)]
    with pytest.raises(PolicyCollapsed, match=r"at step 5, after steps with reward: the policy"):
        _check(5, history)
    _check(4, history[:-1])  # 2 zero steps: not yet


def test_no_signal_line_of_a_varying_but_never_positive_reward() -> None:
    steps = [
        {"reward_mean": -0.5, "zero_variance_frac": 0.5, "policy_version": float(v)} for v in (1, 2)
    ]
    line = no_signal_line(steps, None)
    assert line.startswith("the reward has stayed at or below 0 since the first step (2 steps)")
    assert "first rollout" not in line and "no update changed" not in line


def test_the_rollout_named_is_a_train_one_even_when_the_run_name_holds_eval(
    tmp_path: Path,
) -> None:
    """A run named "calc-eval" (every id holds "-eval"): the first train rollout is named,
    not the eval's that finished before it; its phase is stored, not read from its id."""
    with Store(tmp_path / "s.db") as store:
        store.create_run({}, run_id="calc-eval-1")
        places = {
            "calc-eval-1-eval0-s-g0-0": Place(Phase.EVAL, 0, 0, 0),
            "calc-eval-1-s1-g0-0": Place(Phase.TRAIN, 1, 0, 0),
        }
        assert first_rollout(store, "calc-eval-1") is None  # nothing finished yet
        for rid, place in places.items():
            store.create_rollout(Rollout(id=rid, run_id="calc-eval-1", place=place))
            store.finish_rollout(AttemptEnd(rid, store.start_attempt(rid), "succeeded"), reward=0.0)
        assert first_rollout(store, "calc-eval-1") == "calc-eval-1-s1-g0-0"
        store.create_run({}, run_id="only-evals")
        store.create_rollout(Rollout(id="e", run_id="only-evals", place=Place(Phase.EVAL, 0)))
        store.finish_rollout(AttemptEnd("e", store.start_attempt("e"), "succeeded"), reward=0.0)
        assert first_rollout(store, "only-evals") == "e"  # no train rollout: the eval's


def test_a_run_whose_grader_always_gives_0_stops_naming_a_rollout(
    starter_dir: Path, tmp_path: Path
) -> None:
    """The new user's run: the agent never answers right, every reward is 0, v0 throughout."""
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        "tasks.train_size=8",
        "rollout.n=2",
        "rollout.batch_groups=2",
        "trainer.steps=4",
        "run.collapse_patience=2",
        "eval.enabled=false",
        "checkpoint.every=0",
        "agent.mode=process",
        f"agent.command={sys.executable} -c print('no')",
    ]
    out = subprocess.run(
        [*TETHER, "train", str(ROOT / "examples/calc/config.yaml"), *overrides],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert out.returncode == 1, out.stderr[-3000:]
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith(
        "error: every group's rewards are equal (all 0) for 2 steps, so no update changed "
        "the policy (still v0): nothing to learn from — check the grader and the agent: "
        "first rollout calc-"
    ), line
    assert "-s1-g0-0 (`tether rollouts show calc-" in line
    assert "collapsed" not in line and "trainer.lr" not in line
