"""``vs_trl.py --identical``: one update of tether and of TRL's GRPOTrainer on the same batch.

Same starting weights (two loads of one model folder), the same prompts
(tether's rendering, handed to TRL as token ids), the same completions (fixed
replies to calc val tasks, ended by EOS) and the same rewards (the benchmark's
grader on those replies; one group has all replies wrong, so zero variance).
TRL's generation is replaced through its own ``rollout_func`` hook, which
returns the fixed prompt and completion ids in the order TRL asks for them;
the rewards travel as an extra field to a reward function that returns them.

Both take one optimizer step with the benchmark's settings (lr, AdamW betas
0.9/0.99, no weight decay, grad-norm clip 1, PPO clip 0.2/0.28, token-mean
loss, no KL). On-policy, as in every GRPO step with one update per batch:
tether's old logprobs are the model's own (TRL, with ``num_iterations=1``,
takes the detached current logprobs), so the ratio is 1 and the clip is inert.

Printed: advantages (TRL's std epsilon is 1e-4, tether's 1e-6), the loss,
per parameter tensor the gradient cosine and norm ratio (tether / TRL) after
clipping, as each optimizer receives it, and the parameter-delta cosine.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

#: Per val task: reply templates (right via an expression, right in words, wrong, wrong).
REPLIES = (
    '{{"expression": "{expr}"}}',
    "The answer is {answer}.",
    "The answer is {wrong}.",
    '{{"expression": "{expr}+1"}}',
)
GROUPS = 4  # the last group gets four wrong replies: zero reward variance


def _batch(tokenizer: Any, grade: Any, messages: Any) -> list[dict[str, Any]]:
    """Rows in group order: question, prompt ids, completion ids, reward."""
    from tether.chat import render_prompt
    from tether.starter.calc import make_tasks

    rows = []
    for g, task in enumerate(make_tasks(GROUPS, "val", 0)):
        fill = {"expr": task["answer"], "answer": task["answer"], "wrong": f"{task['answer']}1"}
        replies = [r.format(**fill) for r in REPLIES]
        if g == GROUPS - 1:
            replies = [REPLIES[2].format(**fill)] * len(REPLIES)
        prompt = render_prompt(tokenizer, messages(task["question"]))
        for reply in replies:
            ids = list(tokenizer.encode(reply, add_special_tokens=False))
            rows.append(
                {
                    "question": task["question"],
                    "prompt_ids": prompt,
                    "completion_ids": [*ids, tokenizer.eos_token_id],
                    "reward": float(grade(task, reply)),
                }
            )
    return rows


def _own_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        x = torch.tensor([prompt + completion])
        logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        picked = logp.gather(-1, x[0, 1:, None])[:, 0]
    return picked[len(prompt) - 1 :].tolist()


def _tether(path: str, rows: list[dict], n: int, lr: float) -> dict[str, Any]:
    from tether.models import load_model
    from tether.records import Call
    from tether.trainer import PolicyTrainer, TrainerConfig, build_samples
    from tether.trainer.algorithms import compute_advantages

    model = load_model(path, dtype=torch.float32)
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float64).view(-1, n)
    adv = compute_advantages(rewards, "grpo").advantages.flatten().tolist()
    calls = [
        [
            Call(
                rollout_id=f"r{i}",
                seq=0,
                prompt_ids=r["prompt_ids"],
                completion_ids=r["completion_ids"],
                logprobs=_own_logprobs(model, r["prompt_ids"], r["completion_ids"]),
                policy_version=0,
            )
        ]
        for i, r in enumerate(rows)
    ]
    samples, _ = build_samples(calls, adv)
    cfg = TrainerConfig(
        lr=lr, betas=(0.9, 0.99), weight_decay=0.0, grad_clip=1.0, clip_low=0.2, clip_high=0.28
    )
    trainer = PolicyTrainer(model, cfg)
    grads: dict[str, torch.Tensor] = {}

    def capture(*_: Any) -> None:
        grads.update({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})

    trainer.optimizer.register_step_pre_hook(capture)
    metrics = trainer.update(samples)
    delta = {k: p.detach() - start[k] for k, p in model.named_parameters()}
    return {
        "advantages": adv,
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "grads": grads,
        "delta": delta,
    }


def _trl(path: str, rows: list[dict], n: int, lr: float, out: str) -> dict[str, Any]:
    from _vs_trl_side import trl_config
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from tether.models import load_model, load_tokenizer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func is marked experimental
    model = load_model(path, dtype=torch.float32)
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    queue: dict[str, list[dict]] = {}
    for r in rows:
        queue.setdefault(r["question"], []).append(r)
    order = list(queue)
    seen: dict[str, Any] = {"grads": {}, "loss": [], "advantages": None, "rows": []}

    def rollout(prompts: list, trainer: Any) -> dict[str, Any]:
        picked = [queue[p[-1]["content"]].pop(0) for p in prompts]
        seen["rows"] = picked
        return {
            "prompt_ids": [r["prompt_ids"] for r in picked],
            "completion_ids": [r["completion_ids"] for r in picked],
            "logprobs": [[0.0] * len(r["completion_ids"]) for r in picked],
            "fixed_reward": [r["reward"] for r in picked],
        }

    def reward(completions: list, fixed_reward: list, **_: Any) -> list[float]:
        return list(fixed_reward)

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            named = kw["model"].named_parameters()
            seen["grads"] = {k: p.grad.clone() for k, p in named if p.grad is not None}

    class Recording(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            result = super()._generate_and_score_completions(inputs)
            seen["advantages"] = result["advantages"].tolist()
            return result

        def compute_loss(self, *a: Any, **k: Any) -> Any:
            loss = super().compute_loss(*a, **k)
            seen["loss"].append(float(loss.detach()))
            return loss

    config = trl_config(
        output_dir=out,
        learning_rate=lr,
        per_device_train_batch_size=len(rows),
        num_generations=n,
        max_completion_length=max(len(r["completion_ids"]) for r in rows),
        max_steps=1,
        seed=0,
    )
    trainer = Recording(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": _messages(q)} for q in order]),
        processing_class=load_tokenizer(path),
        callbacks=[Capture()],
        rollout_func=rollout,
    )
    trainer.train()
    # TRL's rows come in the order its sampler asked; put its advantages in ours
    index = {id(r): i for i, r in enumerate(rows)}
    adv = [0.0] * len(rows)
    for r, a in zip(seen["rows"], seen["advantages"], strict=True):
        adv[index[id(r)]] = a
    delta = {k: p.detach() - start[k] for k, p in trainer.model.named_parameters()}
    norms = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    return {
        "advantages": adv,
        "loss": sum(seen["loss"]),
        "grad_norm": float(norms[-1]) if norms else float("nan"),
        "grads": seen["grads"],
        "delta": delta,
    }


def _messages(question: str) -> list[dict[str, str]]:
    from tether.starter.calc import SYSTEM_PROMPT

    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    if a.norm() == 0 or b.norm() == 0:
        return float("nan")
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def run_identical(model_path: str, grade: Any, lr: float, out: str) -> None:
    """Print the comparison (the module docstring says what and how)."""
    from tether.models import load_tokenizer

    rows = _batch(load_tokenizer(model_path), grade, _messages)
    n = len(REPLIES)
    ours = _tether(model_path, copy.deepcopy(rows), n, lr)
    theirs = _trl(model_path, rows, n, lr, out)
    print(
        f"identical batch: {GROUPS} groups × {n} completions "
        f"({sum(len(r['completion_ids']) for r in rows)} completion tokens), lr {lr:g}"
    )
    rewards = " ".join(f"{r['reward']:.0f}" for r in rows)
    print(f"rewards:     {rewards}")
    print(f"adv tether:  {' '.join(f'{a:+.4f}' for a in ours['advantages'])}")
    print(f"adv TRL:     {' '.join(f'{a:+.4f}' for a in theirs['advantages'])}")
    gap = max(abs(a - b) for a, b in zip(ours["advantages"], theirs["advantages"], strict=True))
    print(f"max |advantage difference|: {gap:.2e} (std epsilon: tether 1e-6, TRL 1e-4)")
    rel = abs(ours["loss"] - theirs["loss"]) / max(abs(theirs["loss"]), 1e-12)
    print(f"loss: tether {ours['loss']:.8f}, TRL {theirs['loss']:.8f} (rel diff {rel:.2e})")
    print(
        f"gradient norm before clipping to 1: tether {ours['grad_norm']:.6f}, "
        f"TRL {theirs['grad_norm']:.6f}; the columns below compare the clipped gradients"
    )
    print(f"{'parameter tensor':<48} {'grad cos':>12} {'norm ratio':>11} {'delta cos':>12}")
    worst_g, worst_d, ratios = 1.0, 1.0, []
    for name, g in theirs["grads"].items():
        mine = ours["grads"].get(name, torch.zeros_like(g))
        gc, dc = _cosine(mine, g), _cosine(ours["delta"][name], theirs["delta"][name])
        ratio = float(mine.norm() / g.norm()) if g.norm() > 0 else float("nan")
        worst_g = min(worst_g, gc) if gc == gc else worst_g  # nan: a zero gradient
        worst_d = min(worst_d, dc) if dc == dc else worst_d
        ratios.append(ratio)
        print(f"{name:<48} {gc:>12.8f} {ratio:>11.6f} {dc:>12.8f}")
    flat = [r for r in ratios if r == r]
    print(
        f"worst gradient cosine {worst_g:.8f}, norm ratio {min(flat):.6f}–{max(flat):.6f}, "
        f"worst parameter-delta cosine {worst_d:.8f} over {len(ratios)} tensors"
    )
