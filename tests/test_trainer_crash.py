"""A trainer killed with SIGKILL resumes exactly as if it had never stopped (SECURITY.md, case 11).

The real :class:`TrainingRun` runs in a subprocess: this file run as a script
(see :func:`_drive`), on the starter model, with the in-process calc agent,
2 groups x 2 rollouts, 3 steps and a checkpoint after every step. Three runs
start together: one left alone, one killed from outside while its step-1
update is in progress, and one that kills itself while it writes the step-2
checkpoint (the driver wraps ``os.replace`` to die right before the rename). Both
killed runs are then resumed with ``resume``; their final checkpoints must
hold the same parameters, optimizer state and RNG states, bit for bit, and
every step must have trained the same tasks on the same tokens.

Why the run gets its own engine: the gateway gives every unseeded call a seed
derived from the run's seed and the rollout (tested below), so the sampled
tokens do not depend on arrival order. The default engine's *logprobs* still
move in the last bits with the composition of a batch (left padding, and the
prefix cache hit or missed), which changes the update by ~1e-5 after 3 steps.
The driver therefore serves with a TransformersEngine that decodes one row at
a time without prefix cache (``TrainingRun(engine=...)``): the same model and
sampler, deterministic on CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.trainer.checkpoint import latest_checkpoint

HOLD_ENV = "TETHER_TEST_HOLD_IN_UPDATE"  # the driver waits after this step's update
KILL_ENV = "TETHER_TEST_KILL_IN_CHECKPOINT"  # the driver dies renaming this step's checkpoint
STEPS = 3
_graded = itertools.count()


def grade_alternately(task: dict, answer: str | None) -> float:
    """Rewards 0, 1, 0, 1, ... in grading order: every group of 2 has variance, in every process."""
    return float(next(_graded) % 2)


def _config(out: Path, model: Path, resume: bool) -> Any:
    from tether.run import (
        CheckpointConfig,
        EvalConfig,
        RolloutConfig,
        TasksConfig,
        TrainConfig,
        TrainerConfig,
    )
    from tether.runner import RunnerConfig

    cfg = TrainConfig(
        name="crash",
        dir=str(out),
        tasks=TasksConfig(source="calc", train_size=20, val_size=2, seed=3),
        agent=RunnerConfig(
            mode="inprocess", entry="tether.starter.calc:agent", concurrency=4, timeout_s=60
        ),
        rollout=RolloutConfig(n=2, batch_groups=2, grader="__main__:grade_alternately"),
        trainer=TrainerConfig(steps=STEPS, lr=1e-3, seed=5),
        eval=EvalConfig(tasks=1, samples=2, greedy=False),
        checkpoint=CheckpointConfig(every=1, keep=STEPS + 1),
        resume=resume,
    )
    cfg.model.path = str(model)
    return cfg


def _drive(out: Path, model: Path, resume: bool) -> None:
    """The subprocess: one real training run (resumed from its latest checkpoint with ``resume``)."""
    from tether.engine import TransformersEngine
    from tether.models import load_model, load_tokenizer
    from tether.run import TrainingRun

    torch.set_num_threads(1)
    cfg = _config(out, model, resume)
    engine = TransformersEngine(
        load_model(model, dtype=torch.float32),
        load_tokenizer(model),
        max_batch_size=1,
        prefix_cache_tokens=0,
        seed=cfg.trainer.seed,
    )
    hold = os.environ.get(HOLD_ENV)
    if os.environ.get(KILL_ENV):
        _die_renaming(f"step-{int(os.environ[KILL_ENV]):06d}")

    async def main() -> None:
        async with TrainingRun(cfg, model_path=model, engine=engine) as run:
            update = run.trainer.update

            def update_and_mark(samples: list) -> dict[str, float]:
                step = run.step  # the update in progress
                # Stand-ins for dropout or data augmentation, so that a resume that
                # did not restore the RNG states ends in other states than a clean run.
                torch.rand(())
                random.random()
                (out / f"in-update-{step}").touch()
                metrics = update(samples)
                if hold == str(step):
                    time.sleep(120)  # the test kills the process here: updated, not yet saved
                return metrics

            run.trainer.update = update_and_mark
            await run.train()

    asyncio.run(main())


def _die_renaming(name: str) -> None:
    """SIGKILL this process when checkpoint ``name`` is about to be renamed into place.

    ``save_checkpoint`` writes and fsyncs a ``{name}.tmp-*`` folder, then
    ``os.replace``s it to ``name``: the kill lands after every file is on disk
    and before the rename, the worst moment for a crash.
    """
    replace = os.replace

    def replace_or_die(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if Path(dst).name == name and ".tmp-" in Path(src).name:
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst, *args, **kwargs)

    os.replace = replace_or_die


# -- the test ----------------------------------------------------------------------


def _start(out: Path, model: Path, resume: bool = False, **env: str) -> subprocess.Popen:
    args = [sys.executable, __file__, str(out), str(model), "resume" if resume else "fresh"]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), **env}
    return subprocess.Popen(args, cwd=root, env=env, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> int:
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(f"the training process failed ({proc.returncode}):\n{err[-3000:]}")
    return proc.returncode


def _equal(a: Any, b: Any) -> bool:
    """Exact equality of nested checkpoint state (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _trained(out: Path) -> dict[int, list[tuple]]:
    """Per step, what was trained: (group id within the run, task id, completion ids, logprobs).

    A step that a killed run started and a resumed run redid counts as the resumed run's.
    """
    from tether.store import Store

    steps: dict[int, list[tuple]] = {}
    with Store(out / "crash" / "traces.sqlite") as store:
        for run in store.list_runs():
            mine: dict[int, list[tuple]] = {}
            for r in store.list_rollouts(run_id=run.id):
                name = r.id.removeprefix(f"{run.id}-")
                if not name.startswith("s") or r.finished_at is None:
                    continue  # eval rollouts, and rollouts a kill cut short
                calls = store.calls(r.id)
                step = int(name[1:].split("-")[0])
                ids = tuple(tuple(c.completion_ids) for c in calls)
                mine.setdefault(step, []).append(
                    (name, r.task_id, ids, [c.logprobs for c in calls])
                )
            steps.update({k: sorted(v) for k, v in mine.items()})
    return steps


@pytest.mark.slow
def test_sigkill_mid_step_and_mid_checkpoint_resume_bit_identical(
    starter_dir: Path, tmp_path: Path
) -> None:
    clean, mid_step, mid_ckpt = (tmp_path / n for n in ("clean", "mid-step", "mid-ckpt"))
    for d in (clean, mid_step, mid_ckpt):
        d.mkdir()
    procs = [
        _start(clean, starter_dir),
        _start(mid_step, starter_dir, **{HOLD_ENV: "2"}),
        _start(mid_ckpt, starter_dir, **{KILL_ENV: "2"}),
    ]
    deadline = time.monotonic() + 240
    while not (mid_step / "in-update-2").exists():
        assert procs[1].poll() is None, "the run to kill ended before its step-2 update"
        assert time.monotonic() < deadline, "no step-2 update within 240 s"
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGKILL)
    assert [_finish(p) for p in procs] == [0, -signal.SIGKILL, -signal.SIGKILL]

    ckpts = {d: d / "crash" / "checkpoints" for d in (clean, mid_step, mid_ckpt)}
    # Killed mid-step: step 2's update was lost with the process; step-1 is its last checkpoint.
    assert latest_checkpoint(ckpts[mid_step]).name == "step-000001"
    # Killed before the rename: the complete step-2 files sit under a temporary name, ignored.
    assert latest_checkpoint(ckpts[mid_ckpt]).name == "step-000001"
    (tmp_2,) = [p for p in ckpts[mid_ckpt].iterdir() if p.name.startswith("step-000002.tmp-")]
    assert (tmp_2 / "trainer.pt").is_file()

    resumed = [_start(d, starter_dir, resume=True) for d in (mid_step, mid_ckpt)]
    assert [_finish(p) for p in resumed] == [0, 0]

    final = {
        d: torch.load(c / f"step-{STEPS:06d}" / "trainer.pt", weights_only=True)
        for d, c in ckpts.items()
    }
    first = torch.load(ckpts[clean] / "step-000001" / "trainer.pt", weights_only=True)
    assert not _equal(first["model"], final[clean]["model"]), "later steps changed nothing"
    for d in (mid_step, mid_ckpt):
        assert not any(".tmp-" in p.name for p in ckpts[d].iterdir())
        for part in ("model", "optimizer", "torch_rng", "python_rng", "step"):
            assert _equal(final[clean][part], final[d][part]), f"{d.name}: {part} differs"
    order = _trained(clean)
    assert sorted(order) == list(range(1, STEPS + 1))
    assert all(len(order[s]) == 4 for s in order)
    assert _trained(mid_step) == order
    assert _trained(mid_ckpt) == order


# -- the derived seeds that make rollouts reproducible ---------------------------------


def test_unseeded_calls_get_seeds_from_run_seed_rollout_attempt_and_seq(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    import openai

    from tether.engine import TransformersEngine
    from tether.gateway import BackgroundServer, Gateway, GatewayConfig, create_app
    from tether.models import load_model
    from tether.store import Store

    engine = TransformersEngine(load_model(starter_dir), tokenizer, seed=0)
    messages = [{"role": "user", "content": "What is 12 * 7?"}]

    def sample(seed: int, run: str, names: list[str], calls: int = 2) -> dict[str, list[str]]:
        """Open rollouts ``{run}-{name}`` in a fresh store; ``calls`` identical calls each."""
        with Store(tmp_path / f"{seed}-{run}.sqlite") as store:
            store.create_run({}, run_id=run)
            gw = Gateway(engine, tokenizer, store, GatewayConfig(admin_key="k" * 24), seed=seed)
            out: dict[str, list[str]] = {}
            with BackgroundServer(create_app(gw)) as server:
                gw.config.public_url = server.url
                for name in names:
                    o = gw.open_rollout({}, rollout_id=f"{run}-{name}", run_id=run)
                    client = openai.OpenAI(base_url=o.base_url, api_key=o.token, max_retries=0)
                    out[name] = [
                        client.chat.completions.create(
                            model="policy", messages=messages, max_tokens=12, temperature=1.0
                        )
                        .choices[0]
                        .message.content
                        for _ in range(calls)
                    ]
                    assert [c.seq for c in store.calls(o.rollout_id)] == list(range(calls))
            return out

    try:
        first = sample(7, "run-a", ["x", "y"])
        again = sample(7, "run-b", ["y", "x"])  # another run id, another order
        other_seed = sample(8, "run-a", ["x"])
    finally:
        asyncio.run(engine.close())
    assert first["x"] != first["y"]  # same request, another rollout: other samples
    assert first["x"][0] != first["x"][1]  # same rollout, next seq: other samples
    assert again == first  # same run seed, rollout name, attempt and seq: same samples
    assert other_seed["x"] != first["x"]


if __name__ == "__main__":
    _drive(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "resume")
