"""Supervised warm-up of the starter model on synthetic calc transcripts.

Transcripts are rendered with the chat template exactly as the agent's
requests will be (system prompt + calculator tool + question, the tool call,
the tool result, the final answer); the loss covers only the assistant turns
(each ending with ``<|im_end|>``). The data is deliberately imperfect — about
45% clean transcripts, the rest skip the tool, call it with a wrong
expression, or miscopy its result — so the warmed-up model's greedy answers
are mostly right but its sampled ones often are not, leaving RL room.

Copying numbers (question → expression, tool result → answer) is learned
suddenly rather than gradually, so the learning rate stays constant until a
teacher-forced probe shows copying works, then cools down for a fixed number
of steps; ``max_steps`` caps the whole run.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from tether._hf import shared_prefix_forward
from tether.starter import calc
from tether.starter._errors import StarterError
from tether.starter._template import IM_END

__all__ = ["WarmupRecipe", "encode_transcript", "train_on_transcripts", "warm_up"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmupRecipe:
    """Hyper-parameters of the warm-up (part of the warm cache key)."""

    seed: int = 0
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    min_steps: int = 400
    max_steps: int = 2400  # cap, including the cool-down
    cooldown_steps: int = 300
    final_lr_ratio: float = 0.1
    eval_every: int = 50
    probe_size: int = 64
    copy_threshold: float = 0.9  # teacher-forced accuracy on number tokens
    mix: tuple[tuple[str, float], ...] = (
        ("clean", 0.45),
        ("skip_tool", 0.15),
        ("wrong_expression", 0.20),
        ("miscopy", 0.20),
    )
    # Problems of these kinds get ``guess_mix`` instead: the teacher mostly answered
    # them in its head (and wrongly), so the warmed-up agent does too, greedy included.
    guess_kinds: tuple[str, ...] = ("mul", "div", "muladd", "summul")
    guess_mix: tuple[tuple[str, float], ...] = (("skip_tool", 0.7), ("clean", 0.3))
    threads: int = 2  # torch threads while warming up: CPU sums depend on the count
    bf16: bool = False  # autocast is slower than fp32 here (301 vs 232 ms a step of 16)

    def __post_init__(self) -> None:
        for name, mix in (("mix", self.mix), ("guess_mix", self.guess_mix)):
            kinds = {k for k, _ in mix}
            if not kinds <= set(calc.TRANSCRIPT_KINDS):
                raise ValueError(
                    f"{name} kinds {sorted(kinds)} must be among {calc.TRANSCRIPT_KINDS}"
                )
            if not math.isclose(sum(w for _, w in mix), 1.0):
                raise ValueError(f"{name} weights ({[w for _, w in mix]}) must sum to 1")
        if not set(self.guess_kinds) <= set(calc.KINDS):
            raise ValueError(f"guess_kinds {self.guess_kinds} must be among {calc.KINDS}")
        if self.threads < 1:
            raise ValueError(f"threads ({self.threads}) must be >= 1")
        if self.min_steps + self.cooldown_steps > self.max_steps:
            raise ValueError(
                f"min_steps ({self.min_steps}) + cooldown_steps ({self.cooldown_steps}) "
                f"must be <= max_steps ({self.max_steps})"
            )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def encode_transcript(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Sequence[dict[str, Any]] = (calc.CALCULATOR_TOOL,),
) -> tuple[list[int], list[int]]:
    """Render ``messages`` with ``tools`` (the calc tool by default) and return ``(ids,
    mask)``; ``mask`` is 1 on assistant tokens (after each ``<|im_start|>assistant\\n``,
    through ``<|im_end|>``)."""
    text = tokenizer.apply_chat_template(messages, tools=list(tools), tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    mask = [0] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i : i + len(header)] == header:
            j = i + len(header)
            while j < len(ids):
                mask[j] = 1
                if ids[j] == im_end:
                    break
                j += 1
            i = j
        i += 1
    return ids, mask


@dataclass
class _Batch:
    """Rows sharing ``prefix`` (often the whole system turn), then right-padded suffixes."""

    prefix: torch.Tensor  # (P,) ids common to every row
    input_ids: torch.Tensor  # (B, T) the suffixes
    attention_mask: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T), -100 where not trained


def _collate(rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> _Batch:
    common = min(len(ids) for ids, _ in rows) - 1
    first = rows[0][0]
    for ids, mask in rows:
        common = next((i for i in range(common) if ids[i] != first[i] or mask[i]), common)
    width = max(len(ids) for ids, _ in rows) - common
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (ids, mask) in enumerate(rows):
        tail, tail_mask = torch.tensor(ids[common:]), torch.tensor(mask[common:])
        input_ids[r, : len(tail)] = tail
        attention[r, : len(tail)] = 1
        labels[r, : len(tail)] = torch.where(tail_mask == 1, tail, -100)
    return _Batch(torch.tensor(first[:common], dtype=torch.long), input_ids, attention, labels)


def _hidden(model: torch.nn.Module, batch: _Batch) -> torch.Tensor:
    """Last hidden states of the suffixes ``(B, T, H)``; the shared prefix runs once
    (batch 1) and its keys/values are repeated, with gradients, so the result equals
    a full forward of every row."""
    rows = batch.input_ids.shape[0]
    attention = torch.cat(
        [torch.ones((rows, len(batch.prefix)), dtype=torch.long), batch.attention_mask], dim=1
    )
    out = shared_prefix_forward(model.model, batch.prefix, batch.input_ids, attention)
    return out.last_hidden_state


def _loss(model: torch.nn.Module, batch: _Batch) -> torch.Tensor:
    """Mean cross-entropy over the trained (assistant) tokens; logits only where trained."""
    hidden = _hidden(model, batch)[:, :-1]
    target = batch.labels[:, 1:]
    trained = target != -100
    head: Any = model.lm_head
    logits = head(hidden[trained]).float()
    return torch.nn.functional.cross_entropy(logits, target[trained])


def _transcripts(
    tokenizer: Any, recipe: WarmupRecipe, seed: str, kinds: bool
) -> Iterator[tuple[list[int], list[int]]]:
    """Endless encoded transcripts of train problems: the recipe's mix, or all clean."""
    rng = random.Random(f"tether-warmup:{seed}:{recipe.seed}")
    for problem, kind in plan(recipe, seed, rng):
        yield encode_transcript(
            tokenizer, calc.transcript(problem, kind if kinds else "clean", rng)
        )


def plan(recipe: WarmupRecipe, seed: str, rng: random.Random) -> Iterator[tuple[calc.Problem, str]]:
    """Endless ``(problem, transcript kind)``: ``guess_mix`` for the guess kinds, else ``mix``."""
    mixes = {
        guess: tuple(zip(*(recipe.guess_mix if guess else recipe.mix), strict=True))
        for guess in (False, True)
    }
    for problem in calc.iter_problems("train", seed=_stream_seed(seed, recipe.seed)):
        names, weights = mixes[problem.kind in recipe.guess_kinds]
        yield problem, rng.choices(names, weights)[0]


def _stream_seed(name: str, seed: int) -> int:
    """A stable integer seed from a stream name and a seed."""
    return sum((i + 1) * ord(c) for i, c in enumerate(name)) * 1_000_003 + seed


def _lr_at(step: int, recipe: WarmupRecipe, cool_from: int | None) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    if cool_from is None or step < cool_from:
        return recipe.lr
    frac = min(1.0, (step - cool_from) / recipe.cooldown_steps)
    ratio = recipe.final_lr_ratio + (1 - recipe.final_lr_ratio) * 0.5 * (
        1 + math.cos(math.pi * frac)
    )
    return recipe.lr * ratio


@torch.no_grad()
def copy_accuracy(
    model: torch.nn.Module, batch: _Batch, digit_ids: torch.Tensor
) -> tuple[float, float]:
    """Teacher-forced argmax accuracy on (number tokens, all tokens) of the assistant turns."""
    was_training = model.training
    model.eval()
    head: Any = model.lm_head
    logits = head(_hidden(model, batch))
    model.train(was_training)
    pred = logits[:, :-1].argmax(-1)
    target = batch.labels[:, 1:]
    trained = target != -100
    digits = trained & digit_ids[target.clamp(min=0)]
    hit = pred == target
    return float(hit[digits].float().mean()), float(hit[trained].float().mean())


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """Run with ``n`` torch threads: a CPU matmul's float sums are split by thread, so
    the same recipe with another thread count trains a (slightly, then visibly) other
    model. With the count fixed, the same recipe gives the same weights on the same
    torch version and CPU kind (both part of the cache key)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def warm_up(model: torch.nn.Module, tokenizer: Any, recipe: WarmupRecipe) -> dict[str, Any]:
    """Train ``model`` in place on synthetic calc transcripts; return summary statistics."""
    probe = _transcripts(tokenizer, recipe, "probe", kinds=False)
    data = _transcripts(tokenizer, recipe, "train", kinds=True)
    return train_on_transcripts(
        model, tokenizer, recipe, data, [next(probe) for _ in range(recipe.probe_size)]
    )


def train_on_transcripts(
    model: torch.nn.Module,
    tokenizer: Any,
    recipe: WarmupRecipe,
    data: Iterator[tuple[list[int], list[int]]],
    probe_rows: Sequence[tuple[list[int], list[int]]],
) -> dict[str, Any]:
    """Train ``model`` in place on the encoded transcripts ``data`` (``(ids, mask)``, see
    :func:`encode_transcript`) with the recipe's schedule: constant rate until the
    teacher-forced accuracy on the number tokens of ``probe_rows`` (clean transcripts)
    reaches ``copy_threshold``, then the cool-down. Returns summary statistics."""
    started = time.monotonic()
    pad_id = int(tokenizer.pad_token_id)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    digit_ids = torch.tensor([t.isdigit() for t in vocab])
    probe = _collate(probe_rows, pad_id)

    with torch.random.fork_rng(devices=[]), _threads(recipe.threads):
        torch.manual_seed(recipe.seed)
        opt = torch.optim.AdamW(
            model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay
        )
        model.train()
        cool_from: int | None = None  # the step the cool-down starts
        learned_at: int | None = None  # the step copying passed the threshold
        copy_acc = 0.0
        history: list[dict[str, float]] = []
        losses: list[float] = []
        step = 0
        while step < recipe.max_steps:
            if cool_from is None and step >= recipe.max_steps - recipe.cooldown_steps:
                cool_from = step  # copying never showed up: cool down anyway
                logger.warning(
                    "copy accuracy %.3f is below %.2f at the step cap; cooling down anyway",
                    copy_acc, recipe.copy_threshold,
                )  # fmt: skip
            if cool_from is not None and step >= cool_from + recipe.cooldown_steps:
                break
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, recipe, cool_from)
            batch = _collate([next(data) for _ in range(recipe.batch_size)], pad_id)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
                loss = _loss(model, batch)
            if not torch.isfinite(loss):
                raise StarterError(f"warm-up loss is {loss.item()} at step {step}; lower lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            step += 1
            if step % recipe.eval_every == 0 or step == recipe.max_steps:
                copy_acc, token_acc = copy_accuracy(model, probe, digit_ids)
                recent = sum(losses[-recipe.eval_every :]) / len(losses[-recipe.eval_every :])
                history.append(
                    {"step": step, "loss": recent, "copy_acc": copy_acc, "token_acc": token_acc}
                )
                logger.info(
                    "warm-up step %d  loss %.3f  copy acc %.3f  token acc %.3f  lr %.1e  %.0fs",
                    step, recent, copy_acc, token_acc, opt.param_groups[0]["lr"],
                    time.monotonic() - started,
                )  # fmt: skip
                if (
                    cool_from is None
                    and step >= recipe.min_steps
                    and copy_acc >= recipe.copy_threshold
                ):
                    cool_from = learned_at = step
    model.eval()
    return {
        "steps": step,
        "copy_learned_at": learned_at,
        "final_copy_acc": copy_acc,
        "losses_first_last": [losses[0], losses[-1]] if losses else [],
        "history": history,
        "wall_s": round(time.monotonic() - started, 1),
    }
