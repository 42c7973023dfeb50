"""The transformers engine's scheduler: one worker thread, continuous batching.

Each loop the worker takes what the asyncio side queued (requests, weight
updates, the stop signal), admits waiting requests up to ``max_batch_size``
rows (``n`` samples of a prompt, and identical prompts, are rows sharing one
prefill), prefills them as one left-padded batch — each prompt on the longest
prefix the prefix cache holds for it (``_prefix.py``) — merges them into the
running batch, decodes one token for every row and retires finished rows,
caching their KV for the agent's next call. With ``adapters`` (a peft model
serving several LoRA adapters, see ``TransformersEngine``) every row runs
with its request's adapter in the one batch. Requests that
arrive mid-generation thus join at the next step. Results go back to the
callers' event loops with ``loop.call_soon_threadsafe``; any failure fails
the affected futures with :class:`EngineFailed`, so none hangs.

A failure of a step fails only that step's requests. Should the thread itself die (an
exception the step does not catch: a ``BaseException`` such as ``SystemExit`` raised by
a library or injected into the thread, or a fault in the scheduler's own bookkeeping),
:attr:`Scheduler.died` keeps the exception, every request queued or running fails with
:class:`EngineLost`, and the engine reports itself lost (``TransformersEngine.outage``).

``weights_lock`` is held while a step reads the weights: an owner that writes
them in place from another thread (a trainer sharing the model, see
``TransformersEngine.weights_lock``) takes it too, so no forward sees half a
step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from tether._hf import cache_kwarg
from tether.engine._batch import KVBatch
from tether.engine._constraint import masked_logits
from tether.engine._prefix import Prefix, PrefixCache
from tether.engine._protocol import (
    BASE_ADAPTER,
    Completion,
    EngineFailed,
    EngineLost,
    GenerateResult,
    Outage,
    SamplingParams,
)
from tether.engine._sampling import StopChecker, sample_rows
from tether.engine._stream import TokenDelta

__all__ = ["STOP", "EngineStats", "Request", "Scheduler"]

logger = logging.getLogger(__name__)


STOP = object()  # queued by close()


@dataclass
class EngineStats:
    """Counters kept by the worker; ``batch_sizes`` holds the rows of recent decode steps."""

    steps: int = 0
    prefills: int = 0
    tokens: int = 0
    prefix_hits: int = 0  # prompts prefilled on a cached prefix
    prefix_tokens: int = 0  # prompt tokens not recomputed thanks to it
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    prefill_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))


@dataclass(eq=False)
class Request:
    """One generate call as the worker sees it."""

    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    future: asyncio.Future[GenerateResult]
    loop: asyncio.AbstractEventLoop
    submitted: float = field(default_factory=time.perf_counter)
    completions: list[Completion | None] = field(default_factory=list)
    version: int = 0
    cancelled: bool = False
    grammar: Any = None  # the compiled grammar of params.constraint (engine's GrammarBook)
    on_token: Any = None  # streamed requests: called (in the worker) with each TokenDelta


@dataclass(eq=False)
class _Row:
    req: Request
    index: int
    generator: torch.Generator | None
    checker: StopChecker | None
    matcher: Any = None  # the grammar matcher of a constrained row
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[dict[int, float]] = field(default_factory=list)


def settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if not fut.done():
        fut.set_exception(error) if error is not None else fut.set_result(result)


class Scheduler(threading.Thread):
    """The worker thread. ``version`` is the policy version of the loaded weights."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int,
        max_len: int,
        pad_id: int,
        rng: torch.Generator,
        prefix_cache_tokens: int = 32_768,
        max_prefill_tokens: int = 16_384,
        grammars: Any = None,
        adapters: bool = False,
    ):
        super().__init__(name="tether-engine", daemon=True)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_len = max_len
        self.pad_id = pad_id
        self.rng = rng
        self.grammars = grammars  # a GrammarBook, set by the engine on its first constraint
        self.version = 0
        self.adapters = adapters  # rows name their peft adapter in every forward
        self.weights_lock = threading.Lock()
        self.stats = EngineStats()
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._kwarg = cache_kwarg(model)
        self._batch: KVBatch | None = None
        self._rows: list[_Row] = []
        self._admitting: list[Request] = []
        self.prefix = PrefixCache(max_tokens=prefix_cache_tokens) if prefix_cache_tokens else None
        #: what killed the thread (see the module docstring); None while it runs or after close
        self.died: BaseException | None = None
        #: every caller's future not settled yet, with its loop (the engine adds each, its
        #: callback removes it): what a dying thread fails, whatever line it died on (an
        #: item it had just taken from the inbox is in no list of its own yet)
        self.waiters: dict[asyncio.Future[Any], asyncio.AbstractEventLoop] = {}

    def run(self) -> None:
        waiting: deque[Request] = deque()
        try:
            self._serve(waiting)
        except BaseException as exc:  # the thread dies: no request may hang on it
            self.died = exc  # first: a request queued from now on is failed by its caller
            logger.error("the engine's worker thread died: %r", exc, exc_info=exc)
            self._drain(waiting, self.lost_error)

    def outage(self) -> Outage | None:
        """Lost for good once the thread has died (see the module docstring); else None."""
        if self.died is None:
            return None
        why = f"the embedded engine's worker thread died ({self.died!r})"
        return Outage(why, lost=True, fix="its traceback is in the log above")

    def lost_error(self) -> EngineLost:
        outage = self.outage()
        assert outage is not None, "the thread has died"
        return outage.error()

    def _serve(self, waiting: deque[Request]) -> None:
        while True:
            items = [self.inbox.get()] if not (self._rows or waiting) else []
            while True:
                try:
                    items.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                if item is STOP:
                    self._shutdown(waiting)
                    return
                if isinstance(item, Request):
                    waiting.append(item)
                else:
                    self._command(*item)
            try:
                with self.weights_lock, torch.inference_mode():
                    self._admit(waiting)
                    if self._rows:
                        self._decode()
            except Exception as exc:  # never leave a future hanging
                reqs = [r.req for r in self._rows] + self._admitting
                self._batch, self._rows, self._admitting = None, [], []
                self._fail(list(dict.fromkeys(reqs)), exc)

    def _command(self, fn: Any, arg: Any, fut: asyncio.Future[Any], loop: Any) -> None:
        try:
            result, error = fn(arg), None
        except Exception as exc:  # reported to the caller
            result, error = None, exc
        loop.call_soon_threadsafe(settle, fut, result, error)

    def _admit(self, waiting: deque[Request]) -> None:
        free, budget = self.max_batch_size - len(self._rows), self.max_prefill_tokens
        group: list[Request] = []
        while waiting:
            req = waiting[0]
            full = req.params.n > free or len(req.prompt_ids) > budget
            if not req.cancelled and full and (self._rows or group):
                break
            waiting.popleft()
            if not req.cancelled:
                group.append(req)
                free -= req.params.n
                budget -= len(req.prompt_ids)
        if group:
            self._admitting = group
            self._prefill(group)
            self._admitting = []

    def _prefill(self, group: list[Request]) -> None:
        """Prefill ``group`` in one forward: identical prompts once, each on its longest
        cached prefix; then remember each prompt's KV."""
        same: dict[tuple[str | None, tuple[int, ...]], list[Request]] = {}
        for req in group:
            same.setdefault((req.params.adapter, tuple(req.prompt_ids)), []).append(req)
        parts = list(same.values())
        prefixes: list[Prefix | None] = []
        for reqs in parts:
            prefix = None
            if self.prefix is not None:
                with contextlib.suppress(Exception):  # a bad prompt fails in its own prefill
                    prefix = self.prefix.lookup(reqs[0].prompt_ids, reqs[0].params.adapter)
            prefixes.append(prefix)
        self._prefill_parts(parts, prefixes)

    def _prefill_parts(self, parts: list[list[Request]], prefixes: list[Prefix | None]) -> None:
        """Prefill ``parts`` (requests sharing one prompt), the rows of a part on ``prefixes``."""
        try:
            prompts = [reqs[0].prompt_ids for reqs in parts]
            names = self._names([reqs[0] for reqs in parts])
            batch, logits = KVBatch.prefill(
                self.model, self._kwarg, prompts, self.pad_id, prefixes, names
            )
        except Exception as exc:
            if len(parts) > 1:  # find the culprit: retry one by one
                for reqs, prefix in zip(parts, prefixes, strict=True):
                    self._prefill_parts([reqs], [prefix])
                return
            return self._fail(parts[0], exc)
        if self.prefix is not None:
            for b, (reqs, prefix) in enumerate(zip(parts, prefixes, strict=True)):
                self.prefix.store(reqs[0].prompt_ids, batch.row_layers(b), reqs[0].params.adapter)
                if prefix is not None:
                    self.stats.prefix_hits += len(reqs)
                    self.stats.prefix_tokens += len(prefix.tokens) * len(reqs)
        counts = [sum(r.params.n for r in reqs) for reqs in parts]
        batch.repeat(counts)
        logits = logits.repeat_interleave(torch.tensor(counts, device=logits.device), dim=0)
        rows = []
        for req in (r for reqs in parts for r in reqs):
            req.version = self.version
            req.completions = [None] * req.params.n
            for i in range(req.params.n):
                rows.append(self._new_row(req, i))
        self.stats.prefills += 1
        self.stats.prefill_sizes.append(sum(len(reqs) for reqs in parts))
        if self._batch is None:
            self._batch = batch
        else:
            self._batch.merge(batch)
        self._rows.extend(rows)
        self._advance(logits, rows, offset=len(self._rows) - len(rows))

    def _names(self, reqs: list[Request]) -> list[str] | None:
        """Per request its peft adapter name (None: the engine serves no adapters)."""
        if not self.adapters:
            return None
        peft = {None: "default", BASE_ADAPTER: "__base__"}
        return [peft.get(r.params.adapter, r.params.adapter or "default") for r in reqs]

    def _new_row(self, req: Request, index: int) -> _Row:
        p = req.params
        gen = None
        if p.temperature > 0:
            gen = torch.Generator()
            if p.seed is None:
                gen.manual_seed(int(torch.randint(0, 2**62, (), generator=self.rng)))
            else:
                gen.manual_seed((p.seed * 1_000_003 + index) % 2**63)
        checker = StopChecker(p.stop, self.tokenizer) if p.stop else None
        matcher = self.grammars.matcher_of(req.grammar) if req.grammar is not None else None
        return _Row(req, index, gen, checker, matcher)

    def _decode(self) -> None:
        assert self._batch is not None
        last = torch.tensor([r.tokens[-1] for r in self._rows], device=self.model.device)
        try:
            names = self._names([r.req for r in self._rows])
            logits = self._batch.decode(self.model, self._kwarg, last, names)
        except Exception as exc:
            reqs = list(dict.fromkeys(r.req for r in self._rows))
            self._batch, self._rows = None, []
            return self._fail(reqs, exc)
        self.stats.steps += 1
        self.stats.batch_sizes.append(len(self._rows))
        self._advance(logits, self._rows, offset=0)

    def _advance(self, logits: torch.Tensor, rows: list[_Row], offset: int) -> None:
        """Sample a token for ``rows`` (batch rows ``offset:``); retire finished rows."""
        dev = logits.device
        temps = torch.tensor([r.req.params.temperature for r in rows], device=dev)
        top_p = torch.tensor([r.req.params.top_p for r in rows], device=dev)
        draws = [float(torch.rand((), generator=r.generator)) if r.generator else 0.0 for r in rows]
        top_k = max(r.req.params.top_logprobs for r in rows)
        masked = None
        if self.grammars is not None:
            masked = masked_logits(self.grammars, logits, [r.matcher for r in rows])
        out = sample_rows(logits, temps, top_p, torch.tensor(draws, device=dev), top_k, masked)
        self.stats.tokens += len(rows)
        for i, row in enumerate(rows):
            if row.matcher is not None:
                row.matcher.accept_token(out.tokens[i])
            row.tokens.append(out.tokens[i])
            row.logprobs.append(out.logprobs[i])
            if out.top is not None and row.req.params.top_logprobs:
                k = row.req.params.top_logprobs
                row.top.append(dict(list(out.top[i].items())[:k]))
        keep, done = [], False
        for i, row in enumerate(self._rows):
            reason = self._finished(row) if i >= offset else None
            if row.req.cancelled:
                done = True
                continue
            if i >= offset and row.req.on_token is not None:
                self._push(row, reason)
            if reason is None:
                keep.append(i)
            else:
                done = True
                self._remember(i, row)
                self._complete(row, reason)
        if done and keep:
            assert self._batch is not None
            self._batch.select(torch.tensor(keep, device=self._batch.mask.device))
            self._rows = [self._rows[i] for i in keep]
        elif done:
            self._batch, self._rows = None, []

    def _push(self, row: _Row, reason: str | None) -> None:
        top = row.top[-1] if row.req.params.top_logprobs and row.top else None
        row.req.on_token(TokenDelta(row.index, row.tokens[-1], row.logprobs[-1], top, reason))

    def _finished(self, row: _Row) -> str | None:
        p = row.req.params
        if row.tokens[-1] in row.req.stop_ids or (row.checker and row.checker.hit(row.tokens)):
            return "stop"
        if row.matcher is not None and row.matcher.is_terminated():
            return "stop"  # the grammar is complete (it ends with the end-of-turn token)
        if (
            len(row.tokens) >= p.max_tokens
            or len(row.req.prompt_ids) + len(row.tokens) >= self.max_len
        ):
            return "length"
        return None

    def _remember(self, b: int, row: _Row) -> None:
        """Cache batch row ``b``'s KV: its prompt and all but the last sampled token (whose
        KV was never computed) — the next call of an agent usually starts with them."""
        if self.prefix is None or self._batch is None or len(row.tokens) < 2:
            return
        self.prefix.store(
            row.req.prompt_ids + row.tokens[:-1], self._batch.row_layers(b), row.req.params.adapter
        )

    def _complete(self, row: _Row, reason: str) -> None:
        req = row.req
        top = row.top if req.params.top_logprobs else None
        req.completions[row.index] = Completion(row.tokens, row.logprobs, reason, top)
        if all(c is not None for c in req.completions):
            info = {
                "engine": "transformers",
                "prompt_tokens": len(req.prompt_ids),
                "latency_s": time.perf_counter() - req.submitted,
            }
            result = GenerateResult(list(req.completions), req.version, info)  # type: ignore[arg-type]
            self._post(req, result, None)

    def _fail(self, reqs: list[Request], exc: BaseException) -> None:
        logger.warning("engine step failed for %d request(s): %r", len(reqs), exc)
        for req in reqs:
            err = EngineFailed(f"generation failed: {exc!r}")
            err.__cause__ = exc
            self._post(req, None, err)

    def _post(self, req: Request, result: Any, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
            req.loop.call_soon_threadsafe(settle, req.future, result, error)

    def _shutdown(self, waiting: deque[Request]) -> None:
        self._drain(waiting, lambda: EngineFailed("engine closed"))

    def _drain(self, waiting: deque[Request], error: Any) -> None:
        """Fail every request waiting, running or queued, and queued weight updates, with
        ``error()``."""
        rows = [r.req for r in self._rows] + self._admitting
        pending = list(waiting) + list(dict.fromkeys(rows))
        self._batch, self._rows, self._admitting = None, [], []
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Request):
                pending.append(item)
            elif isinstance(item, tuple):  # a pending weight update
                with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                    item[3].call_soon_threadsafe(settle, item[2], None, error())
        for req in pending:
            self._post(req, None, error())
        for fut, loop in list(self.waiters.items()):
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, fut, None, error())
