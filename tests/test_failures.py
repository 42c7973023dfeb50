"""Agent failures are loud, and "success" is each task's own verdict.

Through the real CLI in a subprocess (real gateway, process runner, SQLite
store): a broken agent stops the run with one line that carries its stderr
tail, ``tether rollouts show`` prints that tail; a half-broken agent gets one
warning per collection and a summary that claims no gain. Then the pieces:
grader results, the success threshold, the warning rules.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TINY_RUN
from tether.engine.testing import NullEngine
from tether.errors import UserError
from tether.records import AttemptEnd, Call, RolloutStatus, Task, usable_reward
from tether.run import RolloutConfig, RolloutOutcome
from tether.run._failures import check_collection
from tether.run._finish import Ended, finish_outcome
from tether.run._grading import is_success, read_grade
from tether.runner import AttemptResult
from tether.trainer.errors import AgentsFailing, TrainerError

ROOT = Path(__file__).resolve().parents[1]
TETHER = [sys.executable, "-m", "tether.cli"]

# Fails like a Node agent without its node_modules: a message on stderr, exit 1.
# With "all" every rollout fails; otherwise only the second of each group.
BROKEN_AGENT = """\
import os, sys
rollout = os.environ["TETHER_ROLLOUT_ID"]
print("starting agent for", rollout)
if sys.argv[1:] == ["all"] or rollout.endswith("-1"):
    sys.stderr.write("Error: Cannot find module 'openai'\\nRequire stack:\\n- /app/agent.js\\n")
    sys.exit(1)
print("7")
"""


def _train(tmp_path: Path, starter_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        *TINY_RUN,
        "agent.mode=process",
        "agent.concurrency=4",
        *extra,
    ]
    return subprocess.run(
        [*TETHER, "train", str(ROOT / "examples/calc/config.yaml"), *overrides],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "300"},
    )


def test_broken_agent_stops_the_run_with_its_stderr_and_show_prints_the_tail(
    starter_dir: Path, tmp_path: Path
) -> None:
    agent = tmp_path / "broken_agent.py"
    agent.write_text(BROKEN_AGENT)
    out = _train(tmp_path, starter_dir, f"agent.command={sys.executable} {agent} all")
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    line = errors[0]
    assert line.startswith("error: all 4 rollouts of the step-0 eval failed; first failure: ")
    assert "agent exited with code 1: " in line
    assert "Error: Cannot find module 'openai' | Require stack: | - /app/agent.js" in line
    assert "held-out success" not in out.stdout  # no summary, no checkpoint
    assert not (tmp_path / "calc" / "checkpoints").exists()

    rollout_id = line.rsplit("(rollout ", 1)[1].rstrip(")")
    shown = subprocess.run(
        [*TETHER, "rollouts", "show", rollout_id, "--store", str(tmp_path / "calc/traces.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "attempt 1: failed  exit code 1" in shown.stdout
    assert "error: agent exited with code 1" in shown.stdout
    assert "| starting agent for " + rollout_id in shown.stdout
    assert "| Error: Cannot find module 'openai'" in shown.stdout
    assert "| - /app/agent.js" in shown.stdout


def test_half_broken_agent_warns_once_per_collection_and_claims_no_gain(
    starter_dir: Path, tmp_path: Path
) -> None:
    agent = tmp_path / "broken_agent.py"
    agent.write_text(BROKEN_AGENT)
    out = _train(tmp_path, starter_dir, f"agent.command={sys.executable} {agent}")
    assert out.returncode == 0, out.stderr[-3000:]
    warnings = [
        line for line in out.stderr.splitlines() if "rollouts failed; first failure" in line
    ]
    # the step-0 eval, step 1, the final eval: one line each, at the default log level
    assert len(warnings) == 3, out.stderr[-3000:]
    assert "WARNING" in warnings[1] and "step 1: 2 of 4 rollouts failed" in warnings[1]
    assert "Cannot find module 'openai'" in warnings[1]
    # every group lost a rollout, so nothing was learned: no gain is claimed
    summary = [line for line in out.stdout.splitlines() if line.startswith("held-out success")]
    assert summary and "(no update happened)" in summary[0] and "points" not in summary[0]


# Half the rollouts answer "7", half "8"; the model is never called (fast).
ANSWERING_AGENT = """\
import os
print("7" if os.environ["TETHER_ROLLOUT_ID"].endswith("-0") else "8")
"""
GRADERS = """\
def flagged(task, answer):
    return {"reward": 0.5, "success": answer == "7"}


def scored(task, answer):
    return 0.5 if answer == "7" else 0.25
"""


@pytest.mark.parametrize(
    ("settings", "mean_reward"),
    [
        (["rollout.grader={g}:flagged"], 0.5),
        (["rollout.grader={g}:scored", "rollout.success_threshold=0.4"], 0.375),
    ],
)
def test_success_is_the_graders_flag_or_the_threshold_in_steps_evals_and_store(
    starter_dir: Path, tmp_path: Path, settings: list[str], mean_reward: float
) -> None:
    """Every reward is > 0, so the old rule would say 100%; the flag or threshold says 50%.
    Beside it each eval reports its mean reward (the held-out signal of a shaped reward)."""
    from tether.store import Store

    agent, graders = tmp_path / "agent.py", tmp_path / "graders.py"
    agent.write_text(ANSWERING_AGENT)
    graders.write_text(GRADERS)
    extra = [x.format(g=graders) for x in settings]
    out = _train(tmp_path, starter_dir, f"agent.command={sys.executable} {agent}", *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "eval @ step 0: sampled success 50%" in out.stdout
    assert "eval @ step 1: sampled success 50%" in out.stdout
    assert f"sampled success 50%, greedy -, mean reward {mean_reward:.3g} (" in out.stdout
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        (run,) = store.list_runs()
        step = {m.name: m.value for m in store.metrics(run.id) if m.step == 1}  # update 1
        assert step["success"] == 0.5 and step["reward_mean"] > 0
        assert step["eval/sampled_reward_mean"] == pytest.approx(mean_reward)
        assert "eval/greedy_reward_mean" not in step  # eval.greedy=false
        flags = {
            r.final_answer: [a.success for a in store.attempts(r.id)]
            for r in store.list_rollouts(run_id=run.id)
        }
    assert flags == {"7": [True], "8": [False]}


# -- grader results and the success rule ------------------------------------------------


def test_grader_may_return_a_reward_or_reward_and_success() -> None:
    assert read_grade(0.6) == (0.6, None, {})
    assert read_grade({"reward": 0.6, "success": False}) == (0.6, False, {})
    assert read_grade({"reward": float("nan"), "success": True}).success is True
    # intermediate rewards by call seq (JSON keys are strings), with or without success
    assert read_grade({"reward": 1.0, "turn_rewards": {"0": 0.5, 2: -1}}) == (
        1.0, None, {0: 0.5, 2: -1},
    )  # fmt: skip
    both = read_grade({"reward": 0.0, "success": True, "turn_rewards": {}})
    assert both == (0.0, True, {})
    for bad in ({"reward": 1.0}, {"reward": 1.0, "success": 1}, {"r": 1, "success": True},
                {"reward": 1.0, "success": True, "extra": 0},
                {"reward": 1.0, "turn_rewards": [0.5]},
                {"reward": 1.0, "turn_rewards": {"first": 0.5}},
                {"reward": 1.0, "turn_rewards": {-1: 0.5}}):  # fmt: skip
        with pytest.raises(UserError, match=r'must return a float \(the reward\) or \{"reward"'):
            read_grade(bad)


@pytest.mark.parametrize(
    ("reward", "flag", "threshold", "expected"),
    [
        (0.6, None, None, True),  # today's rule: reward > 0
        (0.0, None, None, False),
        (-1.0, None, None, False),
        (0.6, False, None, False),  # the grader's flag wins
        (0.0, True, None, True),
        (0.6, None, 0.75, False),  # a threshold: reward >= threshold
        (0.75, None, 0.75, True),
        (0.6, True, 0.75, True),
        (None, True, None, False),  # never without a usable reward
    ],
)
def test_is_success(reward, flag, threshold, expected) -> None:
    assert is_success(reward, flag, threshold) is expected


@pytest.mark.parametrize(
    ("value", "usable"),
    [(0.25, True), (3, True), (10**400, False), (10**5000, False), (float("inf"), False),
     (float("nan"), False), (True, False), ("1.0", False)],
    ids=["float", "int", "huge-int", "huger-int", "inf", "nan", "bool", "str"],
)  # fmt: skip
def test_one_usable_reward_rule_through_the_grader_and_the_store(
    make_gateway: Any, value: Any, usable: bool
) -> None:
    """records.read_reward is the rule; the grader's path and the store's path both follow
    it, and neither raises (10**400 once raised OverflowError, 10**5000 a repr() limit)."""
    assert usable_reward(value) is usable
    gw = make_gateway(NullEngine())
    graded = gw.open_rollout({}, rollout_id="graded")
    done = AttemptResult("graded", graded.attempt, RolloutStatus.SUCCEEDED, final_answer="7")
    ended = Ended(0, Task(id="t", data={}), graded, done)
    out = finish_outcome(gw, gw.store, ended, lambda task, answer: value)
    assert out.usable is usable and gw.store.get_rollout("graded").usable is usable
    assert out.reward == (float(value) if usable else None)
    stored = gw.open_rollout({}, rollout_id="stored")
    row = gw.store.finish_rollout(AttemptEnd("stored", stored.attempt, "succeeded"), reward=value)
    assert row.usable is usable and row.reward == out.reward
    if not usable:
        assert "no usable reward" in (out.error or "") and "reward" in (row.error or "")


def test_success_threshold_is_validated() -> None:
    assert RolloutConfig(success_threshold=0.5).success_threshold == 0.5
    for bad in (float("nan"), float("inf")):
        with pytest.raises(UserError, match=r"rollout\.success_threshold"):
            RolloutConfig(success_threshold=bad)


# -- the warning rules -------------------------------------------------------------------


def _outcome(i: int, ok: bool, tokens: int = 3) -> RolloutOutcome:
    call = Call(f"r{i}", 0, [1], [5] * tokens, [-0.1] * tokens, policy_version=0)
    if ok:
        return RolloutOutcome(f"r{i}", 0, RolloutStatus.SUCCEEDED, 0.0, [call])
    return RolloutOutcome(
        f"r{i}",
        0,
        RolloutStatus.FAILED,
        None,
        [],
        error="agent exited with code 1",
        output_tail="a\n\nb\nc\nImportError: x\n",
    )


def test_check_collection_warns_once_and_stops_only_a_first_total_failure(caplog) -> None:
    assert issubclass(AgentsFailing, TrainerError)
    caplog.set_level(logging.WARNING, "tether.run._failures")
    check_collection(
        [_outcome(0, True), _outcome(1, True), _outcome(2, False)], "step 2", first=True
    )
    assert caplog.records == []  # 1 of 3: below half
    check_collection([_outcome(0, False), _outcome(1, True)], "step 3", first=False)
    (record,) = caplog.records
    assert record.getMessage() == (
        "step 3: 1 of 2 rollouts failed; first failure: agent exited with code 1: "
        "a | b | c | ImportError: x (rollout r0)"
    )
    caplog.clear()
    check_collection([_outcome(0, False), _outcome(1, False)], "step 4", first=False)
    assert len(caplog.records) == 1  # all failed, but not the first collection: a warning
    caplog.clear()
    check_collection(
        [_outcome(0, True, tokens=0), _outcome(1, True, tokens=0)], "step 5", first=False
    )
    assert "generated 0 completion tokens" in caplog.records[0].getMessage()
    with pytest.raises(AgentsFailing, match=r"^all 2 rollouts of the first eval failed; first"):
        check_collection([_outcome(0, False), _outcome(1, False)], "the first eval", first=True)


# -- a grader that raises ------------------------------------------------------------------

# A grader with a typo in the task's key, as a user writes one: KeyError on line 5.
RAISING_GRADER = """\
def _expected(task):
    return task["grader"]


def grade(task, answer):
    return float(str(_expected(task)["answr"]) in (answer or ""))
"""


def test_raising_grader_stops_the_run_with_its_exception_and_show_prints_the_traceback(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Every rollout of step 1 was graded by a grader that raised: the run ends on one line
    naming the exception, the grader's file and line (not "no usable reward"), and the
    store keeps the traceback with each attempt for ``tether rollouts show``."""
    grader = tmp_path / "grader.py"
    grader.write_text(RAISING_GRADER)
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "question": f"1 + {i}", "grader": {"answer": 1 + i}} for i in range(4)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _train(
        tmp_path,
        starter_dir,
        f"agent.command={sys.executable} -c print(7)",
        f"rollout.grader={grader}:grade",
        f"tasks.source={tasks}",
        "eval.enabled=false",
    )
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith(
        "error: the grader raised KeyError: 'answr' (grader.py:6 in grade) on every rollout "
        "of step 1; fix the grader (tether rollouts show "
    ), errors[0]
    assert "no usable reward" not in out.stderr
    assert out.stderr.count("grader raised") == 1  # no warning per rollout

    rollout_id = errors[0].split("tether rollouts show ", 1)[1].split(" ", 1)[0]
    shown = subprocess.run(
        [*TETHER, "rollouts", "show", rollout_id, "--store", str(tmp_path / "calc/traces.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "error: the grader raised KeyError: 'answr' (grader.py:6 in grade)" in shown.stdout
    assert "grader raised:" in shown.stdout
    assert f'File "{grader}", line 6, in grade' in shown.stdout
    assert 'return float(str(_expected(task)["answr"]) in (answer or ""))' in shown.stdout
    assert not any(f in shown.stdout for f in ("_collect.py", "_finish.py", "_grading.py"))


def test_grader_fault_names_the_last_frame_in_the_graders_own_file(tmp_path: Path) -> None:
    from tether.run._grading import call_grader, load_grader

    (tmp_path / "g.py").write_text(
        "import json\n\ndef grade(task, answer):\n    return json.loads(answer)\n"
    )
    grade = load_grader(f"{tmp_path / 'g.py'}:grade")
    got, fault = call_grader(grade, {}, "not json")
    assert (got.reward, got.success) == (None, None) and fault is not None
    # the exception is raised inside json, but the place named is the grader's own line
    assert fault.summary.startswith("JSONDecodeError: Expecting value") or fault.summary.startswith(
        "json.decoder.JSONDecodeError: Expecting value"
    ), fault.summary
    assert fault.summary.endswith("(g.py:4 in grade)")
    assert fault.detail.splitlines()[0] == fault.summary
    assert f'File "{tmp_path / "g.py"}", line 4, in grade' in fault.detail
    assert call_grader(grade, {}, "1.5") == ((1.5, None, {}), None)


def test_check_collection_says_a_raising_grader_once_and_stops_when_it_raised_on_all(
    caplog,
) -> None:
    from tether.trainer.errors import GraderFailing

    def raised(i: int) -> RolloutOutcome:
        return RolloutOutcome(
            f"r{i}",
            0,
            RolloutStatus.SUCCEEDED,
            None,
            error="the grader raised KeyError: 'answr' (grader.py:6 in grade)",
            grader_error="KeyError: 'answr' (grader.py:6 in grade)",
        )

    caplog.set_level(logging.WARNING, "tether.run._failures")
    check_collection([raised(0), _outcome(1, True), _outcome(2, True)], "step 2", first=False)
    (record,) = caplog.records
    assert record.getMessage() == (
        "step 2: the grader raised on 1 of 3 rollouts (unusable, not reward 0): "
        "KeyError: 'answr' (grader.py:6 in grade) (tether rollouts show r0)"
    )
    with pytest.raises(GraderFailing, match=r"^the grader raised KeyError: 'answr' \(grader"):
        check_collection([raised(0), raised(1)], "step 3", first=False)  # any collection
