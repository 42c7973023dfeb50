"""Peak memory and time of one GRPO update at a real model's shape.

A randomly initialised model with Qwen2.5-0.5B's configuration (written below,
nothing downloaded) takes one update through tether's ``PolicyTrainer.update``
on ``--seqs`` sequences × ``--tokens`` tokens (a 128-token prompt, the rest
completion, advantages ±1, one micro-batch), for {full fine-tune, LoRA} ×
{plain logits, chunked LM head, chunked + gradient checkpointing}, plus one
LoRA row of a Qwen2.5-1.5B-shaped model. Each row runs in its own process,
so its peak is its own: peak RSS (``ru_maxrss``: weights, optimizer state,
activations, and ~0.4 GiB of imports) on CPU, ``torch.cuda.max_memory_allocated``
on CUDA.

The machine is shared: before each row the script reads the memory available
(MemAvailable; on CUDA the free device memory) and runs a row only if its
estimated peak (:func:`estimate_gib`) fits in that minus ``--headroom-gib``;
otherwise at the largest halved token count that fits (the table says so), or
not at all ("not run: needs ~X GiB"). A watchdog kills a row whose RSS passes
the budget anyway.

    python benchmarks/train_memory.py [--device cpu|cuda] [--quick] [--rows ROW ...]
        [--tokens 1024] [--seqs 8] [--tokens-1.5b 256]

``--quick``: a tiny model (2 layers, width 64) with the real 151,936-token
vocabulary at 4 × 64 tokens, seconds per row (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
CHUNK = 128  # trainer.logprob_chunk_tokens of the chunked rows
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    model: str  # "0.5b", "1.5b" or "quick"
    lora: bool
    chunk: int  # trainer.logprob_chunk_tokens
    ckpt: bool  # trainer.gradient_checkpointing
    every: int = 1  # trainer.checkpoint_every_n_layers

    @property
    def name(self) -> str:
        kind = ("lora" if self.lora else "full") + (
            "" if self.model == "0.5b" else f"-{self.model}"
        )
        head = "chunked" if self.chunk else "plain"
        every = f"/{self.every}" if self.every > 1 else ""
        return f"{kind}/{head}" + (f"+ckpt{every}" if self.ckpt else "")


ROWS = {
    r.name: r
    for r in [
        Row("0.5b", False, 0, False),
        Row("0.5b", False, CHUNK, False),
        Row("0.5b", False, CHUNK, True),
        Row("0.5b", True, 0, False),
        Row("0.5b", True, CHUNK, False),
        Row("0.5b", True, CHUNK, True),
        Row("0.5b", True, CHUNK, True, every=2),
        Row("1.5b", True, CHUNK, True),
    ]
}


def model_config(name: str):
    """Qwen2.5-0.5B's / -1.5B's config.json as a Qwen2Config (``quick``: tiny, real vocabulary)."""
    from transformers import Qwen2Config

    shapes = {
        "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2),
        "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2),
        "quick": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2),
    }  # fmt: skip
    return Qwen2Config(
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=32768,
        max_window_layers=21,
        attention_dropout=0.0,
        bos_token_id=151643,
        eos_token_id=151645,
        **shapes[name],
    )


def estimate_gib(row: Row, seqs: int, tokens: int) -> float:
    """A generous estimate of a row's peak (fp32 on CPU), from the config.

    Weights 4 B/param; a full fine-tune adds gradients (4), AdamW's state (8) and its
    foreach temporaries (~8). Kept activations ≈ (12 h + 4 i + 3 kv) floats per token
    per layer (~120 KB for 0.5B) without checkpointing; with it the layer inputs plus
    two layers' worth. Plain logits ≈ 5 × [N, V] fp32 (the logits, their gradient and
    the per-row slices' full-size gradients); chunked ≈ 6 × [chunk, V]. ×1.3, + 1 GiB
    (imports, the random init's temporaries, allocator slack).
    """
    c = model_config(row.model)
    h, i, layers, v = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    kv = h // c.num_attention_heads * c.num_key_value_heads
    params = v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i)
    n = seqs * tokens
    state = params * (4 if row.lora else 24)
    per_layer = (12 * h + 4 * i + 3 * kv) * 4 * n
    kept = layers - layers // row.every  # layers checkpointing leaves their activations
    acts = (layers * h * 4 * n + (2 + kept) * per_layer) if row.ckpt else layers * per_layer
    head = 6 * min(row.chunk, n) * v * 4 if row.chunk else 5 * n * v * 4
    return 1.3 * (state + acts + head) / GIB + 1.0


def available_gib(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] / GIB
    import psutil

    return psutil.virtual_memory().available / GIB


# -- one row, in a child process ---------------------------------------------------------


def run_row(row: Row, seqs: int, tokens: int, device: str, train_dtype: str) -> dict:
    import resource

    import torch
    from _shapes import random_samples  # the script's folder is on sys.path
    from transformers import Qwen2ForCausalLM

    from tether.trainer import LoraConfig, PolicyTrainer, TrainerConfig

    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = Qwen2ForCausalLM(model_config(row.model))
    built_s = time.perf_counter() - t0
    cfg = TrainerConfig(
        lora=LoraConfig(r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        if row.lora
        else None,
        logprob_chunk_tokens=row.chunk,
        gradient_checkpointing=row.ckpt,
        checkpoint_every_n_layers=row.every,
        max_tokens_per_micro_batch=seqs * tokens,
    )
    trainer = PolicyTrainer(model, cfg, device=device, train_dtype=train_dtype)
    samples = random_samples(seqs, tokens, model.config.vocab_size)
    before_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics = trainer.update(samples)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    return {
        "seconds": seconds,
        "peak_mib": peak,
        "before_update_mib": before_mib,
        "build_s": built_s,
        "loss_finite": bool(metrics["loss"] == metrics["loss"]),
        "trainable_m": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad) / 1e6,
        "threads": torch.get_num_threads(),
    }


def _child_main(args: argparse.Namespace) -> None:
    row = (_quick_rows() if args.quick else ROWS)[args.child]
    result = run_row(row, args.seqs, args.tokens, args.device, args.train_dtype)
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent: one subprocess per row ----------------------------------------------------


def _quick_rows() -> dict[str, Row]:
    return {
        name: Row("quick", r.lora, r.chunk, r.ckpt, r.every)
        for name, r in ROWS.items()
        if r.model == "0.5b"
    }


def _watch(proc: subprocess.Popen, limit_gib: float, killed: list[float]) -> None:
    import psutil

    try:
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            rss = p.memory_info().rss / GIB
            if rss > limit_gib:
                killed.append(rss)
                proc.kill()
                return
            time.sleep(0.2)
    except psutil.Error:
        return


def spawn(name: str, seqs: int, tokens: int, args: argparse.Namespace, limit_gib: float) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child", name,
        "--seqs", str(seqs),
        "--tokens", str(tokens),
        "--device", args.device,
        "--train-dtype", args.train_dtype,
        *(["--quick"] if args.quick else []),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[float] = []
    if args.device == "cpu":
        threading.Thread(target=_watch, args=(proc, limit_gib, killed), daemon=True).start()
    out, err = proc.communicate()
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), "wall_s": time.monotonic() - t0}
    if killed:
        return {"error": f"killed: RSS reached {killed[0]:.1f} GiB (budget {limit_gib:.1f})"}
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return {"error": f"failed (exit {proc.returncode}): {tail[:120]}"}


def plan_tokens(row: Row, seqs: int, tokens: int, budget: float) -> int | None:
    """``tokens``, or the largest halving of it (≥ 64) whose estimate fits ``budget``."""
    while tokens >= 64:
        if estimate_gib(row, seqs, tokens) <= budget:
            return tokens
        tokens //= 2
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--quick", action="store_true", help="a tiny model, 4 × 64 tokens: seconds")
    ap.add_argument("--rows", nargs="+", help=f"rows to run, of: {', '.join(ROWS)}")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per sequence (1024)")
    ap.add_argument("--seqs", type=int, default=None, help="sequences (8)")
    ap.add_argument("--tokens-1.5b", dest="tokens_15", type=int, default=256)
    ap.add_argument("--headroom-gib", type=float, default=4.0)
    ap.add_argument("--train-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    seqs = args.seqs or (4 if args.quick else 8)
    tokens = args.tokens or (64 if args.quick else 1024)
    if args.child:
        args.seqs, args.tokens = seqs, tokens
        return _child_main(args)

    rows = _quick_rows() if args.quick else ROWS
    names = args.rows or list(rows)
    unknown = [n for n in names if n not in rows]
    if unknown:
        sys.exit(f"unknown row {unknown[0]!r}: choose from {', '.join(rows)}")
    print(
        f"device {args.device}, {args.train_dtype}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}, available {available_gib(args.device):.1f} GiB, "
        f"headroom {args.headroom_gib} GiB",
        flush=True,
    )
    print(f"{'row':26} {'seqs×tokens':>12} {'est GiB':>8} {'peak GiB':>9} {'update s':>9}  note")
    for name in names:
        row = rows[name]
        want = args.tokens_15 if row.model == "1.5b" else tokens
        budget = available_gib(args.device) - args.headroom_gib
        n = plan_tokens(row, seqs, want, budget)
        if n is None:
            need = estimate_gib(row, seqs, 64)
            print(f"{name:26} {'':>12} {need:8.1f} {'':>9} {'':>9}  not run: needs ~{need:.1f} GiB")
            continue
        est = estimate_gib(row, seqs, n)
        note = (
            ""
            if n == want
            else f"at {n} tokens: {want} needs ~{estimate_gib(row, seqs, want):.0f} GiB"
        )
        r = spawn(name, seqs, n, args, budget + args.headroom_gib / 2)
        if "error" in r:
            print(
                f"{name:26} {seqs:>4}×{n:<7} {est:8.1f} {'':>9} {'':>9}  {r['error']}", flush=True
            )
            continue
        print(
            f"{name:26} {seqs:>4}×{n:<7} {est:8.1f} {r['peak_mib'] / 1024:9.2f} "
            f"{r['seconds']:9.1f}  {note or 'before the update: %.2f GiB' % (r['before_update_mib'] / 1024)}",
            flush=True,
        )
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
