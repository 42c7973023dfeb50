"""One policy update: samples → micro-batches → loss → optimizer step.

:class:`PolicyTrainer` owns the trainable model and its optimizer. It does
not know where samples come from (see ``loop.py``) and never touches the
engine; the loop pushes :meth:`PolicyTrainer.state_dict` to the engine.

:meth:`PolicyTrainer.update` runs on a worker thread, which asyncio cannot
cancel; :meth:`PolicyTrainer.stop` (called when a run is interrupted) makes it
end at the next micro-batch by raising :class:`UpdateStopped`, so that the
process can exit without waiting for the whole update.

Shared weights: an embedded engine on the same device may decode with
:attr:`PolicyTrainer.model` itself instead of a copy (:meth:`share_weights`,
when :meth:`can_share_weights`: no LoRA, no dropout). The optimizer step then
holds the engine's weights lock, so no decode step runs while the weights
change, and :meth:`state_dict` is empty: the engine's update is a version bump.

Roles with their own LoRA adapter (``adapters``): the peft model holds one adapter
per such role beside the default one, and each sample trains the adapter of its
role (``_adapters.py``); the engine then takes :meth:`adapters_state_dict`.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch

from tether._memory import map_large_blocks
from tether.errors import UserError
from tether.trainer import algorithms as A
from tether.trainer._adapters import activate, add_adapters, by_adapter
from tether.trainer._forward import (
    MIN_SHARED_PREFIX,
    enable_gradient_checkpointing,
    forward_logprobs,
    shared_prefix,
)
from tether.trainer._fsdp import ShardedPolicy, agree, shard_policy
from tether.trainer._sums import StepSums, aggregate_stats, metric_names
from tether.trainer._weights import TrainerWeights
from tether.trainer.config import TrainerConfig
from tether.trainer.distributed import Ranks, shard_by_tokens
from tether.trainer.samples import Sample, collate, make_micro_batches

__all__ = ["PolicyTrainer", "UpdateStopped"]

#: Parameters from which the trainer fixes glibc's mmap threshold on CPU (map_large_blocks):
#: at a real model's size it keeps an update's freed activations from staying resident
#: (0.5B shape, 8 x 1,024 tokens: 9.69 -> 4.02 GiB); at the starter's (~2M) it only costs
#: time, mapping each MiB-sized block anew (its update 1.1-1.6x slower; docs/memory.md).
_REAL_MODEL = 100_000_000


log = logging.getLogger(__name__)


class UpdateStopped(Exception):
    """:meth:`PolicyTrainer.stop` ended an update part-way; the weights are not to be used."""


#: One micro-batch of a step: the adapter it trains (None: the default), its tensors (None:
#: an idle one, run by a sharded rank that has fewer than the others) and its shared-prefix cut.
MicroBatch = tuple[str | None, dict[str, torch.Tensor] | None, int]


class PolicyTrainer(TrainerWeights):
    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        *,
        device: str = "cpu",
        train_dtype: str = "float32",
        pad_id: int = 0,
        ranks: Ranks | None = None,
        adapters: Sequence[str] = (),
    ):
        self.cfg = cfg
        #: The roles with their own LoRA adapter (named after the role); () for none.
        self.adapters = tuple(adapters)
        if self.adapters and (cfg.lora is None or ranks is not None):
            raise ValueError("own adapters per role need trainer.lora and one process")
        #: Several training processes (trainer/distributed.py): the update's samples are
        #: split across them and the gradients summed; None = this process alone.
        self.ranks = ranks
        self.device = torch.device(device)
        if self.device.type == "cpu" and sum(p.numel() for p in model.parameters()) >= _REAL_MODEL:
            map_large_blocks()  # an update's freed activations leave no resident holes
        self.pad_id = pad_id
        self.autocast = train_dtype == "bfloat16"
        self.share_prefix = True
        self._stop = threading.Event()
        self.optimizer_steps = 0  # taken by this object (not restored from a checkpoint)
        self._shared_lock: Any = None  # the engine's weights lock once the weights are shared
        sharded = cfg.sharded and ranks is not None
        with torch.random.fork_rng(devices=[]) if sharded else nullcontext():
            if sharded:  # every rank draws the same LoRA initialisation (no broadcast after)
                torch.manual_seed(cfg.seed)
            # sharded: fully_shard moves each rank's shards to the device, never the whole model
            self.model = self._maybe_lora(model).to("cpu" if sharded else self.device)
        self.model.train()
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).to("cpu" if sharded else self.device).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(self.model, cfg.checkpoint_every_n_layers)
        #: With trainer.strategy fsdp2 and several ranks: the FSDP2 roots of the policy and
        #: of the reference model (``_fsdp.py``); None when every rank holds the whole model.
        self.root: ShardedPolicy | None = None
        self.ref_root: ShardedPolicy | None = None
        #: Rank 0, sharded: the full weights gathered after the last change, until taken.
        self._full: dict[str, torch.Tensor] | None = None
        if sharded:
            assert ranks is not None
            bf16 = self.autocast and self.device.type == "cuda"  # FSDP2's mixed precision
            self.autocast = self.autocast and not bf16
            shard = dict(bf16=bf16, offload=cfg.offload)
            self.root = shard_policy(self.model, ranks.world, self.device, **shard)
            if self.ref_model is not None:
                self.ref_root = shard_policy(self.ref_model, ranks.world, self.device, **shard)
        # every adapter's parameters, even while another one is active
        self.params = params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), weight_decay=cfg.weight_decay
        )

    def _maybe_lora(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.cfg.lora is None:
            return model
        try:
            from peft import LoraConfig, get_peft_model
        except ModuleNotFoundError as exc:
            raise UserError("trainer.lora needs peft: pip install 'tether[lora]'") from exc

        lc = self.cfg.lora
        config = LoraConfig(
            r=lc.r,
            lora_alpha=lc.alpha,
            lora_dropout=lc.dropout,
            target_modules=list(lc.target_modules),
            task_type="CAUSAL_LM",
        )
        peft = get_peft_model(model, config)
        if self.adapters:
            add_adapters(peft, self.adapters, config)
        return peft

    # -- the update -------------------------------------------------------------

    def _cut(self, batch: dict[str, torch.Tensor]) -> int:
        """Where ``batch``'s shared prefix ends, or 0 for the plain forward."""
        ids = batch["input_ids"]
        cut = shared_prefix(ids, batch["loss_mask"]) if self.share_prefix else 0
        return 0 if cut < MIN_SHARED_PREFIX or ids.shape[0] < 2 else cut

    def _forward_logprobs(
        self,
        model: torch.nn.Module,
        batch: dict[str, torch.Tensor],
        *,
        entropy: bool = False,
        cut: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token logprobs ``[B, L]`` aligned with ``input_ids`` (see _forward.token_logprobs),
        and with ``entropy`` the next-token entropies ``[B, L]`` from the same logits
        (_forward.token_logprobs_and_entropy: one pass over the logits, no gradient on the
        entropy, no second forward), else None.

        Rows of an agent's batch share a long prompt (system prompt + tools).
        That shared prefix is computed once and its KV cache broadcast to every
        row; gradients flow through it as in the plain forward, and the
        result is the same up to float rounding (tested). With
        ``logprob_chunk_tokens`` the LM head runs that many positions at a time
        and the ``[B, L, V]`` logits never exist (see ``_forward.py``). ``cut``: the shared
        prefix's end as the ranks agreed it (sharded), else found here.

        Sharded, the policy and the reference model run through their FSDP2 roots.
        """
        ctx = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.autocast
            else nullcontext()
        )
        cut = self._cut(batch) if cut is None else cut
        roots = {id(self.model): self.root, id(self.ref_model): self.ref_root}
        run: Any = roots.get(id(model)) or partial(forward_logprobs, model)
        with ctx:
            return run(
                batch["input_ids"],
                batch["attention_mask"],
                batch["temperature"],
                cut=cut,
                chunk_tokens=self.cfg.logprob_chunk_tokens,
                entropy=entropy,
            )

    def update(self, samples: list[Sample]) -> dict[str, float]:
        """``updates_per_batch`` optimizer steps over all ``samples`` (gradients accumulated
        over micro-batches in each).

        Returns the metrics of the last optimizer step (``loss``, ``grad_norm``, the
        policy loss's ``clip_frac``/``clip_frac_low``/``clip_frac_high``/``ratio_mean``/
        ``approx_kl``, ``kl_ref`` with a reference model; each a token-weighted mean
        over the trained tokens), and from the first step, on the weights that
        sampled the batch:

        - ``logprob_gap``/``logprob_gap_max``, the self-check: mean and max
          |engine logprob − trainer logprob| over the trained tokens (≈0 when
          engine and trainer hold the same weights);
        - ``entropy``: mean entropy (nats) of the next-token distribution the
          engine sampled from, ``softmax(logits / T)`` at the call's temperature,
          over the trained tokens (samples with a nonzero advantage, or all with a
          reference model), from the same logits as the logprobs.

        ``approx_kl`` is k3 of the PPO ratio's two policies at the start of the
        last step, *before* its optimizer step: with ``updates_per_batch`` = 1
        that is KL(engine ‖ trainer) on unchanged weights, ≈0 but for numerics
        (the same thing ``logprob_gap`` measures); with more steps, the drift of
        the first ``updates_per_batch − 1`` steps from the behaviour policy (from
        π_old with ``tis_cap`` > 0). The change made by the last step is not
        measured (it would cost another forward pass over the batch).

        From the second step on the policy has moved, and the PPO ratio is what
        gets clipped: against the engine's logprobs, or with ``tis_cap`` > 0
        against the trainer's own pre-update logprobs (TIS).
        """
        # The loss is divided by counts over every sample, but a sample whose advantage
        # is 0 adds nothing to it or its gradient (no KL term: every policy loss is
        # advantage × something), so only the others need a forward and backward pass.
        stats = aggregate_stats(samples)
        active = samples if self.ref_model is not None else [s for s in samples if s.trains]
        if self.ranks is not None:  # rank 0: every rank trains its share, normalised by `stats`
            shards = shard_by_tokens([len(s) for s in active], self.ranks.world)
            parts = [[active[i] for i in shard] for shard in shards]
            self.ranks.send(("update", parts, stats))
            active = parts[0]
        return self.train_on(active, stats)

    def train_on(self, active: list[Sample], stats: A.AggregateStats) -> dict[str, float]:
        """:meth:`update` on this rank's ``active`` samples, the loss divided by the whole
        batch's counts ``stats`` (with one process: all of them)."""
        cfg = self.cfg
        groups = by_adapter(active, self.adapters) if self.adapters else [(None, active)]
        collated = [
            (adapter, {k: v.to(self.device) for k, v in collate(b, pad_id=self.pad_id).items()})
            for adapter, samples in groups
            for b in make_micro_batches(samples, cfg.max_tokens_per_micro_batch)
        ]
        plan = self._plan(collated)
        log.info(
            "updating the policy: %d samples, %d micro-batches × %d optimizer steps",
            len(active),
            len(collated),
            cfg.updates_per_batch,
        )
        metrics = first = self._step(plan, stats, first=True)
        for _ in range(1, cfg.updates_per_batch):
            metrics = self._step(plan, stats, first=False)
        if self.root is not None:  # the new weights, gathered onto rank 0 for the engine
            self.gather()
        first = {m: first[m] for m in ("logprob_gap", "logprob_gap_max", "entropy")}
        return {**metrics, **first, "micro_batches": float(len(collated))}

    def _plan(self, collated: list[tuple[str | None, dict[str, torch.Tensor]]]) -> list[MicroBatch]:
        """The micro-batches to run, each with its shared-prefix cut. Sharded, every rank
        runs as many (idle ones at the end) and cuts on the same ones (``_fsdp.agree``)."""
        cuts = [self._cut(batch) for _, batch in collated]
        if self.root is None:
            return [(a, b, c) for (a, b), c in zip(collated, cuts, strict=True)]
        assert self.ranks is not None
        with self.ranks.collective("agreeing on the micro-batches"):
            total, ok = agree(len(collated), [c > 0 for c in cuts], self.device)
        plan: list[MicroBatch] = [
            (a, b, c if ok[i] else 0)
            for i, ((a, b), c) in enumerate(zip(collated, cuts, strict=True))
        ]
        return plan + [(None, None, 0)] * (total - len(plan))

    def stop(self) -> None:
        """End a running (and every later) :meth:`update` at its next micro-batch.

        Thread-safe; for a run that is being interrupted and will not save again.
        """
        self._stop.set()

    def _step(
        self, plan: list[MicroBatch], stats: A.AggregateStats, *, first: bool
    ) -> dict[str, float]:
        """One optimizer step over the micro-batches of ``plan``; with ``first`` also the
        entropy (see :meth:`update`)."""
        self.optimizer.zero_grad(set_to_none=True)  # None, not 0: AdamW skips an idle adapter
        sums = StepSums()
        try:
            with self._sharded("the sharded forward and backward"):
                self._run_plan(plan, stats, sums, first=first)
        finally:
            if self.adapters:
                activate(self.model, None)
        if self.ranks is not None:  # one step over every rank: gradients and sums added up
            names = metric_names(self.cfg, self.ref_model is not None)
            summed = [] if self.root is not None else self.params  # FSDP2 summed them already
            sums = sums.reduced(self.ranks, summed, names, self.device)
        grad_norm = 0.0
        if self.cfg.grad_clip > 0:
            with self._sharded("the gradient norm"):  # sharded: an all-reduce of the shards'
                norm: Any = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
                grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not math.isfinite(sums.loss) or not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"non-finite loss ({sums.loss}) or gradient norm ({grad_norm}); step skipped"
            )
        with self._shared_lock or nullcontext():  # no decode step while the weights change
            self.optimizer.step()
        self.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, **sums.metrics(entropy=first)}

    def _sharded(self, what: str) -> Any:
        """Sharded: a guard that turns a collective's failure inside ``what`` into
        :class:`RankFailed` (as ``distributed.Ranks.collective``); else nothing."""
        if self.root is None or self.ranks is None:
            return nullcontext()
        return self.ranks.collective(what, mixed=True)

    def _run_plan(
        self, plan: list[MicroBatch], stats: A.AggregateStats, sums: StepSums, *, first: bool
    ) -> None:
        """Forward and backward of every micro-batch of ``plan``, gradients accumulated."""
        for adapter, batch, cut in plan:
            if self._stop.is_set():
                raise UpdateStopped("the update was stopped (the run is being interrupted)")
            if self.adapters:
                activate(self.model, adapter)
            if batch is None:
                self._idle_micro_batch()
            else:
                self._micro_batch(batch, stats, sums, entropy=first, cut=cut)

    def _micro_batch(
        self,
        batch: dict[str, torch.Tensor],
        stats: A.AggregateStats,
        sums: StepSums,
        *,
        entropy: bool,
        cut: int,
    ) -> None:
        """Forward and backward of one micro-batch; its figures are added to ``sums``."""
        cfg = self.cfg
        mask = batch["loss_mask"]
        logprobs, token_entropy = self._forward_logprobs(
            self.model, batch, entropy=entropy, cut=cut
        )
        old = batch["old_logprobs"]
        prox = is_weights = None
        if cfg.tis_cap > 0:  # decoupled PPO + TIS, see the algorithms module docstring
            # the first step's forward runs on the pre-update weights: kept as π_prox
            prox = batch.setdefault("prox_logprobs", logprobs.detach())
            is_weights = A.truncated_is_weights(prox, old, cfg.tis_cap)
        per_token, metrics = A.POLICY_LOSSES[cfg.policy_loss](
            logprobs, old, batch["advantages"], mask,
            clip_low=cfg.clip_low, clip_high=cfg.clip_high,
            prox_logprobs=prox, is_weights=is_weights,
        )  # fmt: skip
        if self.ref_model is not None:
            with torch.no_grad():
                ref, _ = self._forward_logprobs(self.ref_model, batch, cut=cut)
            kl = A.KL_ESTIMATORS[cfg.kl_estimator](logprobs, ref)
            per_token = per_token + cfg.kl_coef * kl * mask
            metrics["kl_ref"] = A.masked_mean(kl.detach(), mask)
        loss = A.aggregate(
            per_token, mask, cfg.aggregation, rollout_index=batch["rollout_index"], stats=stats
        )
        loss.backward()
        sums.add(loss.item(), logprobs.detach(), old, mask, token_entropy, metrics)

    def _idle_micro_batch(self) -> None:
        """A sharded rank with fewer micro-batches than another: the forward and backward
        of a two-token row with zero weight, for the collectives every rank must run."""
        pad = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        batch = {
            "input_ids": pad,
            "attention_mask": torch.ones_like(pad),
            "temperature": torch.ones(1, device=self.device),
        }
        logprobs, _ = self._forward_logprobs(self.model, batch, cut=0)
        if self.ref_model is not None:
            with torch.no_grad():
                self._forward_logprobs(self.ref_model, batch, cut=0)
        (logprobs.sum() * 0.0).backward()
