"""One training step of the structured-output agent (examples/frameworks/structured).

``tether train`` on the example's config, shrunk: the agent runs unchanged in
warm worker processes against the starter model; every one of its calls is
constrained (a forced calculator call, then a Pydantic answer) and marked so
in the store. The trainer's self-check compares the engine's recorded
logprobs with its own recomputation of the same tokens: ≈0, because what is
recorded is the unconstrained model's logprob (docs/structured-outputs.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tether.store import Store

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/frameworks/structured/config.yaml"


def test_one_training_step_of_the_structured_agent(starter_dir: Path, tmp_path: Path) -> None:
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        "tasks.train_size=4",
        "tasks.val_size=1",
        "agent.concurrency=2",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "rollout.grader=tests.helpers:alternating_grader",
        "trainer.steps=1",
        "eval.tasks=1",
        "eval.samples=1",
        "checkpoint.every=0",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "train", str(CONFIG), *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with Store(tmp_path / "calc-structured" / "traces.sqlite") as store:
        (run,) = store.list_runs()
        rollouts = store.list_rollouts(run_id=run.id)
        assert len(rollouts) >= 2
        for r in rollouts:  # every answer parsed into the agent's Pydantic model
            assert r.status.value == "succeeded" and r.final_answer.startswith("The answer is ")
            labels = [c.constraint for c in store.calls(r.id)]
            assert labels == ["tool_choice:calculator", "json_schema:Answer"], (r.id, labels)
        (gap,) = store.metrics(run.id, "logprob_gap")
        (gap_max,) = store.metrics(run.id, "logprob_gap_max")
    shown = subprocess.run(
        [sys.executable, "-m", "tether.cli", "rollouts", "show", rollouts[0].id, "--store",
         str(tmp_path / "calc-structured" / "traces.sqlite")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "constrained: tool_choice:calculator" in shown.stdout
    assert "constrained: json_schema:Answer" in shown.stdout
    print(f"logprob_gap {gap.value:.3g} max {gap_max.value:.3g}")
    assert 0 <= gap.value < 1e-4 and gap_max.value < 1e-3, (gap.value, gap_max.value)
