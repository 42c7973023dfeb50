"""Trained tokens/s of one GRPO update at a fixed batch, and peak memory.

The batch is what a calc step produces: 64 rollouts (8 tasks × 8), each two
calls rendered with the starter's chat template (system prompt + tools +
question → tool call; + tool result → final answer), prefix-merged into one
sequence per rollout. Compares, in the same run, each in a fresh process so
that peak memory is its own:

- ``plain fp32``: the whole sequence through the model for every row;
- ``shared prefix fp32``: the shared system+tools prompt computed once and its
  KV cache broadcast (tether's default);
- ``shared prefix bf16``: the same under bfloat16 autocast (``model.train_dtype``).

    python benchmarks/trainer_throughput.py [--updates 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CONFIGS = {
    "plain fp32": {"share": False, "dtype": "float32"},
    "shared prefix fp32": {"share": True, "dtype": "float32"},
    "shared prefix bf16": {"share": True, "dtype": "bfloat16"},
}


def _batch(tokenizer, n_rollouts: int = 64):
    from tether.chat import render_prompt
    from tether.records import Call
    from tether.starter.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator, make_tasks
    from tether.trainer.samples import build_samples

    rollouts = []
    for i, task in enumerate(make_tasks(n_rollouts // 8, "train", seed=1) * 8):
        msgs = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task["question"]},
        ]
        p1 = render_prompt(tokenizer, msgs, [CALCULATOR_TOOL])
        expr = task.get("expression") or "12 + 30"
        args = {"expression": expr}
        c1_text = (
            '<tool_call>\n{"name": "calculator", "arguments": '
            + json.dumps(args)
            + "}\n</tool_call><|im_end|>"
        )
        c1 = tokenizer.encode(c1_text, add_special_tokens=False)
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps(args)},
        }
        msgs2 = [
            *msgs,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": calculator(expr)},
        ]
        p2 = render_prompt(tokenizer, msgs2, [CALCULATOR_TOOL])
        c2 = tokenizer.encode(
            f"The answer is {task['grader']['answer']}.<|im_end|>", add_special_tokens=False
        )
        rollouts.append(
            [
                Call(
                    rollout_id=f"r{i}",
                    seq=0,
                    prompt_ids=p1,
                    completion_ids=c1,
                    logprobs=[-1.0] * len(c1),
                    policy_version=0,
                ),
                Call(
                    rollout_id=f"r{i}",
                    seq=1,
                    prompt_ids=p2,
                    completion_ids=c2,
                    logprobs=[-1.0] * len(c2),
                    policy_version=0,
                ),
            ]
        )
    advantages = [(-1.0) ** i for i in range(len(rollouts))]
    return build_samples(rollouts, advantages)


def child(name: str, updates: int) -> None:
    import torch

    from tether.models import load_model, load_tokenizer
    from tether.starter import build_starter
    from tether.trainer import PolicyTrainer
    from tether.trainer.config import TrainerConfig

    spec = CONFIGS[name]
    path = build_starter()
    tokenizer = load_tokenizer(path)
    samples, stats = _batch(tokenizer)
    torch.manual_seed(0)
    trainer = PolicyTrainer(load_model(path), TrainerConfig(lr=1e-4), train_dtype=spec["dtype"])
    trainer.share_prefix = spec["share"]
    trainer.update(samples)  # warm-up
    t0 = time.perf_counter()
    for _ in range(updates):
        m = trainer.update(samples)
    dt = (time.perf_counter() - t0) / updates
    seq_tokens = sum(len(s) for s in samples)
    print(
        json.dumps(
            {
                "name": name,
                "s_per_update": dt,
                "loss_tokens": m["trained_tokens"],
                "seq_tokens": seq_tokens,
                "samples": len(samples),
                "merge": stats.merge_fraction,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.updates)
        return
    rows = []
    for name in CONFIGS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", name, "--updates", str(args.updates)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["s_per_update"]
    r0 = rows[0]
    print(
        f"batch: {r0['samples']} samples ({r0['merge']:.0%} of calls prefix-merged), "
        f"{r0['seq_tokens']} sequence tokens, {int(r0['loss_tokens'])} trained (loss) tokens"
    )
    print(
        f"{'config':<22}{'s/update':>10}{'trained tok/s':>15}{'seq tok/s':>11}{'peak RSS MB':>13}{'speed-up':>10}"
    )
    for r in rows:
        print(
            f"{r['name']:<22}{r['s_per_update']:>10.2f}{r['loss_tokens'] / r['s_per_update']:>15.0f}"
            f"{r['seq_tokens'] / r['s_per_update']:>11.0f}{r['peak_rss_mb']:>13.0f}{base / r['s_per_update']:>9.2f}x"
        )


if __name__ == "__main__":
    main()
