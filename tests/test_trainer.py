"""The trainer: one update, checkpoint/resume, data order, config, and a real 2-step run."""

from __future__ import annotations

import asyncio
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.configio import load_config
from tether.errors import UserError
from tether.models import load_model
from tether.records import Call, Split, Task
from tether.run import (
    CheckpointConfig,
    EvalConfig,
    RolloutConfig,
    TasksConfig,
    TrainConfig,
    TrainerConfig,
    TrainingRun,
    tasks_for_step,
)
from tether.runner import RunnerConfig
from tether.trainer import PolicyTrainer
from tether.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from tether.trainer.samples import build_samples

ROOT = Path(__file__).resolve().parents[1]


def _samples(model: Any, seed: int = 0) -> list:
    """Two rollouts of two calls each, with the model's own logprobs as the engine's."""
    g = torch.Generator().manual_seed(seed)
    rollouts = []
    for r in range(2):
        prompt = torch.randint(3, 1600, (12,), generator=g).tolist()
        completion = torch.randint(3, 1600, (6,), generator=g).tolist()
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        lps = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]
        c0 = Call(
            rollout_id=f"r{r}",
            seq=0,
            prompt_ids=prompt,
            completion_ids=completion,
            logprobs=lps,
            policy_version=0,
        )
        rollouts.append([c0])
    return build_samples(rollouts, [1.0, -1.0])[0]


def test_one_update_changes_parameters_and_loss_is_finite(starter_dir: Path) -> None:
    model = load_model(starter_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-3))
    samples = _samples(model)
    entropies = []  # reference: the full softmax of the pre-update model at each sampled token
    with torch.no_grad():
        for s in samples:
            logits = model(torch.tensor([s.input_ids])).logits[0].float()
            for t in (t for t, m in enumerate(s.loss_mask) if m):
                p = torch.softmax(logits[t - 1], -1)
                entropies.append(-(p * p.log()).sum().item())
    metrics = trainer.update(samples)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert metrics["logprob_gap"] < 1e-4  # the "engine" logprobs came from the same weights
    assert metrics["entropy"] == pytest.approx(sum(entropies) / len(entropies), rel=1e-4)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0  # ratio 1: on-policy
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed


def test_zero_advantage_samples_are_skipped_without_changing_the_gradient(
    starter_dir: Path,
) -> None:
    """The update leaves samples with advantage 0 out of the forward pass; the gradient
    must still be the one of the token-mean loss over *all* samples (plain reference)."""
    model = load_model(starter_dir)
    samples = _samples(model) + _samples(model, seed=1)
    for s in samples[2:]:
        s.advantage = 0.0  # a zero-variance group
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-3, grad_clip=0))  # raw gradients
    seen: dict[str, torch.Tensor] = {}
    forwards: list[int] = []
    step, forward = trainer.optimizer.step, trainer._forward_logprobs

    def capture(*args: Any, **kwargs: Any) -> Any:
        seen.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    def count(m: Any, batch: dict, **kwargs: Any) -> Any:
        forwards.append(int(batch["input_ids"].shape[0]))
        return forward(m, batch, **kwargs)

    reference = load_model(starter_dir)  # same weights, plain loop over every sample
    total = sum(sum(s.loss_mask) for s in samples)
    loss = torch.zeros(())
    for s in samples:
        ids = torch.tensor([s.input_ids])
        logp = torch.log_softmax(reference(ids).logits[0, :-1].float(), -1)
        token_logp = logp.gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        loss = loss - s.advantage * (token_logp * mask).sum() / total  # ratio 1: -A·logp
    loss.backward()

    trainer.optimizer.step, trainer._forward_logprobs = capture, count  # type: ignore[method-assign]
    trainer.update(samples)
    assert sum(forwards) == 2  # only the two samples with an advantage ran
    for name, p in reference.named_parameters():
        torch.testing.assert_close(seen[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_lora_update_trains_only_adapters(starter_dir: Path) -> None:
    from tether.run import LoraConfig

    model = load_model(starter_dir)
    base = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8)))
    samples = _samples(load_model(starter_dir))
    trainer.update(samples)
    trainer.update(samples)
    merged = trainer.state_dict()
    assert torch.equal(
        trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight, base
    )
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base)
    assert set(merged) == set(load_model(starter_dir).state_dict())


def test_checkpoint_resume_is_bit_identical(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """Stopping after update 1 and resuming gives the same parameters and optimizer state as not stopping."""
    cfg = TrainerConfig(lr=1e-3, seed=3)
    batches = [_samples(load_model(starter_dir), seed=s) for s in range(3)]

    torch.manual_seed(0)
    straight = PolicyTrainer(load_model(starter_dir), cfg)
    for b in batches:
        straight.update(b)

    torch.manual_seed(0)
    first = PolicyTrainer(load_model(starter_dir), cfg)
    first.update(batches[0])
    ckpt = save_checkpoint(
        tmp_path / "ckpt",
        1,
        trainer=first,
        tokenizer=tokenizer,
        base_model_dir=starter_dir,
        config={},
        keep=1,
    )
    rng_after_save = (torch.rand(3), random.random())
    del first
    resumed = PolicyTrainer(load_model(starter_dir), cfg)
    assert load_checkpoint(latest_checkpoint(tmp_path / "ckpt"), resumed) == 1
    assert torch.equal(torch.rand(3), rng_after_save[0]) and random.random() == rng_after_save[1]
    for b in batches[1:]:
        resumed.update(b)
    for (k, a), (_, b) in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), k
    sa, sb = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    # The checkpoint's model folder loads with the ordinary from_pretrained path.
    assert load_model(ckpt / "model") is not None


def test_checkpoint_write_is_atomic(starter_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    trainer = PolicyTrainer(load_model(starter_dir), TrainerConfig())
    d = tmp_path / "ck"
    (d / "step-000005.tmp-crashed").mkdir(parents=True)  # what a crash mid-write leaves
    assert latest_checkpoint(d) is None
    for step in (1, 2, 3):
        save_checkpoint(
            d,
            step,
            trainer=trainer,
            tokenizer=tokenizer,
            base_model_dir=starter_dir,
            config={},
            keep=2,
            run="r1",
        )
    assert [p.name for p in sorted(d.iterdir())] == ["step-000002", "step-000003"]


def test_data_order_is_a_function_of_seed_and_step() -> None:
    train = [Task(id=str(i), data={"i": i}, split=Split.TRAIN) for i in range(10)]
    epoch = [t.id for s in range(1, 6) for t in tasks_for_step(train, s, 2, seed=1)]
    assert sorted(epoch) == sorted(t.id for t in train)  # one epoch covers every task once
    again = [t.id for s in range(1, 6) for t in tasks_for_step(train, s, 2, seed=1)]
    assert epoch == again
    assert [t.id for t in tasks_for_step(train, 7, 3, seed=1)] == [
        t.id for t in tasks_for_step(train, 7, 3, seed=1)
    ]
    assert epoch != [t.id for s in range(1, 6) for t in tasks_for_step(train, s, 2, seed=2)]


def test_config_file_with_overrides_and_clear_errors(tmp_path: Path) -> None:
    cfg = load_config(
        TrainConfig, ROOT / "examples/calc/config.yaml", ["trainer.lr=3e-5", "rollout.n=8"]
    )
    assert cfg.trainer.lr == 3e-5 and cfg.rollout.n == 8
    with pytest.raises(UserError, match=r"did you mean .lr."):
        load_config(TrainConfig, None, ["trainer.lrr=1"])
    with pytest.raises(UserError, match=r"rollout.n \(1\) must be >= 2"):
        load_config(TrainConfig, None, ["rollout.n=1"])
    with pytest.raises(UserError, match=r"trainer\.advantage"):
        load_config(TrainConfig, None, ["trainer.advantage=ppo"])
    with pytest.raises(UserError, match="must be a number"):
        load_config(TrainConfig, None, ["trainer.lr=fast"])


def test_two_step_training_through_gateway_and_subprocess_agents(
    starter_dir: Path, tmp_path: Path
) -> None:
    cfg = TrainConfig(
        name="e2e",
        dir=str(tmp_path),
        tasks=TasksConfig(source="calc", train_size=20, val_size=2),
        agent=RunnerConfig(
            mode="process",
            command=[sys.executable, str(ROOT / "examples/calc/agent.py")],
            concurrency=4,
            timeout_s=60,
        ),
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=2, lr=1e-3),
        eval=EvalConfig(tasks=1, samples=2, greedy=False),
        checkpoint=CheckpointConfig(every=1, keep=3),
    )
    cfg.gateway.default_max_tokens = 24

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    run = asyncio.run(go())
    steps = run.history
    assert [r.step for r in steps] == [1, 2]
    assert all(r.metrics["rollouts"] == 4 for r in steps)
    from tether.store import Store

    with Store(tmp_path / "e2e" / "traces.sqlite") as store:
        rid = run.run_record.id
        rollouts = store.list_rollouts(group_id=f"{rid}-s2-g0") + store.list_rollouts(
            group_id=f"{rid}-s2-g1"
        )
        assert len(rollouts) == 4 and all(r.status.value == "succeeded" for r in rollouts)
        calls = [c for r in rollouts for c in store.calls(r.id)]
        assert calls and all(
            c.completion_ids and len(c.logprobs) == len(c.completion_ids) for c in calls
        )
        # Calls of step 2 were served by the weights after step 1's update.
        assert {c.policy_version for c in calls} == {1}
        assert run.engine.policy_version == 2
        stored: dict[int, dict[str, float]] = {}
        for metric in store.metrics(rid):
            stored.setdefault(metric.step, {})[metric.name] = metric.value
        for r in steps:
            assert r.metrics["zero_variance_groups"] == 0
            diagnostics = ("entropy", "zero_variance_frac", "clip_frac_low", "clip_frac_high")
            diagnostics += ("approx_kl", "adv_mean", "adv_std", "response_len_mean")
            for key in (*diagnostics, "response_len_max"):
                assert stored[r.step][key] == r.metrics[key], key  # stored per step
            assert 0 < r.metrics["entropy"] < math.log(len(run.tokenizer))  # below uniform
            assert r.metrics["zero_variance_frac"] == 0.0
            assert 0 < r.metrics["response_len_mean"] <= r.metrics["response_len_max"]
            assert r.metrics["logprob_gap"] < 1e-4  # engine and trainer agree token for token
            assert 50 < r.metrics["rss_mb"] < 64_000  # this process's resident memory, in MiB
    assert (tmp_path / "e2e" / "checkpoints" / "step-000002" / "model").is_dir()
    assert len(run.evals) == 2


def test_shared_prefix_forward_matches_plain_forward(starter_dir: Path) -> None:
    """Computing the shared prompt once gives the same logprobs and gradients as the plain forward."""
    from tether.trainer._forward import shared_prefix
    from tether.trainer.samples import collate

    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 1600, (40,), generator=g).tolist()
    rollouts = []
    for r in range(3):
        prompt = prefix + torch.randint(3, 1600, (r + 2,), generator=g).tolist()
        completion = torch.randint(3, 1600, (5 + r,), generator=g).tolist()
        rollouts.append(
            [
                Call(
                    rollout_id=f"r{r}",
                    seq=0,
                    prompt_ids=prompt,
                    completion_ids=completion,
                    logprobs=[-1.0] * len(completion),
                    policy_version=0,
                    temperature=0.8,
                )
            ]
        )
    samples, _ = build_samples(rollouts, [1.0, -0.5, 0.25])
    batch = collate(samples)
    assert shared_prefix(batch["input_ids"], batch["loss_mask"]) == 40

    results = []
    for share in (False, True):
        trainer = PolicyTrainer(load_model(starter_dir), TrainerConfig())
        trainer.share_prefix = share
        lp, entropy = trainer._forward_logprobs(trainer.model, batch, entropy=True)
        (lp * batch["loss_mask"]).sum().backward()
        grad = trainer.model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        results.append((lp.detach() * batch["loss_mask"], grad, entropy * batch["loss_mask"]))
    (lp_plain, g_plain, h_plain), (lp_shared, g_shared, h_shared) = results
    assert torch.allclose(lp_plain, lp_shared, atol=1e-5)
    assert torch.allclose(h_plain, h_shared, atol=1e-4) and h_plain.sum() > 0
    assert torch.allclose(g_plain, g_shared, atol=1e-5, rtol=1e-4)
