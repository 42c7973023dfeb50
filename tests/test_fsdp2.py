"""``trainer.strategy: fsdp2``: the policy sharded over 2 and 4 processes (gloo, CPU).

- one update of the fixed batch of ``test_distributed.py`` (every aggregation mode, TIS
  over two optimizer steps, a KL reference, LoRA, a rank with no sample, and the chunked
  head with gradient checkpointing) gives the one-process weights, gathered on rank 0
  exactly as the engine gets them (LoRA merged);
- a sharded checkpoint written at 2 processes and resumed at 4 gives the same next update
  as the unbroken run, and its ``model/`` folder is the gathered model;
- a ``tether train`` with ``trainer.strategy=fsdp2 run.processes=2`` through the real
  gateway: policy versions rise, the engine's logprobs match the trainer's, and
  ``--resume`` continues it under 4 processes.

Rank 0 is a subprocess (this file run as a module, see the bottom), which starts the
other ranks as ``run.processes`` does. Every process runs with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.test_distributed import (
    ATOL,
    CASES,
    ROOT,
    _args,
    _env,
    _rank_children,
    _samples,
    _trainer,
)
from tether.errors import UserError
from tether.store import Store
from tether.trainer.checkpoint import checkpoint_state, latest_checkpoint

#: The update's cases: test_distributed's, plus the memory-lean forward.
FSDP_CASES = [
    *CASES,
    ("chunked_head_checkpointing", {"logprob_chunk_tokens": 16, "gradient_checkpointing": True}, 7),
]
#: ||sharded update − one-process update|| / ||one-process update||, over all weights.
REL = 1e-5


def _sharded(fields: dict[str, Any]) -> dict[str, Any]:
    return {**fields, "strategy": "fsdp2"}


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_fsdp2", *args],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


# --------------------------------------------------------------------------- one update


def _drive_update(out: Path, model_dir: Path, world: int) -> None:
    """Rank 0 of ``world``: each case's sharded update, and the weights rank 0 gathers."""
    from tether.run import RankGroup
    from tether.trainer import TrainerConfig

    config = TrainerConfig(collective_timeout_s=60, strategy="fsdp2")  # 1: a group of one
    group = RankGroup.start(world, config, "cpu")
    assert group is not None and group.ranks.world == world
    results = {}
    try:
        for name, fields, n in FSDP_CASES:
            trainer = _trainer(model_dir, _sharded(fields), group.ranks)
            assert trainer.root is not None and not trainer.can_share_weights()
            group.hello(trainer, model_dir, "float32")
            group.sync(trainer)
            metrics = trainer.update(_samples(n))
            results[name] = {"weights": trainer.state_dict(), "metrics": metrics}
    finally:
        group.close()
    torch.save(results, out)


def _update_norm(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(sum(((a[k] - b[k]).double() ** 2).sum() for k in a) ** 0.5)


@pytest.mark.parametrize(
    "world", [2, pytest.param(1, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
def test_sharded_update_equals_the_one_process_update(
    starter_dir: Path, tmp_path: Path, world: int
) -> None:
    out = tmp_path / "sharded.pt"
    _run("update", str(out), str(starter_dir), str(world))
    sharded = torch.load(out, weights_only=True)
    for name, fields, n in FSDP_CASES:
        start = _trainer(starter_dir, fields).state_dict()
        trainer = _trainer(starter_dir, fields)
        metrics = trainer.update(_samples(n))
        one, got = trainer.state_dict(), sharded[name]["weights"]
        assert set(got) == set(one), name  # the engine's names, LoRA merged
        moved = _update_norm(one, start)
        assert moved > 0, name
        assert _update_norm(got, one) <= REL * moved, name
        for k, v in one.items():
            torch.testing.assert_close(got[k], v, rtol=0, atol=ATOL, msg=name)
        m = sharded[name]["metrics"]
        assert m["trained_tokens"] == metrics["trained_tokens"], name
        for key in ("loss", "grad_norm", "logprob_gap", "entropy", "clip_frac", "ratio_mean"):
            assert m[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), (name, key)


# --------------------------------------------------------------------------- checkpoints


def _drive_checkpoint(out: Path, model_dir: Path, world: int, phase: str, lora: str) -> None:
    """Rank 0 of ``world``. ``save``: update on the first 4 samples, checkpoint, then update
    on the last 4; ``resume``: load that checkpoint, then the same second update."""
    from tether.models import load_tokenizer
    from tether.run import RankGroup
    from tether.trainer import TrainerConfig
    from tether.trainer.checkpoint import load_checkpoint, save_checkpoint

    fields = _sharded({"lora": "r4"} if lora == "lora" else {})
    samples = _samples(7)
    group = RankGroup.start(world, TrainerConfig(collective_timeout_s=60), "cpu")
    assert group is not None
    try:
        trainer = _trainer(model_dir, fields, group.ranks)
        group.hello(trainer, model_dir, "float32")
        group.sync(trainer)
        if phase == "save":
            trainer.update(samples[:4])
            torch.save(trainer.state_dict(), out / "saved.pt")
            tokenizer = load_tokenizer(model_dir)
            folder = out / "checkpoints"
            save_checkpoint(
                folder, 1, trainer=trainer, tokenizer=tokenizer, base_model_dir=model_dir,
                config={}, run="r",
            )  # fmt: skip
        else:
            assert load_checkpoint(out / "checkpoints/step-000001", trainer) == 1
        trainer.update(samples[3:])
        torch.save(trainer.state_dict(), out / f"{phase}.pt")
    finally:
        group.close()


@pytest.mark.slow
@pytest.mark.parametrize("lora", ["full", "lora"])
def test_a_checkpoint_saved_at_two_processes_resumes_at_four(
    starter_dir: Path, tmp_path: Path, lora: str
) -> None:
    from tether.models import load_model

    _run("checkpoint", str(tmp_path), str(starter_dir), "2", "save", lora)
    folder = tmp_path / "checkpoints/step-000001"
    assert {p.name for p in folder.iterdir()} >= {"model", "sharded", "trainer.pt", "state.json"}
    saved = torch.load(tmp_path / "saved.pt", weights_only=True)
    written = load_model(folder / "model", dtype=torch.float32).state_dict()
    for k, v in written.items():  # model/: the gathered model, LoRA merged
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0, msg=k)

    _run("checkpoint", str(tmp_path), str(starter_dir), "4", "resume", lora)
    unbroken = torch.load(tmp_path / "save.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resume.pt", weights_only=True)
    assert _update_norm(unbroken, saved) > 0
    for k, v in unbroken.items():
        torch.testing.assert_close(resumed[k], v, rtol=0, atol=ATOL, msg=k)


def test_a_sharded_checkpoint_is_refused_by_a_replicated_trainer_with_the_fix(
    starter_dir: Path, tmp_path: Path
) -> None:
    from tether.trainer.checkpoint import load_checkpoint

    folder = tmp_path / "step-000003"
    (folder / "sharded").mkdir(parents=True)
    torch.save({"step": 3, "torch_rng": torch.get_rng_state()}, folder / "trainer.pt")
    trainer = _trainer(starter_dir, {})
    with pytest.raises(UserError, match=r"trainer\.strategy=fsdp2 and run\.processes >= 2"):
        load_checkpoint(folder, trainer)


def test_merged_weights_from_a_state_dict_equal_peft_merging_a_copy(starter_dir: Path) -> None:
    """What the trainer pushes and checkpoints with LoRA (merged tensor by tensor, from its
    own weights or from shards gathered on rank 0) is peft's merge of a copy."""
    import copy

    from tether._hf import merged_weights

    trainer = _trainer(starter_dir, {"lora": "r4"})
    trainer.update(_samples(7))  # B != 0: the merge changes the weights
    by_peft = copy.deepcopy(trainer.model).merge_and_unload().state_dict()
    by_hand = merged_weights(trainer.model, trainer.model.state_dict())
    assert set(by_hand) == set(by_peft)
    changed = [k for k in by_peft if "q_proj.weight" in k]
    base = _trainer(starter_dir, {}).state_dict()
    assert changed and any(not torch.equal(by_peft[k], base[k]) for k in changed)
    for k, v in by_peft.items():
        torch.testing.assert_close(by_hand[k], v, rtol=1e-6, atol=1e-7, msg=k)


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"strategy": "zero3"}, "must be 'replicate' or 'fsdp2'"),
        ({"offload": True}, "trainer.offload needs trainer.strategy=fsdp2"),
    ],
)
def test_strategy_settings_are_checked_with_the_fix(fields: dict[str, Any], needle: str) -> None:
    from tether.trainer import TrainerConfig

    with pytest.raises(UserError, match=needle):
        TrainerConfig(**fields)


# --------------------------------------------------------------------------- a whole run


def _metric(run_dir: Path, name: str) -> list[float]:
    store = Store(run_dir / "traces.sqlite")
    try:
        rows = [m for r in store.list_runs() for m in store.metrics(r.id) if m.name == name]
    finally:
        store.close()
    return [m.value for m in sorted(rows, key=lambda m: m.step)]


@pytest.mark.slow
def test_a_sharded_run_through_the_gateway_and_its_resume_at_four_processes(
    starter_dir: Path, tmp_path: Path
) -> None:
    args = _args(tmp_path, starter_dir, 2, "trainer.strategy=fsdp2", "checkpoint.every=1")
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "calc"
    assert _metric(run_dir, "policy_version") == [1.0, 2.0]
    gaps = _metric(run_dir, "logprob_gap")
    assert gaps and max(gaps) < 1e-5  # the engine decodes with the gathered weights
    last = latest_checkpoint(run_dir / "checkpoints")
    assert last is not None and (last / "sharded").is_dir()

    more = [a.replace("trainer.steps=2", "trainer.steps=3") for a in args]
    more = [a.replace("run.processes=2", "run.processes=4") for a in more]
    done = subprocess.run(
        [*more, "--resume"], env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step-000002" in done.stdout
    last = latest_checkpoint(run_dir / "checkpoints")
    assert last is not None
    final = checkpoint_state(last)
    assert final["step"] == 3 and final["policy_version"] == 3
    assert max(_metric(run_dir, "logprob_gap")) < 1e-5


@pytest.mark.slow
def test_killing_a_sharded_rank_names_the_last_checkpoint_which_resume_continues(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Sharded, rank 0 holds half the weights and cannot write a checkpoint alone: the line
    names the last one written (checkpoint.every), and --resume continues from it."""
    args = _args(tmp_path, starter_dir, 3, "trainer.strategy=fsdp2", "checkpoint.every=1")
    env = {**_env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until step 1's checkpoint is written
            lines.append(line)
            if line.startswith("checkpoint:"):
                break
        (rank1,) = _rank_children(proc.pid)
        rank1.send_signal(signal.SIGKILL)
        lines += proc.stdout.readlines()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 1 and len(errors) == 1, "".join(lines)[-3000:]
    assert "rank 1 was killed by SIGKILL" in errors[0]
    assert "checkpoint of step 1:" in errors[0] and "--resume" in errors[0]
    assert not _rank_children(proc.pid)

    done = subprocess.run(
        [*args, "--resume"], env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = latest_checkpoint(tmp_path / "calc/checkpoints")
    assert last is not None and checkpoint_state(last)["policy_version"] == 3


if __name__ == "__main__":
    if sys.argv[1] == "update":
        _drive_update(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    else:
        _drive_checkpoint(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
