"""The learner's configuration: the policy update (``trainer:`` in a run config).

The run's composite config, which holds this one as ``trainer``, is
:class:`tether.run.config.TrainConfig`. Validation happens when a dataclass is
built, and every error names the value, the rule and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from tether.errors import UserError

__all__ = ["LoraConfig", "RoleConfig", "TrainerConfig"]


def _positive(section: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise UserError(f"{section}.{name} ({value}) must be > 0")


@dataclass
class LoraConfig:
    #: LoRA rank: the inner dimension of each adapter.
    r: int = 8
    #: LoRA scaling: each adapter's output is multiplied by alpha / r.
    alpha: int = 16
    #: Dropout on each adapter's input while training, in [0, 1).
    dropout: float = 0.0
    #: Names of the modules that get an adapter (the attention projections by default).
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )

    def __post_init__(self) -> None:
        _positive("trainer.lora", r=self.r, alpha=self.alpha)
        if not 0 <= self.dropout < 1:
            raise UserError(f"trainer.lora.dropout ({self.dropout}) must be in [0, 1), e.g. 0.05")
        if not self.target_modules:
            raise UserError(
                "trainer.lora.target_modules is empty: name the modules to adapt, "
                "e.g. [q_proj, k_proj, v_proj, o_proj]"
            )


@dataclass
class RoleConfig:
    """How one agent role is served and trained (the run config's ``roles``, docs/credit.md)."""

    #: Train the role's calls (False: frozen, served by the starting weights, never trained).
    train: bool = True
    #: Its own LoRA adapter on the same base model (needs trainer.lora); False: the shared policy.
    adapter: bool = False
    #: Scales the role's advantages, so its policy loss (its KL term is not scaled); >= 0.
    weight: float = 1.0

    def check(self, name: str) -> None:
        where = f"roles.{name}"
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise UserError(f"{where}.weight ({self.weight}) must be a finite number >= 0")
        if self.adapter and not self.train:
            raise UserError(
                f"{where}: a frozen role (train: false) has no adapter of its own: it is served "
                "by the starting weights; set adapter: false or train: true"
            )


@dataclass
class TrainerConfig:
    #: Number of updates.
    steps: int = 60
    #: AdamW learning rate.
    lr: float = 2e-4
    #: AdamW weight decay.
    weight_decay: float = 0.0
    #: AdamW betas (two numbers in [0, 1)).
    betas: tuple[float, float] = (0.9, 0.99)
    #: Gradient-norm clip; 0 turns it off.
    grad_clip: float = 1.0
    #: Advantage estimator: grpo, dr_grpo, rloo, reinforce_pp.
    advantage: str = "grpo"
    #: Which advantage each call trains with: "trajectory" (every call of a rollout gets the
    #: rollout's, from its final reward against its group) or "turn" (each call gets its own,
    #: from its return-to-go: its and later calls' intermediate rewards plus the final one,
    #: discounted by gamma, against the group's returns at the same turn index; docs/credit.md).
    credit: Literal["trajectory", "turn"] = "trajectory"
    #: Discount per call of the return-to-go with credit "turn", in [0, 1]; 1 = none.
    gamma: float = 1.0
    #: With credit "turn": which calls a call's return is compared with. "index": the group's
    #: calls at the same turn index. "state" (GiGPO): the group's calls (of the same role)
    #: whose prompt is identical token for token, and that step advantage, times
    #: state_weight, is added to the rollout's trajectory advantage (docs/credit.md).
    turn_grouping: Literal["index", "state"] = "index"
    #: With turn_grouping "state": the weight ω of the step advantage, >= 0 (0: trajectory credit).
    state_weight: float = 1.0
    #: Policy loss: ppo_clip or reinforce.
    policy_loss: str = "ppo_clip"
    #: PPO-clip lower bound: the ratio is clipped at 1 - clip_low where the advantage is negative.
    clip_low: float = 0.2
    #: PPO-clip upper bound: the ratio is clipped at 1 + clip_high where the advantage is positive
    #: (above clip_low: clip-higher).
    clip_high: float = 0.28
    #: How the loss averages: token_mean (every trained token alike), seq_mean (every
    #: sample alike), rollout_mean (every rollout alike, however many samples its calls
    #: were cut into: a context reset or a sub-agent forks it; docs/credit.md),
    #: seq_mean_token_sum_norm (Dr. GRPO).
    aggregation: str = "token_mean"
    #: KL to the starting model; 0 keeps no reference model.
    kl_coef: float = 0.0
    #: Estimator of the KL term (with kl_coef > 0): k1, k2 or k3.
    kl_estimator: str = "k3"
    #: Truncated importance sampling: > 0 takes the PPO ratio against the trainer's own
    #: pre-update logprobs and weights each token by min(π_trainer / π_engine, tis_cap)
    #: (decoupled PPO, see algorithms.py); 0 = off, the ratio is against the engine's.
    tis_cap: float = 0.0
    #: Optimizer steps per batch of rollouts (PPO epochs); from the second on, clipping matters.
    updates_per_batch: int = 1
    #: Token budget of one micro-batch (rows × longest row); gradients accumulate across them.
    max_tokens_per_micro_batch: int = 8192
    #: Seconds any collective between the training processes may wait before the run
    #: ends with an error (a rank died or hangs); a checkpoint of the last step is kept.
    collective_timeout_s: float = 300.0
    #: How several training processes hold the model: "replicate" (every rank holds all of
    #: the weights, gradients and AdamW state; the gradients are all-reduced) or "fsdp2"
    #: (PyTorch's fully_shard per decoder layer: each of N ranks holds 1/N of each, for a
    #: model that does not fit one device; docs/distributed.md). One process: no effect.
    strategy: Literal["replicate", "fsdp2"] = "replicate"
    #: With strategy fsdp2 on GPUs: keep the parameter, gradient and optimizer shards in
    #: CPU memory (FSDP2's CPUOffloadPolicy), for a model whose shards do not fit.
    offload: bool = False
    #: The LM head runs on this many positions at a time in the update (each chunk
    #: checkpointed), so the full [batch, length, vocabulary] logits never exist; 0 = all
    #: positions at once. Same logprobs and gradients up to float rounding (tested); costs
    #: one more LM-head matmul. Off by default (the starter's vocabulary is 1.7k tokens);
    #: 128 for a real model's 150k-token vocabulary (docs/memory.md).
    logprob_chunk_tokens: int = 0
    #: Recompute each decoder layer's activations in the backward instead of keeping them
    #: (transformers' activation checkpointing, non-reentrant): less memory, ~1 more forward.
    gradient_checkpointing: bool = False
    #: With gradient_checkpointing: checkpoint every n-th decoder layer only (transformers'
    #: every_n_layers); the others keep their activations. 1 = every layer (least memory);
    #: 2 = half the layers: about half the recompute back for half the memory saved.
    checkpoint_every_n_layers: int = 1
    #: Warn once when resident memory grows faster than this many MiB per update (the
    #: median slope over the updates after ``memory_warmup``; benchmarks/soak.py finds
    #: what grows); 0 = never.
    memory_warn_mib: float = 1.0
    #: Updates whose memory growth the check leaves out (first evals, caches filling up).
    memory_warmup: int = 20
    #: Seed of torch and Python's random for the run (sampling and training).
    seed: int = 0
    #: LoRA adapters (peft) instead of a full fine-tune; checkpoints hold the merged model.
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        from tether.trainer.algorithms import (
            ADVANTAGE_ESTIMATORS,
            AGGREGATION_MODES,
            KL_ESTIMATORS,
            POLICY_LOSSES,
        )

        _positive(
            "trainer",
            steps=self.steps,
            lr=self.lr,
            updates_per_batch=self.updates_per_batch,
            max_tokens_per_micro_batch=self.max_tokens_per_micro_batch,
            collective_timeout_s=self.collective_timeout_s,
            checkpoint_every_n_layers=self.checkpoint_every_n_layers,
        )
        for name, value, options in (
            ("advantage", self.advantage, ADVANTAGE_ESTIMATORS),
            ("policy_loss", self.policy_loss, POLICY_LOSSES),
            ("aggregation", self.aggregation, AGGREGATION_MODES),
            ("kl_estimator", self.kl_estimator, KL_ESTIMATORS),
        ):
            if value not in options:
                raise UserError(
                    f"trainer.{name} ({value!r}) must be one of {', '.join(sorted(options))}"
                )
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise UserError(
                f"trainer.clip_low ({self.clip_low}) must be in [0, 1) and clip_high ({self.clip_high}) >= 0"
            )
        if self.credit not in ("trajectory", "turn"):
            raise UserError(f"trainer.credit ({self.credit!r}) must be 'trajectory' or 'turn'")
        if isinstance(self.gamma, bool) or not 0 <= self.gamma <= 1:
            raise UserError(
                f"trainer.gamma ({self.gamma}) must be in [0, 1]: the discount per call of the "
                "return-to-go (1 = undiscounted), e.g. 0.95"
            )
        self._check_grouping()
        for name in (
            "kl_coef",
            "tis_cap",
            "grad_clip",
            "weight_decay",
            "memory_warn_mib",
            "memory_warmup",
        ):
            if getattr(self, name) < 0:
                raise UserError(
                    f"trainer.{name} ({getattr(self, name)}) must be >= 0 (0 turns it off)"
                )
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UserError(
                f"trainer.betas ({list(self.betas)}) must be two numbers in [0, 1), e.g. [0.9, 0.99]"
            )
        if self.strategy not in ("replicate", "fsdp2"):
            raise UserError(f"trainer.strategy ({self.strategy!r}) must be 'replicate' or 'fsdp2'")
        if self.offload and self.strategy != "fsdp2":
            raise UserError("trainer.offload needs trainer.strategy=fsdp2 (it offloads the shards)")
        if self.logprob_chunk_tokens < 0:
            raise UserError(
                f"trainer.logprob_chunk_tokens ({self.logprob_chunk_tokens}) must be >= 0 "
                "(0 computes the logits of all positions at once)"
            )

    @property
    def sharded(self) -> bool:
        """Whether the policy is split across the training ranks (``strategy: fsdp2``): its
        model is then loaded on the CPU and each rank's shards alone go to the device."""
        return self.strategy == "fsdp2"

    def _check_grouping(self) -> None:
        if self.turn_grouping not in ("index", "state"):
            raise UserError(
                f"trainer.turn_grouping ({self.turn_grouping!r}) must be 'index' or 'state'"
            )
        if self.turn_grouping == "state" and self.credit != "turn":
            raise UserError(
                "trainer.turn_grouping (state) groups calls, which needs trainer.credit: turn "
                f"(it is {self.credit!r}); set trainer.credit=turn or turn_grouping=index"
            )
        w = self.state_weight
        if isinstance(w, bool) or not (math.isfinite(w) and w >= 0):
            raise UserError(f"trainer.state_weight ({w}) must be a finite number >= 0, e.g. 1.0")
