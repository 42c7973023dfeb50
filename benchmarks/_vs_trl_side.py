"""``vs_trl.py``'s TRL side of the training comparison: GRPOTrainer on tether's task sequence.

Runs in the child process ``vs_trl.py --only trl`` starts; it imports the
shared pieces (grader, prompt, evaluator, task sequence) from ``vs_trl``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def trl_config(**run: Any) -> Any:
    """TRL's ``GRPOConfig`` with tether's GRPO settings (both modes use it): one
    optimizer step per batch, PPO clip 0.2/0.28, no KL, token-mean loss (``dapo``),
    group-scaled advantages, AdamW betas 0.9/0.99 without weight decay, grad-norm
    clip 1, constant lr, CPU fp32, tasks in order; ``run`` adds the run's own fields."""
    from trl import GRPOConfig

    return GRPOConfig(
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        shuffle_dataset=False,
        **run,
    )


def run_trl(args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from vs_trl import evaluate, grade, messages, prompt_text, task_sequence, tools, val_tasks

    from tether.chat import render_prompt
    from tether.models import load_model, load_tokenizer

    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, dtype=torch.float32)
    train = task_sequence(args)
    data = Dataset.from_list(  # text prompts: TRL's own chat templating would drop the tool
        [
            {"prompt": prompt_text(tokenizer, t["question"]), "question": t["question"]}
            | {"answer": t["answer"]}
            for t in train
        ]
    )

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        return [grade({"answer": a}, c) for c, a in zip(completions, answer, strict=True)]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = 0.0
            self.optimizer_steps = 0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, *a: Any, **k: Any) -> None:
            self.optimizer_steps += 1

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.times.append(time.perf_counter() - self.t0)

    seen: dict[str, Any] = {"questions": [], "signal_steps": 0}

    class Counting(GRPOTrainer):
        """Records the questions in the order TRL trains on them, and the steps with signal."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            seen["questions"] += [x["question"] for x in inputs[:: args.n]]
            out = super()._generate_and_score_completions(inputs)
            seen["signal_steps"] += bool(out["advantages"].abs().max() > 0)
            return out

    clock = Clock()
    config = trl_config(
        output_dir=str(Path(args.out) / f"trl-{args.seed}"),
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_groups * args.n,
        num_generations=args.n,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_steps=args.steps,
        warmup_steps=0,
        seed=args.seed,
    )
    trainer = Counting(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    # TRL renders prompts itself; say so if its token ids are not tether's
    theirs = trainer._tokenize_prompts([prompt_text(tokenizer, train[0]["question"])])[0][0]
    same_prompt = list(theirs) == render_prompt(tokenizer, messages(train[0]["question"]), tools())
    trainer.train()
    if seen["questions"] != [t["question"] for t in train]:
        raise SystemExit("TRL trained on its tasks in another order than tether's")
    model = trainer.model.eval()
    return {
        "times": clock.times,
        "optimizer_steps": clock.optimizer_steps,
        "signal_steps": seen["signal_steps"],
        "rewards": [float(e["reward"]) for e in trainer.state.log_history if "reward" in e],
        "same_prompt_ids": same_prompt,
        **evaluate(model, load_tokenizer(args.model), val_tasks(args.eval_tasks), args.max_tokens),
    }
