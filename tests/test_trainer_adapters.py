"""A role's own LoRA adapter in the trainer (docs/credit.md "Roles", trainer/_adapters.py).

The starter model with a LoRA trainer holding peft's ``default`` adapter (the shared
policy) and a ``solver`` adapter: each sample trains its role's adapter only, an
adapter without samples in a step does not move (AdamW weight decay included), and
training the solver's adapter is exactly training a one-adapter model on its samples.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import set_peft_model_state_dict

from tether.models import load_model
from tether.run import LoraConfig
from tether.trainer import PolicyTrainer, TrainerConfig
from tether.trainer._adapters import by_adapter, serving_model

CFG = TrainerConfig(lr=1e-2, weight_decay=0.1, lora=LoraConfig(r=4, alpha=8))


def samples_of(model: Any, role: str | None, seed: int = 0) -> list:
    """Two one-call rollouts (advantages +1, -1) of ``role``, with ``model``'s logprobs."""
    from tether.records import Call
    from tether.trainer.samples import build_samples

    g = torch.Generator().manual_seed(seed)
    rollouts = []
    for r in range(2):
        prompt = torch.randint(3, 1600, (12,), generator=g).tolist()
        completion = torch.randint(3, 1600, (6,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        lps = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]
        rollouts.append([Call(f"r{r}", 0, prompt, completion, lps, 0, role=role)])
    return build_samples(rollouts, [1.0, -1.0])[0]


def weights(trainer: PolicyTrainer) -> dict[str, dict[str, torch.Tensor]]:
    return trainer.adapters_state_dict()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def trainer(starter_dir: Path) -> PolicyTrainer:
    t = PolicyTrainer(load_model(starter_dir), CFG, adapters=("solver",))
    with torch.no_grad():  # B != 0: the adapters differ from the start
        for name, p in t.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    return t


def test_each_sample_trains_its_roles_adapter_and_an_idle_one_does_not_move(
    trainer: PolicyTrainer, starter_dir: Path
) -> None:
    base = load_model(starter_dir)
    plain, solver = samples_of(base, None), samples_of(base, "solver", seed=1)
    start = weights(trainer)
    assert set(start) == {"default", "solver"}
    trainer.update(plain)  # only the default adapter trains; weight decay 0.1 everywhere
    one = weights(trainer)
    assert not same(one["default"], start["default"]) and same(one["solver"], start["solver"])
    trainer.update(solver)
    two = weights(trainer)
    assert same(two["default"], one["default"]) and not same(two["solver"], one["solver"])
    metrics = trainer.update(plain + solver)  # both: one micro-batch group per adapter
    three = weights(trainer)
    assert not same(three["default"], two["default"]) and not same(three["solver"], two["solver"])
    assert metrics["micro_batches"] >= 2
    model: Any = trainer.model
    assert list(model.active_adapters) == ["default"]  # restored after the update
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert torch.equal(layer.base_layer.weight, base.model.layers[0].self_attn.q_proj.weight)


def test_training_the_solvers_adapter_is_training_a_one_adapter_model(
    trainer: PolicyTrainer, starter_dir: Path
) -> None:
    solo = PolicyTrainer(load_model(starter_dir), CFG)
    set_peft_model_state_dict(solo.model, weights(trainer)["solver"])
    samples = samples_of(load_model(starter_dir), "solver")
    for _ in range(2):
        trainer.update(samples)
        solo.update([dataclasses.replace(s, role=None) for s in samples])
    got, want = weights(trainer)["solver"], weights(solo)["default"]
    assert max((got[k] - want[k]).abs().max().item() for k in want) < 1e-6


def test_the_engine_copy_holds_every_adapter(trainer: PolicyTrainer, starter_dir: Path) -> None:
    served = serving_model(load_model(starter_dir), trainer.model)
    assert set(served.peft_config) == {"default", "solver"} and not served.training
    for name, want in weights(trainer).items():
        from peft import get_peft_model_state_dict

        got = get_peft_model_state_dict(served, adapter_name=name)
        assert same({k: v.cpu() for k, v in got.items()}, want)


def test_by_adapter_groups_in_first_seen_order(starter_dir: Path) -> None:
    a, b = samples_of(load_model(starter_dir), "solver"), samples_of(load_model(starter_dir), None)
    critic = [dataclasses.replace(s, role="critic") for s in b]
    groups = by_adapter([a[0], *b, a[1], *critic], ("solver",))
    assert [(k, len(v)) for k, v in groups] == [("solver", 2), (None, 4)]


def test_a_checkpoint_holds_every_adapter_and_resumes_them(
    trainer: PolicyTrainer, starter_dir: Path, tmp_path: Path
) -> None:
    from tether.errors import UserError
    from tether.models import load_tokenizer
    from tether.trainer.checkpoint import load_checkpoint, save_checkpoint

    base = load_model(starter_dir)
    batches = [samples_of(base, "solver", seed=s) + samples_of(base, None, seed=9) for s in (1, 2)]
    trainer.update(batches[0])
    ckpt = save_checkpoint(
        tmp_path, 1, trainer=trainer, tokenizer=load_tokenizer(starter_dir),
        base_model_dir=starter_dir, config={}, keep=1,
    )  # fmt: skip
    assert (ckpt / "adapters" / "adapter_config.json").is_file()
    assert (ckpt / "adapters" / "solver" / "adapter_model.safetensors").is_file()
    resumed = PolicyTrainer(load_model(starter_dir), CFG, adapters=("solver",))
    assert load_checkpoint(ckpt, resumed) == 1
    for name, want in weights(trainer).items():
        assert same(weights(resumed)[name], want), name
    trainer.update(batches[1])
    resumed.update(batches[1])  # the optimizer state of both adapters came back too
    for name, want in weights(trainer).items():
        assert same(weights(resumed)[name], want), name
    plain = PolicyTrainer(load_model(starter_dir), CFG)  # the roles changed: one line
    with pytest.raises(UserError, match="resume with the config it was written with"):
        load_checkpoint(ckpt, plain)
