"""What grammar-constrained decoding costs: compile time, mask time, engine tokens/s.

Three tables, all on the starter model and tokenizer (or ``--model``):

1. **libraries** — xgrammar vs llguidance on the same tokenizer and schema:
   tokenizer set-up, grammar compile up to the first mask (five schemas that
   differ, so nothing is cached), and the per-step mask (fill every row's bitmask + apply it to the
   logits) at batch 1 and 16 along a random walk through the grammar.
2. **compile** — tether's ``GrammarBook``: a schema's first compile (cold) vs
   every later lookup (cached); then the **sampling step alone** (the engine's
   sampler on random logits, without and with the masks and matcher advance):
   what a constrained step adds, free of the model's noise.
3. **engine** — ``TransformersEngine`` generated tokens/s at 1 and 16
   concurrent requests, without and with a JSON schema, interleaved
   (A B A B …, ``--rounds`` each); every request generates exactly
   ``--max-tokens`` tokens (EOS ignored; the schema's string is longer than
   that), so the two differ only by the grammar. Goal: under 10% slower per
   token at 16.

    .venv/bin/python benchmarks/constrained.py [--rounds 5] [--max-tokens 64]
        [--model PATH] [--skip-libraries]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from typing import Any

import torch

from tether.engine import Constraint, SamplingParams, TransformersEngine, json_schema_format

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "kind": {"enum": ["person", "company"]},
    },
    "required": ["name", "age", "tags", "address", "kind"],
    "additionalProperties": False,
}


def long_schema(max_tokens: int) -> dict[str, Any]:
    """One string of at least 32 characters per token (no token of the starter's is longer):
    every request runs to the limit, constrained or not."""
    text = {"type": "string", "minLength": 32 * max_tokens, "maxLength": 64 * max_tokens}
    return {"type": "object", "properties": {"text": text}, "required": ["text"]}


def variant(i: int) -> dict[str, Any]:
    schema = json.loads(json.dumps(SCHEMA))
    schema["properties"][f"extra_{i}"] = {"type": "number"}
    return schema


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


# -- 1. the libraries --------------------------------------------------------------------


def _walk(fill: Any, accept: Any, done: Any, matchers: list[Any], bitmask: Any) -> float:
    """Mean seconds per step of fill+apply over a random walk of 60 steps, after the first
    (llguidance builds its lexer lazily: its first mask is counted with its compile)."""
    rng, total = random.Random(0), 0.0
    for step in range(61):
        t0 = time.perf_counter()
        logits = fill(matchers, bitmask)
        total += (time.perf_counter() - t0) if step else 0.0
        for b, m in enumerate(matchers):
            if not done(m):
                allowed = torch.isfinite(logits[b]).nonzero().flatten().tolist()
                accept(m, rng.choice(allowed))
    return total / 60


def bench_libraries(tokenizer: Any, vocab: int) -> list[tuple[str, str, str, str, str]]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lgt
    import xgrammar as xgr

    rows = []
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    x_init = time.perf_counter() - t0
    compiles, grammar = [], None
    for i in range(5):
        t0 = time.perf_counter()
        grammar = compiler.compile_json_schema(json.dumps(variant(i)), any_whitespace=False)
        xgr.GrammarMatcher(grammar).fill_next_token_bitmask(xgr.allocate_token_bitmask(1, vocab))
        compiles.append(time.perf_counter() - t0)

    def x_fill(matchers: list[Any], bitmask: Any) -> torch.Tensor:
        for b, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, b)
        logits = torch.randn(len(matchers), vocab)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        return logits

    x_steps = []
    for batch in (1, 16):
        matchers = [xgr.GrammarMatcher(grammar) for _ in range(batch)]
        x_steps.append(
            _walk(x_fill, lambda m, t: m.accept_token(t), lambda m: m.is_terminated(),
                  matchers, xgr.allocate_token_bitmask(batch, vocab))
        )  # fmt: skip
    rows.append(("xgrammar", ms(x_init), ms(statistics.median(compiles)), *map(ms, x_steps)))

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    l_init = time.perf_counter() - t0
    compiles = []
    for i in range(5):
        t0 = time.perf_counter()
        spec = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(variant(i)), defaults={"whitespace_flexible": False}
        )
        matcher = llguidance.LLMatcher(lltok, spec)
        assert not matcher.is_error(), matcher.get_error()
        lgt.fill_next_token_bitmask(matcher, lgt.allocate_token_bitmask(1, vocab), 0)
        compiles.append(time.perf_counter() - t0)

    def l_fill(matchers: list[Any], bitmask: Any) -> torch.Tensor:
        for b, m in enumerate(matchers):
            lgt.fill_next_token_bitmask(m, bitmask, b)
        logits = torch.randn(len(matchers), vocab)
        lgt.apply_token_bitmask_inplace(logits, bitmask)
        return logits

    l_steps = []
    for batch in (1, 16):
        matchers = [llguidance.LLMatcher(lltok, spec) for _ in range(batch)]
        l_steps.append(
            _walk(l_fill, lambda m, t: m.consume_token(t), lambda m: m.is_stopped(),
                  matchers, lgt.allocate_token_bitmask(batch, vocab))
        )  # fmt: skip
    rows.append(("llguidance", ms(l_init), ms(statistics.median(compiles)), *map(ms, l_steps)))
    return rows


# -- 2. compile, cold and cached ------------------------------------------------------------


def bench_compile(engine: TransformersEngine) -> tuple[float, float]:
    book = engine.grammars()
    cold, cached = [], []
    for i in range(5):
        constraint = Constraint.of(json_schema_format(variant(100 + i)), "bench")
        t0 = time.perf_counter()
        book.grammar(constraint)
        cold.append(time.perf_counter() - t0)
        for _ in range(20):
            t0 = time.perf_counter()
            book.grammar(constraint)
            cached.append(time.perf_counter() - t0)
    return statistics.median(cold), statistics.median(cached)


# -- 3. the sampler's step, alone --------------------------------------------------------------


def bench_step(engine: TransformersEngine, rows: int, iters: int = 200) -> tuple[float, float]:
    """Seconds per sampling step of ``rows`` rows without / with masks (fill, copy, apply,
    sample, advance the matchers), interleaved; each matcher is reset when it terminates."""
    from tether.engine._constraint import masked_logits
    from tether.engine._sampling import sample_rows

    book = engine.grammars()
    constraint = Constraint.of(json_schema_format(SCHEMA), "bench")
    matchers = [book.matcher(constraint) for _ in range(rows)]
    vocab = engine.model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(0)
    temps, top_p = torch.ones(rows), torch.ones(rows)
    plain, guided = [], []
    for _ in range(iters):
        logits = torch.randn(rows, vocab, generator=gen)
        uniforms = torch.rand(rows, generator=gen)
        t0 = time.perf_counter()
        sample_rows(logits, temps, top_p, uniforms)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        masked = masked_logits(book, logits, matchers)
        out = sample_rows(logits, temps, top_p, uniforms, 0, masked)
        for m, token in zip(matchers, out.tokens, strict=True):
            m.accept_token(token)
        guided.append(time.perf_counter() - t0)
        for m in matchers:
            if m.is_terminated():
                m.reset()
    return statistics.median(plain), statistics.median(guided)


# -- 4. the engine ---------------------------------------------------------------------------


async def one_round(
    engine: TransformersEngine, prompts: list[list[int]], params: SamplingParams
) -> float:
    """Generated tokens per second of ``len(prompts)`` concurrent requests."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    wall = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for r in results for c in r.completions)
    assert tokens == len(prompts) * params.max_tokens, tokens
    return tokens / wall


async def bench_engine(
    engine: TransformersEngine, rounds: int, max_tokens: int
) -> list[tuple[int, float, float]]:
    constraint = Constraint.of(json_schema_format(long_schema(max_tokens)), "bench")
    vocab = engine.model.get_input_embeddings().num_embeddings
    out = []
    for conc in (1, 16):
        rng = random.Random(conc)
        prompts = [[rng.randrange(3, vocab) for _ in range(64)] for _ in range(conc)]
        plain = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
        guided = SamplingParams(
            temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=0, constraint=constraint
        )
        await one_round(engine, prompts, plain)  # warm-up: prefix cache, grammar compile
        await one_round(engine, prompts, guided)
        a, b = [], []
        for _ in range(rounds):
            a.append(await one_round(engine, prompts, plain))
            b.append(await one_round(engine, prompts, guided))
        out.append((conc, statistics.median(a), statistics.median(b)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default=None, help="a model folder (default: the starter)")
    ap.add_argument("--skip-libraries", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.model is None:
        from tether.starter import build_starter

        args.model = str(build_starter())
    engine = TransformersEngine.from_pretrained(args.model, dtype=torch.float32, seed=0)
    vocab = engine.model.get_input_embeddings().num_embeddings
    print(f"model {args.model} (vocab {vocab}), torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    try:
        if not args.skip_libraries:
            print("\n| library | tokenizer set-up | compile + first mask (median of 5) | mask/step, 1 row "
                  "| mask/step, 16 rows |\n|---|---|---|---|---|")  # fmt: skip
            for row in bench_libraries(engine.tokenizer, vocab):
                print("| " + " | ".join(row) + " |")
        cold, cached = bench_compile(engine)
        print(f"\ncompile through GrammarBook: cold {ms(cold)}, cached {cached * 1e6:.1f} µs")
        print("\nsampling step alone (median of 200, interleaved)\n| rows | no schema | schema "
              "| added per step |\n|---|---|---|---|")  # fmt: skip
        for n in (1, 16):
            plain, guided = bench_step(engine, n)
            print(f"| {n} | {ms(plain)} | {ms(guided)} | {ms(guided - plain)} |")
        rows = asyncio.run(bench_engine(engine, args.rounds, args.max_tokens))
        print(f"\nengine, {args.max_tokens} tokens per request, T=1, median of {args.rounds} "
              "interleaved rounds\n| concurrent | no schema tok/s | schema tok/s | slower per "
              "token |\n|---|---|---|---|")  # fmt: skip
        for conc, plain, guided in rows:
            print(f"| {conc} | {plain:.0f} | {guided:.0f} | {100 * (plain / guided - 1):+.1f}% |")
    finally:
        asyncio.run(engine.close())


if __name__ == "__main__":
    main()
