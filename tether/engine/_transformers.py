"""The embedded engine: a transformers model served with continuous batching.

:class:`TransformersEngine` is the asyncio face; the model runs on one
worker thread (:mod:`tether.engine._scheduler`), so the event loop never
blocks. Concurrent requests share batches: newly arrived requests join the
running batch at the next decode step.

Why not transformers' own continuous batching (``generate_batch``)? In 5.24
its logprobs are taken after top-p truncation (off by the log of the kept
mass), greedy vs sampling is one setting for the whole manager, and there
is no per-request seed, stop string or top-logprobs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from functools import partial
from typing import Any

import torch

from tether.engine._constraint import GrammarBook
from tether.engine._protocol import BASE_ADAPTER, Engine, GenerateResult, Outage, SamplingParams
from tether.engine._rollout_copy import rollout_copy
from tether.engine._scheduler import STOP, EngineStats, Request, Scheduler
from tether.engine._stream import TokenDelta, TokenFeed
from tether.engine._turns import end_of_turn_ids
from tether.engine._weight_push import RoleAdaptersPush, WeightPush
from tether.errors import UserError

__all__ = ["TransformersEngine"]

_END = object()  # queued after a streamed request's last token


class TransformersEngine(Engine):
    """Serve a ``transformers`` causal LM; see the module docstring.

    ``max_batch_size`` bounds the rows decoded together (a request with
    ``n`` samples takes ``n``); ``max_prefill_tokens`` the prompt tokens
    admitted in one step (a longer prompt waits, then runs alone). ``seed``
    seeds the draws of requests that carry none. ``prefix_cache_tokens``
    bounds the KV kept for shared prompt prefixes (0 turns it off). ``stream_interval_s``:
    a streamed request's tokens reach its event loop at most that often (the first at
    once; see ``TokenFeed``). ``stats`` (:class:`EngineStats`)
    records batch sizes and prefix-cache hits, for tests and benchmarks.
    ``SamplingParams.constraint`` is honoured (grammar masks, needs xgrammar).

    ``rollout_dtype`` ``"int8"`` or ``"bfloat16"`` serves a copy of ``model`` quantized
    or cast (:mod:`tether.engine._rollout_copy`), rebuilt from ``model`` after each
    :meth:`update_weights`; ``model`` stays in full precision. None serves ``model``.

    Several LoRA adapters (agent roles with their own adapter, docs/credit.md "Roles"):
    ``model`` a peft model holding them, unmerged. Each request runs with the adapter
    its ``SamplingParams.adapter`` names (None: peft's ``default``, the shared policy;
    :data:`~tether.engine.BASE_ADAPTER`: the base weights alone), rows of different
    adapters in one batch (peft's mixed-batch ``adapter_names``), so continuous
    batching is unchanged; the prefix cache keys on the adapter. :meth:`update_weights`
    then takes ``{adapter name: its peft state dict}``. A plain model refuses a named
    adapter.
    """

    supports_constraints = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
        seed: int | None = None,
        prefix_cache_tokens: int = 32_768,
        max_prefill_tokens: int = 16_384,
        stream_interval_s: float = 0.05,
        rollout_dtype: str | None = None,
    ):
        if max_batch_size < 1:
            raise UserError(f"max_batch_size ({max_batch_size}) must be >= 1")
        model = model.to(device=device, dtype=dtype) if dtype else model.to(device)
        # the LoRA adapters served by name (a peft model's); empty: a plain model
        self.adapters = frozenset(getattr(model, "peft_config", None) or ())
        if self.adapters and rollout_dtype:
            raise UserError("rollout_dtype needs a plain model, not one serving LoRA adapters")
        self._rollout_dtype = rollout_dtype
        # with a rollout dtype, the full-precision weights the copy is rebuilt from
        self._source = model if rollout_dtype else None
        self.model: Any = rollout_copy(model, rollout_dtype) if rollout_dtype else model
        self.model.eval()
        self.tokenizer = tokenizer
        self.stream_interval_s = float(stream_interval_s)
        self._vocab = self.model.get_input_embeddings().num_embeddings
        if tokenizer is not None and len(tokenizer) > self._vocab:
            raise UserError(
                f"the tokenizer has {len(tokenizer)} tokens but the model's embedding only "
                f"{self._vocab} rows (vocab_size): use the model's own tokenizer, or a model "
                f"with vocab_size >= {len(tokenizer)}"
            )
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._max_len = self.max_positions or 1 << 30
        self._eos = frozenset(end_of_turn_ids(tokenizer, self.model))
        rng = torch.Generator()
        rng.manual_seed(seed) if seed is not None else rng.seed()
        self._scheduler = Scheduler(
            self.model,
            tokenizer,
            max_batch_size=max_batch_size,
            max_len=self._max_len,
            pad_id=min(self._eos, default=0),
            rng=rng,
            prefix_cache_tokens=prefix_cache_tokens,
            max_prefill_tokens=max_prefill_tokens,
            adapters=bool(self.adapters),
        )
        self._scheduler.start()

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str,
        *,
        tokenizer: Any = True,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> TransformersEngine:
        """Load with ``AutoModelForCausalLM.from_pretrained`` (and its tokenizer unless given)."""
        from transformers import AutoModelForCausalLM

        from tether.models import load_tokenizer, model_source

        # a local folder first; a misspelled or unreachable hub id is one fast line
        path_or_id = model_source(str(path_or_id))
        model = AutoModelForCausalLM.from_pretrained(
            path_or_id, **({"dtype": dtype} if dtype else {})
        )
        if tokenizer is True:
            # AutoTokenizer for ordinary models; a plain tokenizer.json (the starter's)
            # as it is (AutoTokenizer would swap its pre-tokenizer)
            tokenizer = load_tokenizer(path_or_id)
        return cls(model, tokenizer or None, dtype=dtype, **kwargs)

    @property
    def policy_version(self) -> int:
        return self._scheduler.version

    @property
    def weights_lock(self) -> threading.Lock:
        """Held by the worker while it reads the weights (each prefill/decode step).

        A trainer that shares :attr:`model` and updates it in place holds it for the
        optimizer step; :meth:`update_weights` with an empty dict then only bumps the
        version (and drops the prefix cache's KV of the old weights). With a
        ``rollout_dtype`` the trainer shares the full-precision model given to the
        constructor, and the update rebuilds the served copy from it under this lock.
        """
        return self._scheduler.weights_lock

    @property
    def stats(self) -> EngineStats:
        """Batch sizes and counters recorded by the worker."""
        return self._scheduler.stats

    async def outage(self) -> Outage | None:
        """Lost for good once the worker thread has died (``_scheduler.py``); else None."""
        return self._scheduler.outage()

    def _queue(self, item: Any, fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        """Hand ``item`` to the worker; ``fut`` is failed if the worker dies first. It may
        die after the item was queued and its waiters were failed (it marks itself first):
        then ``fut`` is failed here."""
        worker = self._scheduler
        worker.waiters[fut] = loop
        fut.add_done_callback(lambda f: worker.waiters.pop(f, None))
        worker.inbox.put(item)
        if worker.died is not None and not fut.done():
            fut.set_exception(worker.lost_error())

    # -- asyncio side -----------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        self._check(prompt_ids, params)
        async with self.gate.admit():
            req = await self._submit(prompt_ids, params)
            return await req.future

    async def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        """Each token as the worker samples it, then the result; closing the iterator early
        cancels the request (its rows leave the batch at the worker's next step)."""
        self._check(prompt_ids, params)
        async with self.gate.admit():
            feed = TokenFeed(asyncio.get_running_loop(), self.stream_interval_s)
            tokens = feed.queue
            req = await self._submit(prompt_ids, params, feed.put)
            req.future.add_done_callback(lambda _: (feed.flush(), tokens.put_nowait(_END)))
            try:
                while (item := await tokens.get()) is not _END:
                    yield item
                yield req.future.result()
            finally:
                if not req.future.done():
                    req.future.cancel()  # sets req.cancelled: the worker drops its rows

    def grammars(self) -> GrammarBook:
        """The compiled grammars of this engine's tokenizer (made on first use; needs xgrammar)."""
        if self._scheduler.grammars is None:
            if self.tokenizer is None:
                raise UserError("constrained decoding needs a tokenizer: pass tokenizer=")
            stop = end_of_turn_ids(self.tokenizer, self.model)[0]
            self._scheduler.grammars = GrammarBook(self.tokenizer, self._vocab, stop)
        return self._scheduler.grammars

    async def _submit(self, prompt_ids: list[int], params: SamplingParams, on_token: Any = None):
        if self._scheduler.died is not None:
            raise self._scheduler.lost_error()
        loop = asyncio.get_running_loop()
        stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else self._eos
        )
        req = Request(list(prompt_ids), params, stop_ids, loop.create_future(), loop)
        req.on_token = on_token
        if params.constraint is not None:  # compiled off the event loop when new
            book = self.grammars()
            compile_ = book.grammar
            req.grammar = (
                compile_(params.constraint)
                if book.cached(params.constraint)
                else await asyncio.to_thread(compile_, params.constraint)
            )
        req.future.add_done_callback(lambda f: setattr(req, "cancelled", f.cancelled()))
        self._queue(req, req.future, loop)
        return req

    def _check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise UserError("prompt_ids is empty; the engine needs at least one prompt token")
        bad = [t for t in prompt_ids if not 0 <= t < self._vocab]
        if bad:
            raise UserError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self._vocab})"
            )
        if len(prompt_ids) >= self._max_len:
            raise UserError(
                f"prompt ({len(prompt_ids)} tokens) must be shorter than {self._max_len}"
            )
        if params.stop and self.tokenizer is None:
            raise UserError("stop strings need a tokenizer: pass tokenizer= to TransformersEngine")
        if params.adapter is not None and params.adapter not in self.adapters | {BASE_ADAPTER}:
            served = ", ".join(sorted(self.adapters)) or "none: a plain model"
            raise UserError(
                f"adapter {params.adapter!r} is not served by this engine (adapters: {served}); "
                "build it with a peft model that holds it"
            )

    async def pause(self) -> None:
        await self.gate.pause()

    async def resume(self) -> None:
        self.gate.resume()

    @property
    def weight_push(self) -> WeightPush:
        """Every adapter's weights by name when serving adapters, else the full weights."""
        return RoleAdaptersPush(self) if self.adapters else WeightPush(self)

    async def update_weights(
        self, state_dict: dict[str, Any], *, version: int | None = None
    ) -> int:
        """Pause, load ``state_dict`` (keys may be a subset of the model's), bump the version
        (or set it to ``version``: resuming from a checkpoint). An engine serving adapters
        takes ``{adapter name: its peft state dict}`` (as ``get_peft_model_state_dict``
        gives it), any subset of its adapters; the version rises once for all."""
        async with self.gate.paused_for_update():
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[int] = loop.create_future()
            load = partial(self._load, version=version)
            self._queue((load, state_dict, fut, loop), fut, loop)
            return await fut

    def _load(self, state_dict: dict[str, Any], version: int | None = None) -> int:
        if self.adapters:
            self._load_adapters(state_dict)
        else:
            self._load_full(state_dict)
        if self._scheduler.prefix is not None:
            self._scheduler.prefix.clear()  # cached KVs belong to the old weights
        self._scheduler.version = self._scheduler.version + 1 if version is None else int(version)
        return self._scheduler.version

    def _load_adapters(self, weights: dict[str, Any]) -> None:
        from peft import set_peft_model_state_dict

        unknown = sorted(set(weights) - self.adapters)
        if unknown:
            raise UserError(f"weights for adapters {unknown} that this engine does not serve")
        with torch.no_grad():
            for name, sd in weights.items():
                out = set_peft_model_state_dict(self.model, sd, adapter_name=name)
                unexpected = list(getattr(out, "unexpected_keys", None) or ())
                if unexpected:
                    raise UserError(f"adapter {name!r}: weights the model lacks: {unexpected[:3]}")

    def _load_full(self, state_dict: dict[str, Any]) -> None:
        target = self.model if self._source is None else self._source
        unexpected = sorted(set(state_dict) - set(target.state_dict()))
        if unexpected:
            raise UserError(f"state_dict has keys the model lacks: {unexpected[:5]}")
        with torch.no_grad():
            target.load_state_dict(state_dict, strict=False)
        if self._source is not None and self._rollout_dtype:  # re-quantize (or re-cast) the copy
            with self._scheduler.weights_lock:  # a trainer sharing the source writes under it
                self._scheduler.model = self.model = rollout_copy(self._source, self._rollout_dtype)

    async def close(self) -> None:
        """Stop the worker; requests still queued or running fail with EngineFailed."""
        self.gate.close()
        if self._scheduler.is_alive():
            self._scheduler.inbox.put(STOP)
            await asyncio.to_thread(self._scheduler.join, 30)
