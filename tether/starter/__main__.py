"""``python -m tether.starter [--warm] [--eval N]``: build (and measure) the starter model."""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch

from tether.models import load_model, load_tokenizer
from tether.starter import calc
from tether.starter._build import build_starter, read_info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tether.starter",
        description="Build the tether starter model (cached) and print its folder.",
    )
    parser.add_argument("--warm", action="store_true", help="build the warmed-up model")
    parser.add_argument("--cache-dir", default=None, help="cache folder (default: $TETHER_CACHE)")
    parser.add_argument(
        "--eval", type=int, default=0, metavar="N", help="measure success on N val tasks"
    )
    parser.add_argument("--eval-seed", type=int, default=0, help="seed of the val tasks")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    started = time.monotonic()
    path = build_starter(cache_dir=args.cache_dir, warm=args.warm)
    print(f"starter model: {path} ({time.monotonic() - started:.1f}s)")
    stats = read_info(path).get("warmup_stats")
    if stats:
        print(f"warm-up: {stats['steps']} steps in {stats['wall_s']}s")
    if args.eval:
        from tether.starter._evaluate import evaluate

        tokenizer, model = load_tokenizer(path), load_model(path)
        tasks = calc.make_tasks(args.eval, "val", seed=args.eval_seed)
        for name, temperature in (("greedy", 0.0), ("sampled T=1", 1.0)):
            t0 = time.monotonic()
            result = evaluate(model, tokenizer, tasks, temperature=temperature, seed=args.eval_seed)
            took = time.monotonic() - t0
            print(f"{name}: success {result['success']:.3f} {json.dumps(result)} ({took:.0f}s)")


if __name__ == "__main__":
    main()
