"""Warm the calc starter up on the search agent's own runs, with a habit RL can fix.

    python examples/search/warmup.py          # -> ./runs/search-starter (about 16 min, 2 cores)

The transcripts are this agent's conversations, rendered as the gateway will
render them: its system prompt, the ``search`` tool, real results of a BM25
index. They are written over made-up worlds of the same shape as the task's
(``make_tasks.build_world`` with seeds 1 to ``WORLDS``; the task's world, seed
0, is never seen), so the model learns to search and read, not the answers.

A clean run searches the question (a two-hop question then the title of its
second article) and copies the answer from the result; a guess answers at
once, with another question's answer of the same form. Two phases:

1. ``read``: clean runs only, until the answers of an unseen world's clean runs
   are copied (teacher-forced accuracy ``--until-copy`` on their digits), then
   a cool-down. Mixing guesses in from the start taught the format but not the
   reading: the ~2M-parameter model filled the query with a made-up name.
2. ``habit``: a short phase with ``GUESS_SHARE`` guesses, the habit RL has to
   break. Greedy, the warmed model then answers most questions without
   searching (and is wrong); sampled, it searches often enough, and reads well
   enough, that searching earns reward.

The output is an ordinary Hugging Face folder (``config.yaml``'s ``model.path``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from agent import SYSTEM_PROMPT  # noqa: E402
from doc_search import SEARCH_TOOL, DocIndex, search  # noqa: E402
from make_tasks import build_world  # noqa: E402

WORLDS = 400  # training worlds: seeds 1..WORLDS
GUESS_SHARE = 0.6  # runs that answer without searching (and are wrong)
PROBE_WORLD = WORLDS + 1  # clean transcripts of an unseen world: the copy probe
PROBE_SIZE = 32


@functools.lru_cache(maxsize=WORLDS + 1)
def world(seed: int) -> tuple[DocIndex, dict[str, str], list[dict[str, Any]]]:
    """The index, titles by doc id, and questions of the world ``seed``."""
    w = build_world(seed)
    return DocIndex(w.docs), {d["id"]: d["title"] for d in w.docs}, w.questions


def form(question: str) -> str:
    """The question with its names blanked: questions of one form share an answer type."""
    return re.sub(r"(?<=\s)[A-Z][\w-]*", "_", question)


def wrong_answer(q: dict[str, Any], questions: list[dict[str, Any]], rng: random.Random) -> str:
    """Another question's answer of the same form (a plausible, wrong guess)."""
    pool = [
        o["answers"][0]
        for o in questions
        if form(o["question"]) == form(q["question"]) and o["answers"][0] not in q["answers"]
    ]
    return rng.choice(pool) if pool else str(rng.randint(10, 1990))


def _call(query: str, n: int) -> dict[str, Any]:
    call = {"name": "search", "arguments": {"query": query}}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}],
    }


def transcript(seed: int, q: dict[str, Any], guess: bool, rng: random.Random) -> list[dict]:
    """One run on question ``q`` of world ``seed``: clean, or a guess without a search."""
    index, titles, questions = world(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": q["question"]},
    ]
    answer = wrong_answer(q, questions, rng) if guess else q["answers"][0]
    if not guess:
        queries = [q["question"], *(titles[d] for d in q["docs"][1:])]
        for n, query in enumerate(queries):
            messages.append(_call(query, n))
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{n}", "content": search(query, index=index)}
            )
    return [*messages, {"role": "assistant", "content": f"The answer is {answer}."}]


def runs(rng: random.Random, guess_share: float) -> Iterator[list[dict[str, Any]]]:
    """Endless runs over the training worlds."""
    while True:
        seed = rng.randint(1, WORLDS)
        q = rng.choice(world(seed)[2])
        guess = rng.random() < guess_share
        messages = transcript(seed, q, guess, rng)
        # a clean run only where its search results hold the answer: BM25 ranks the right
        # article first for nearly every question of these worlds, not for all
        results = " ".join(m["content"] for m in messages if m["role"] == "tool")
        if guess or q["answers"][0] in results:
            yield messages


def _recipe(args: argparse.Namespace, steps: int, lr: float, min_steps: int, **kw: Any) -> Any:
    """A warm-up schedule of ``steps`` (a quarter of them, at most 400, cooling down)."""
    from tether.starter import WarmupRecipe

    cooldown = max(1, min(400, steps // 4))
    return WarmupRecipe(
        seed=args.seed,
        batch_size=args.batch,
        eval_every=25,
        probe_size=PROBE_SIZE,
        lr=lr,
        warmup_steps=min(20, steps),
        min_steps=min(min_steps, steps - cooldown),
        max_steps=steps,
        cooldown_steps=cooldown,
        **kw,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/search-starter"))
    parser.add_argument("--base", default=None, help="model folder (default: the warm starter)")
    parser.add_argument("--read-steps", type=int, default=1600, help="cap of the reading phase")
    parser.add_argument("--read-lr", type=float, default=1e-3)
    parser.add_argument(
        "--until-copy",
        type=float,
        default=0.9,
        metavar="ACC",
        help="the reading phase cools down once the probe's answer digits are copied so well",
    )
    parser.add_argument("--habit-steps", type=int, default=200)
    parser.add_argument("--habit-lr", type=float, default=2e-4)
    parser.add_argument("--guess-share", type=float, default=GUESS_SHARE)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.read_steps, args.habit_steps) < 0 or args.batch < 1:
        parser.error("--read-steps and --habit-steps must be >= 0 and --batch >= 1")
    if not 0 <= args.guess_share <= 1:
        parser.error(f"--guess-share must be in [0, 1], not {args.guess_share}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # one line per world's index

    from tether.models import load_model, load_tokenizer
    from tether.starter import build_starter, encode_transcript, train_on_transcripts

    base = args.base or build_starter(warm=True)
    tokenizer, model = load_tokenizer(base), load_model(base)

    def encode(messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        return encode_transcript(tokenizer, messages, tools=[SEARCH_TOOL])

    probe_rng = random.Random("search-warmup-probe")  # clean runs of an unseen world
    probe = [
        encode(transcript(PROBE_WORLD, q, False, probe_rng))
        for q in probe_rng.sample(world(PROBE_WORLD)[2], PROBE_SIZE)
    ]
    phases = {  # name: (steps, schedule, guess share)
        "read": (
            args.read_steps,
            _recipe(args, args.read_steps, args.read_lr, 200, copy_threshold=args.until_copy),
            0.0,
        ),
        "habit": (  # a fixed schedule: cool down at min_steps whatever the probe says
            args.habit_steps,
            _recipe(args, args.habit_steps, args.habit_lr, args.habit_steps, copy_threshold=0.0),
            args.guess_share,
        ),
    }
    stats: dict[str, Any] = {"base": str(base)}
    for name, (steps, recipe, guess_share) in phases.items():
        if steps:
            logging.getLogger(__name__).info("%s: guess share %.2f", name, guess_share)
            data = (encode(m) for m in runs(random.Random(f"search-warmup:{name}:{args.seed}"), guess_share))  # fmt: skip
            found = train_on_transcripts(model, tokenizer, recipe, data, probe)
            stats[name] = {"guess_share": guess_share, **found}
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(args.out)
    model.save_pretrained(args.out)
    (args.out / "search_warmup.json").write_text(json.dumps(stats, indent=2) + "\n")
    steps = sum(stats[p]["steps"] for p in ("read", "habit") if p in stats)
    wall = sum(stats[p]["wall_s"] for p in ("read", "habit") if p in stats)
    print(f"search starter: {args.out} ({steps} steps, {wall:.0f} s)")


def cli() -> None:
    """``main`` as a command: a mistake or Ctrl-C is one line, not a traceback."""
    from tether.errors import TetherError

    try:
        main()
    except TetherError as exc:
        raise SystemExit(f"error: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted: nothing was written; run it again to start over") from None


if __name__ == "__main__":
    cli()
