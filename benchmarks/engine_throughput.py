"""Aggregate generation throughput of TransformersEngine vs one-by-one ``model.generate``.

Both run the same ~2M-parameter Qwen2 (tether's starter model when it can be
built, else a random model of the same shape; or with ``--model-shape`` a randomly
initialised model of a named shape, e.g. Qwen2.5-0.5B's, SDPA attention, in
``--dtype``) in the same process, sampling
at T=1 with a fixed number of new tokens (EOS ignored). The baseline serves
requests one at a time with plain ``model.generate``; the engine gets ``c``
concurrent requests. Prints a table of generated tokens per second::

    .venv/bin/python benchmarks/engine_throughput.py [--concurrency 1 4 16 64]
        [--max-tokens 64] [--prompt-len 128] [--shared-prefix 0] [--no-prefix-cache]
        [--device cuda] [--model-shape starter|tiny|qwen2.5-0.5b] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import torch
from _shapes import SHAPES, quiet_torchao, random_model  # the script's folder is on sys.path

from tether.engine import SamplingParams, TransformersEngine


def build_model(device: str) -> tuple[Any, str]:
    """The starter model (untrained weights are as fast as trained ones), else a look-alike."""
    try:
        from tether.models import load_model
        from tether.starter import build_starter

        return load_model(build_starter(), dtype=torch.float32, device=device), "tether.starter"
    except Exception as exc:  # the starter is optional here
        print(f"(starter model unavailable: {exc!r}; using a random model of the same shape)")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=1664,
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=512,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).to(device).eval(), "random Qwen2"


def make_prompts(
    n: int, length: int, vocab: int, seed: int = 0, shared: int = 0
) -> list[list[int]]:
    """``n`` random prompts whose first ``shared`` tokens are the same (like a system prompt)."""
    common = random.Random(-1)
    head = [common.randrange(3, vocab) for _ in range(min(shared, length - 1))]
    rnd = random.Random(seed)
    return [head + [rnd.randrange(3, vocab) for _ in range(length - len(head))] for _ in range(n)]


def bench_generate(model: Any, prompts: list[list[int]], max_tokens: int) -> float:
    """Tokens/s of plain ``model.generate``, one request at a time."""
    tokens, start = 0, time.perf_counter()
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                pad_token_id=0,
            )
        tokens += out.shape[1] - ids.shape[1]
    return tokens / (time.perf_counter() - start)


async def bench_engine(
    engine: TransformersEngine, prompts: list[list[int]], max_tokens: int
) -> tuple[float, float]:
    """Tokens/s of the engine with all ``prompts`` in flight at once, and the mean batch size."""
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    engine.stats.batch_sizes.clear()
    start = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    elapsed = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for r in results for c in r.completions)
    sizes = engine.stats.batch_sizes
    return tokens / elapsed, sum(sizes) / max(len(sizes), 1)


async def main(args: argparse.Namespace) -> None:
    quiet_torchao()
    if args.model_shape == "starter":
        model, source = build_model(args.device)
        model = model.to(getattr(torch, args.dtype))
    else:
        model = random_model(args.model_shape, args.device, getattr(torch, args.dtype))
        source = f"random {args.model_shape}-shaped Qwen2, {args.dtype}, SDPA"
    vocab = model.get_input_embeddings().num_embeddings
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {source}, {params / 1e6:.2f}M params, vocab {vocab}, device {args.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"prompt {args.prompt_len} tokens ({args.shared_prefix} shared), {args.max_tokens} new tokens, "
        f"T=1, EOS ignored, prefix cache {'off' if args.no_prefix_cache else 'on'}\n"
    )
    engine = TransformersEngine(
        model,
        max_batch_size=max(args.concurrency),
        seed=0,
        prefix_cache_tokens=0 if args.no_prefix_cache else 32_768,
    )
    shared = args.shared_prefix
    try:
        await bench_engine(
            engine, make_prompts(2, args.prompt_len, vocab, 99, shared), 8
        )  # warm-up
        bench_generate(model, make_prompts(1, args.prompt_len, vocab, 98, shared), 8)
        baseline = make_prompts(args.baseline_requests, args.prompt_len, vocab, 0, shared)
        first = bench_generate(model, baseline, args.max_tokens)
        levels = []
        for c in args.concurrency:
            prompts = make_prompts(c * args.rounds, args.prompt_len, vocab, c, shared)
            runs = [
                await bench_engine(engine, prompts[i * c : (i + 1) * c], args.max_tokens)
                for i in range(args.rounds)
            ]
            tps = sum(r[0] for r in runs) / len(runs)
            mean_batch = sum(r[1] for r in runs) / len(runs)
            levels.append((c, tps, mean_batch))
        # the machine may be shared: measure the baseline before and after, use the mean
        base = (first + bench_generate(model, baseline, args.max_tokens)) / 2
    finally:
        await engine.close()
    rows = [("model.generate, one at a time", 1, base, 1.0, 1.0)]
    rows += [("TransformersEngine", c, tps, tps / base, batch) for c, tps, batch in levels]
    print(f"{'server':<30} {'concurrent':>10} {'tokens/s':>10} {'speedup':>8} {'mean batch':>11}")
    for name, c, tps, speedup, batch in rows:
        print(f"{name:<30} {c:>10} {tps:>10.0f} {speedup:>7.1f}x {batch:>11.1f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--baseline-requests", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="batches of c requests per level")
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens common to prompts")
    parser.add_argument("--no-prefix-cache", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model-shape", default="starter", choices=["starter", *SHAPES])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
