"""The logprob gap between the engine and the trainer, per rollout dtype and train dtype.

The engine (TransformersEngine) samples ``--requests`` completions of ``--max-tokens``
tokens (T=1, EOS ignored) from the fp32 policy served as itself (``float32``), as a
bf16 copy (``bfloat16``) or a torchao int8 weight-only copy (``int8``); the trainer's
forward then recomputes the same tokens' logprobs from the fp32 weights, in fp32 or
under bf16 autocast (``model.train_dtype``). Printed per pair: the mean and max
|engine − trainer| logprob over completion tokens (what the run's ``logprob_gap``
reports each step) and the k3 KL estimate. The model is tether's warm starter, or
with ``--model-shape`` a randomly initialised model of that shape (its next-token
distributions are near uniform, so its gaps are smaller than a trained model's).

    .venv/bin/python benchmarks/logprob_gap.py [--device cuda] [--model-shape qwen2.5-0.5b]
        [--rollout-dtypes float32 bfloat16 int8] [--requests 16] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
from typing import Any

import torch
from _shapes import SHAPES, quiet_torchao, random_model  # the script's folder is on sys.path

from tether.engine import SamplingParams, TransformersEngine


def load(shape: str, device: str) -> tuple[Any, str]:
    if shape != "starter":
        return random_model(shape, device), f"random {shape}-shaped Qwen2 (fp32 weights)"
    from tether.models import load_model
    from tether.starter import build_starter

    return load_model(build_starter(warm=True), device=device), "the warm starter model"


async def sample(
    model: Any, rollout_dtype: str, prompts: list[list[int]], max_tokens: int
) -> list[tuple[list[int], list[int], list[float]]]:
    engine = TransformersEngine(
        model,
        device=model.device,
        seed=0,
        rollout_dtype=None if rollout_dtype == "float32" else rollout_dtype,
    )
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    try:
        res = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    finally:
        await engine.close()
    return [
        (p, r.completions[0].token_ids, r.completions[0].logprobs)
        for p, r in zip(prompts, res, strict=True)
    ]


def gap(
    model: Any, rows: list[tuple[list[int], list[int], list[float]]], train: str
) -> list[float]:
    """mean |Δ|, max |Δ|, k3 KL(engine ‖ trainer) over every completion token."""
    diffs = []
    autocast = (
        torch.autocast(model.device.type, dtype=torch.bfloat16)
        if train == "bfloat16"
        else contextlib.nullcontext()
    )
    for prompt, completion, engine_lp in rows:
        ids = torch.tensor([prompt + completion], device=model.device)
        with torch.inference_mode(), autocast:
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        diffs.append(lp.cpu() - torch.tensor(engine_lp))
    d = torch.cat(diffs).double()  # trainer − engine
    return [d.abs().mean().item(), d.abs().max().item(), (d.exp() - 1 - d).mean().item()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model-shape", default="starter", choices=["starter", *SHAPES])
    p.add_argument("--rollout-dtypes", nargs="+", default=["float32", "bfloat16", "int8"])
    p.add_argument("--train-dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    quiet_torchao()
    model, source = load(args.model_shape, args.device)
    vocab = model.get_input_embeddings().num_embeddings
    rnd = random.Random(0)
    prompts = [
        [rnd.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)
    ]
    print(
        f"{source} on {args.device}; {args.requests} completions × {args.max_tokens} tokens "
        f"(T=1) per engine dtype; trainer: fp32 weights, forward in the train dtype"
    )
    print(f"{'engine':>9} {'trainer':>9} {'mean |Δ|':>10} {'max |Δ|':>9} {'KL k3':>10}")
    for rd in args.rollout_dtypes:
        rows = asyncio.run(sample(model, rd, prompts, args.max_tokens))
        for td in args.train_dtypes:
            mean, mx, kl = gap(model, rows, td)
            print(f"{rd:>9} {td:>9} {mean:>10.2e} {mx:>9.3f} {kl:>10.2e}")


if __name__ == "__main__":
    main()
