"""Training on two processes (``run.processes=2``, torch.distributed over gloo on CPU).

- the token-balanced split of an update's samples (a pure function);
- the 2-process update of a fixed batch gives the 1-process parameters, for every
  aggregation mode (and with TIS over two optimizer steps, and with a rank that
  gets no sample): rank 0 is a subprocess (this file run as a script, see
  :func:`_drive`), which starts rank 1 the way ``run.processes`` does;
- a 2-step 2-process ``tether train`` through the real gateway, whose policy
  version rises;
- SIGKILL to rank 1 mid-run ends the run with one line naming it and a
  checkpoint of the last finished step, which ``--resume`` continues from.

Every process runs with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from tether.store import Store
from tether.trainer.checkpoint import checkpoint_state, latest_checkpoint
from tether.trainer.distributed import shard_by_tokens

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples/calc/config.yaml"
#: Largest |parameter difference| allowed between the 1- and 2-process updates: 1% of one
#: AdamW step at lr 1e-3. The ranks add their fp32 gradients in another order than one
#: process does (losses and gradient norms agree to ~1e-7 relative), and AdamW's first
#: step, lr·g/(|g| + eps), turns that into up to ~3e-6 on weights whose |g| is near eps.
ATOL = 1e-5
#: (case, TrainerConfig fields, how many of the fixed samples). lr 1e-3 moves parameters
#: by ~1e-3 per AdamW step, a hundred times ATOL.
CASES: list[tuple[str, dict[str, Any], int]] = [
    ("token_mean", {"aggregation": "token_mean"}, 7),
    ("seq_mean", {"aggregation": "seq_mean"}, 7),
    ("rollout_mean", {"aggregation": "rollout_mean"}, 7),
    ("seq_mean_token_sum_norm", {"aggregation": "seq_mean_token_sum_norm"}, 7),
    ("tis_two_steps", {"tis_cap": 2.0, "updates_per_batch": 2}, 7),
    ("kl_to_reference", {"kl_coef": 0.1}, 7),
    ("lora", {"lora": "r4"}, 7),
    ("one_sample", {"aggregation": "token_mean"}, 1),  # rank 1 trains nothing, still steps
]
_graded = itertools.count()


def grade_alternately(task: dict, answer: str | None) -> float:
    """0, 1, 0, 1, ... in grading order: every group of 2 has variance, every step updates."""
    return float(next(_graded) % 2)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


# --------------------------------------------------------------------------- the split


def _best_spread(lengths: list[int], world: int) -> int:
    """Slow reference: the smallest possible largest shard, over every assignment."""
    best = sum(lengths)
    for owners in itertools.product(range(world), repeat=len(lengths)):
        totals = [0] * world
        for n, r in zip(lengths, owners, strict=True):
            totals[r] += n
        best = min(best, max(totals))
    return best


def test_shard_by_tokens_splits_every_sample_once_and_balances_tokens() -> None:
    rng = random.Random(0)
    for _ in range(200):
        world = rng.randint(1, 3)
        lengths = [rng.randint(1, 50) for _ in range(rng.randint(0, 7))]
        shards = shard_by_tokens(lengths, world)
        assert len(shards) == world
        assert sorted(i for s in shards for i in s) == list(range(len(lengths)))
        assert all(s == sorted(s) for s in shards)
        largest = max(sum(lengths[i] for i in s) for s in shards)
        # greedy longest-first: within 4/3 of the best split (Graham's bound)
        assert largest <= _best_spread(lengths, world) * 4 / 3 + 1e-9
    assert shard_by_tokens([10, 9, 2, 1], 2) == [[0, 3], [1, 2]]
    with pytest.raises(ValueError, match="world"):
        shard_by_tokens([1], 0)


# --------------------------------------------------------------------------- one update


def _samples(n: int) -> list[Any]:
    """Fixed samples: a shared 24-token prompt (the shared-prefix forward), completions with
    masked tool-result gaps, rollout 0 and 2 cut into two samples each, two temperatures."""
    from tether.trainer import Sample

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 1600, (24,), generator=g).tolist()
    lengths = [40, 33, 27, 21, 18, 12, 9]
    rollouts = [0, 0, 1, 2, 2, 3, 4]
    advantages = [1.0, 1.0, -0.5, 0.8, 0.8, -1.2, 0.3]
    out = []
    for i in range(n):
        extra = torch.randint(5, 1600, (lengths[i],), generator=g).tolist()
        mask = [0] * len(prompt) + [0 if 5 <= k < 9 else 1 for k in range(lengths[i])]
        old = (-torch.rand(len(mask), generator=g) * 3).tolist()
        old = [lp if m else 0.0 for lp, m in zip(old, mask, strict=True)]
        temp = 1.0 if i % 3 else 0.7
        out.append(Sample(prompt + extra, mask, old, advantages[i], rollouts[i], temp))
    return out


def _trainer(model_dir: Path, fields: dict[str, Any], ranks: Any = None) -> Any:
    from tether.models import load_model
    from tether.trainer import LoraConfig, PolicyTrainer, TrainerConfig

    torch.manual_seed(0)
    model = load_model(model_dir, dtype=torch.float32)
    if fields.get("lora"):  # a name in CASES, a LoraConfig here
        fields = {**fields, "lora": LoraConfig(r=4, alpha=8)}
    cfg = TrainerConfig(lr=1e-3, **fields)
    return PolicyTrainer(model, cfg, ranks=ranks)


def _drive(out: Path, model_dir: Path) -> None:
    """Rank 0 of 2: start rank 1 as ``run.processes=2`` does, then each case's update."""
    from tether.run import RankGroup
    from tether.trainer import TrainerConfig

    group = RankGroup.start(2, TrainerConfig(collective_timeout_s=60), "cpu")
    assert group is not None and group.ranks.world == 2
    results = {}
    try:
        for name, fields, n in CASES:
            trainer = _trainer(model_dir, fields, group.ranks)
            group.hello(trainer, model_dir, "float32")
            group.sync(trainer)
            metrics = trainer.update(_samples(n))
            results[name] = {"params": trainer.model.state_dict(), "metrics": metrics}
    finally:
        group.close()
    torch.save(results, out)


def test_two_process_update_equals_the_one_process_update(
    starter_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "two.pt"
    done = subprocess.run(
        [sys.executable, __file__, str(out), str(starter_dir)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    two = torch.load(out, weights_only=True)
    lengths = [len(s) for s in _samples(7)]
    assert all(shard_by_tokens(lengths, 2))  # both ranks train in the 7-sample cases
    for name, fields, n in CASES:
        start = _trainer(starter_dir, fields).model.state_dict()
        trainer = _trainer(starter_dir, fields)
        metrics = trainer.update(_samples(n))
        one = trainer.model.state_dict()
        moved = max((one[k] - start[k]).abs().max().item() for k in one)
        assert moved > 50 * ATOL, name  # the update did something to compare
        for k, v in one.items():
            torch.testing.assert_close(two[name]["params"][k], v, rtol=0, atol=ATOL, msg=name)
        got = two[name]["metrics"]
        assert got["trained_tokens"] == metrics["trained_tokens"], name
        for key in ("loss", "grad_norm", "logprob_gap", "entropy", "clip_frac", "ratio_mean"):
            assert got[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), (name, key)


# --------------------------------------------------------------------------- whole runs


def _args(out: Path, model: Path, steps: int, *more: str) -> list[str]:
    return [
        *(sys.executable, "-m", "tether.cli", "train", str(CONFIG)),
        f"dir={out}",
        f"model.path={model}",
        "tasks.train_size=10",
        "tasks.val_size=2",
        "agent.mode=inprocess",
        "agent.entry=tether.starter.calc:agent",
        "rollout.n=2",
        "rollout.batch_groups=1",  # one group of 2, graded 0 then 1: every step updates
        "rollout.grader=tests.test_distributed:grade_alternately",
        "eval.enabled=false",
        "gateway.default_max_tokens=16",
        "run.collapse_patience=0",
        f"trainer.steps={steps}",
        "run.processes=2",
        "trainer.collective_timeout_s=20",
        "checkpoint.every=0",
        *more,
    ]


def _versions(run_dir: Path) -> list[float]:
    store = Store(run_dir / "traces.sqlite")
    try:
        rows = [
            m for r in store.list_runs() for m in store.metrics(r.id) if m.name == "policy_version"
        ]
    finally:
        store.close()
    return [m.value for m in sorted(rows, key=lambda m: m.step)]


@pytest.mark.slow
def test_a_two_process_run_through_the_gateway_raises_the_policy_version(
    starter_dir: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [*_args(tmp_path, starter_dir, 2), "--log-level", "info"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "started 1 training processes" in done.stderr
    assert _versions(tmp_path / "calc") == [1.0, 2.0]
    assert checkpoint_state(latest_checkpoint(tmp_path / "calc/checkpoints"))["policy_version"] == 2


def _rank_children(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if "tether.run._rank_main" in " ".join(p.cmdline())]


@pytest.mark.slow
def test_killing_a_rank_ends_the_run_with_a_checkpoint_that_resume_continues(
    starter_dir: Path, tmp_path: Path
) -> None:
    args = _args(tmp_path, starter_dir, 3)
    env = {**_env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        for line in proc.stdout:  # until the first update is reported
            lines.append(line)
            if line.startswith("step   1/3"):
                break
        (rank1,) = _rank_children(proc.pid)
        rank1.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        lines += proc.stdout.readlines()
        code = proc.wait(timeout=120)  # bounded: a hang fails here
        waited = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 1, "".join(lines)[-3000:]
    assert len(errors) == 1 and "Traceback" not in "".join(lines), "".join(lines)[-3000:]
    assert "rank 1 was killed by SIGKILL" in errors[0]
    assert "checkpoint of step 1:" in errors[0]
    assert waited < 120
    assert latest_checkpoint(tmp_path / "calc/checkpoints").name == "step-000001"
    assert not _rank_children(proc.pid)

    done = subprocess.run(
        [*args, "--resume"], env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout and "step-000001" in done.stdout
    final = checkpoint_state(latest_checkpoint(tmp_path / "calc/checkpoints"))
    assert final["step"] == 3 and final["policy_version"] == 3


if __name__ == "__main__":
    _drive(Path(sys.argv[1]), Path(sys.argv[2]))
