"""The training run's configuration: one dataclass per part, one YAML file.

Every field is documented here; ``tether train CONFIG key.sub=value`` overrides
any of them. Validation happens when a dataclass is built, and every error
names the value, the rule and the fix.

Paths: a relative path written in a config file (``agent.agent: agent.py:main``,
the words of ``agent.command``, ``agent.cwd``, ``tasks.source``, a grader
``file.py:fn``) is relative to the file's folder; one given as a command-line
override is relative to the current directory; ``dir`` and ``model.path`` are
always relative to the current directory. The exact rules are in
``tether/trainer/_paths.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tether.errors import UserError
from tether.gateway import GatewayConfig
from tether.runner import RunnerConfig
from tether.trainer._paths import resolve_file_paths

__all__ = [
    "CheckpointConfig",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "RolloutConfig",
    "TasksConfig",
    "TrainConfig",
    "TrainerConfig",
]


def _positive(section: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise UserError(f"{section}.{name} ({value}) must be > 0")


@dataclass
class ModelConfig:
    #: A model folder or hub id; "starter" builds (or reuses) tether's warmed-up starter model.
    path: str = "starter"
    #: cpu, cuda, cuda:1, ...
    device: str = "cpu"
    #: Autocast dtype of the trainer's forward/backward: float32 or bfloat16 (weights stay fp32).
    train_dtype: str = "float32"
    #: Most sequences the embedded engine decodes at once.
    max_batch_size: int = 64

    def __post_init__(self) -> None:
        if self.train_dtype not in ("float32", "bfloat16"):
            raise UserError(f"model.train_dtype ({self.train_dtype!r}) must be float32 or bfloat16")
        _positive("model", max_batch_size=self.max_batch_size)


@dataclass
class TasksConfig:
    #: "calc" (generated arithmetic tasks) or a JSONL file with one task object per line
    #: and a "split" field ("train"/"val") on each; in a config file, relative to its folder.
    source: str = "calc"
    train_size: int = 2000
    val_size: int = 100
    seed: int = 0


@dataclass
class RolloutConfig:
    #: Rollouts per task (the GRPO group size).
    n: int = 8
    #: Groups (tasks) per update; a batch is batch_groups × n rollouts.
    batch_groups: int = 8
    #: "module:function" or "path/file.py:function" grading (task, final_answer) -> float,
    #: or -> {"reward": float, "success": bool} to say itself what counts as solved (a file
    #: path in a config file is relative to its folder); empty = the agent's own reward.
    grader: str = "tether.starter.calc:grade"
    #: When a rollout counts as a success (the success rate of train steps and evals), unless
    #: the grader says so itself: None = reward > 0; a number = reward >= success_threshold.
    success_threshold: float | None = None
    #: Trainer and engine use the temperature recorded per call; this one is for the report.
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.n < 2:
            raise UserError(
                f"rollout.n ({self.n}) must be >= 2: group advantages need 2 samples or more per task"
            )
        _positive("rollout", batch_groups=self.batch_groups)
        t = self.success_threshold
        if t is not None and (isinstance(t, bool) or not math.isfinite(t)):
            raise UserError(
                f"rollout.success_threshold ({t}) must be a finite number, or null for reward > 0"
            )


@dataclass
class LoraConfig:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


@dataclass
class TrainerConfig:
    #: Number of updates.
    steps: int = 60
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    #: Gradient-norm clip; 0 turns it off.
    grad_clip: float = 1.0
    #: Advantage estimator: grpo, dr_grpo, rloo, reinforce_pp.
    advantage: str = "grpo"
    #: Policy loss: ppo_clip or reinforce.
    policy_loss: str = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.28
    #: token_mean, seq_mean, rollout_mean, seq_mean_token_sum_norm.
    aggregation: str = "token_mean"
    #: KL to the starting model; 0 keeps no reference model.
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    #: Truncated importance sampling: > 0 takes the PPO ratio against the trainer's own
    #: pre-update logprobs and weights each token by min(π_trainer / π_engine, tis_cap)
    #: (decoupled PPO, see algorithms.py); 0 = off, the ratio is against the engine's.
    tis_cap: float = 0.0
    #: Optimizer steps per batch of rollouts (PPO epochs); from the second on, clipping matters.
    updates_per_batch: int = 1
    #: Token budget of one micro-batch (rows × longest row); gradients accumulate across them.
    max_tokens_per_micro_batch: int = 8192
    #: Stop early when the batch reward has been 0 for this many updates in a row (collapse); 0 = never.
    collapse_patience: int = 8
    #: sync (collect a batch, update, repeat) or async (groups keep running; admission
    #: pauses only for the update; see tether/trainer/_async.py).
    mode: str = "sync"
    #: Async: groups (tasks × n rollouts) running at once; 0 = 2 × rollout.batch_groups.
    max_groups_in_flight: int = 0
    #: Async: a group whose oldest call is more than this many policy versions behind
    #: the weights it would train is handled by lag_policy.
    max_policy_lag: int = 1
    #: Async: "drop" (counted as groups_dropped_lag) or "reweight" (kept; the loss's ratio
    #: against the recorded engine logprobs corrects for the lag, or with tis_cap set the
    #: truncated weight π_trainer / π_engine does).
    lag_policy: str = "drop"
    #: Async: seconds a model call arriving during an update is held before a 503;
    #: unset = gateway.admission_timeout_s.
    hold_timeout_s: float | None = None
    seed: int = 0
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
        self._check_async()
        if self.kl_coef < 0 or self.tis_cap < 0 or self.grad_clip < 0:
            raise UserError("trainer.kl_coef, tis_cap and grad_clip must be >= 0")

    def _check_async(self) -> None:
        if self.mode not in ("sync", "async"):
            raise UserError(f"trainer.mode ({self.mode!r}) must be 'sync' or 'async'")
        if self.lag_policy not in ("drop", "reweight"):
            raise UserError(
                f"trainer.lag_policy ({self.lag_policy!r}) must be 'drop' or 'reweight'"
            )
        if self.max_groups_in_flight < 0 or self.max_policy_lag < 0:
            raise UserError(
                f"trainer.max_groups_in_flight ({self.max_groups_in_flight}) and "
                f"max_policy_lag ({self.max_policy_lag}) must be >= 0"
            )
        if self.hold_timeout_s is not None and not self.hold_timeout_s > 0:
            raise UserError(f"trainer.hold_timeout_s ({self.hold_timeout_s}) must be > 0 seconds")


@dataclass
class EvalConfig:
    #: False: no held-out evaluation at all during training (``tether eval`` still evaluates).
    enabled: bool = True
    #: Evaluate on the val split every this many updates (and before the first and after the last); 0 = only then.
    every: int = 0
    #: Val tasks used (the first ones of the split).
    tasks: int = 100
    #: Samples per task at the training temperature.
    samples: int = 4
    #: Also one greedy (temperature 0) rollout per task.
    greedy: bool = True
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.every < 0:
            raise UserError(f"eval.every ({self.every}) must be >= 0 (0: only before and after)")
        if self.tasks < 1 or self.samples < 1:
            raise UserError(
                f"eval.tasks ({self.tasks}) and eval.samples ({self.samples}) must be >= 1; "
                "to skip held-out evaluation set eval.enabled=false"
            )


@dataclass
class CheckpointConfig:
    #: Save every this many updates (and at the end); 0 = only at the end.
    every: int = 0
    #: How many checkpoints to keep.
    keep: int = 2


@dataclass
class TrainConfig:
    #: Name of the run; its files go to {dir}/{name}. One run per name: a new run under
    #: a name whose folder holds one is refused (continue it with --resume, or rename).
    name: str = "calc"
    #: Where run folders go, relative to the current directory.
    dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    #: How agents start; default: the calc agent in-process (tether.starter.calc:agent).
    #: In a config file, agent.agent "path/file.py:fn" and agent.cwd are relative to the
    #: file's folder, and each word of agent.command that names a file or folder there
    #: (agent.py, ./run.sh) becomes its absolute path; the agent still starts in the
    #: current directory (or agent.cwd, and then agent.command is left as written).
    agent: RunnerConfig = field(
        default_factory=lambda: RunnerConfig(mode="inprocess", agent="tether.starter.calc:agent")
    )
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    gateway: GatewayConfig = field(default_factory=lambda: GatewayConfig(port=0))
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t, b = self.trainer, self.rollout.batch_groups
        if t.mode == "async" and t.max_groups_in_flight and t.max_groups_in_flight < b:
            raise UserError(
                f"trainer.max_groups_in_flight ({t.max_groups_in_flight}) must be >= "
                f"rollout.batch_groups ({b}); raise it (e.g. {2 * b}) or set 0 for 2 × batch_groups"
            )

    resolve_file_paths = staticmethod(resolve_file_paths)  # the load_config hook (configio)

    @property
    def groups_in_flight(self) -> int:
        """Async mode's bound on running groups (``max_groups_in_flight``, default 2 × batch)."""
        return self.trainer.max_groups_in_flight or 2 * self.rollout.batch_groups
