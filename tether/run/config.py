"""The training run's configuration: one dataclass per part, one YAML file.

Every field is documented here, in the ``#:`` comment above it (``tether config``
prints them with the effective values; docs/config.md is generated from them);
``tether train CONFIG key.sub=value`` overrides any of them. Validation happens when a dataclass is built, and every error
names the value, the rule and the fix.

Paths: a relative path written in a config file (``agent.entry: agent.py:main``,
the words of ``agent.command``, ``agent.cwd``, ``tasks.source``, a grader
``file.py:fn``) is relative to the file's folder; one given as a command-line
override is relative to the current directory; ``dir`` and ``model.path`` are
always relative to the current directory. The exact rules are in
``tether/run/_paths.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tether.configio import build
from tether.engine import BASE_ADAPTER, EngineConfig
from tether.errors import UserError
from tether.gateway import GatewayConfig
from tether.records import check_role_name
from tether.run._checks import at_least as _at_least
from tether.run._checks import one_of as _one_of
from tether.run._judge_config import JudgeConfig
from tether.run._paths import resolve_file_paths
from tether.run._run_config import MOVED, RunConfig
from tether.runner import RunnerConfig
from tether.tracking import TrackingConfig, normalize_tracking
from tether.trainer.config import LoraConfig, RoleConfig, TrainerConfig

__all__ = [
    "CheckpointConfig",
    "EngineConfig",
    "EvalConfig",
    "JudgeConfig",
    "LoraConfig",
    "ModelConfig",
    "RoleConfig",
    "RolloutConfig",
    "RunConfig",
    "TasksConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
]


def _role_configs(roles: Mapping[str, Any]) -> dict[str, RoleConfig]:
    """The ``roles`` mapping of a config (role name → RoleConfig or its fields), checked."""
    out: dict[str, RoleConfig] = {}
    for name, value in roles.items():
        try:
            check_role_name(name)
        except ValueError as exc:
            raise UserError(f"roles: {exc}") from None
        role = (
            value
            if isinstance(value, RoleConfig)
            else build(RoleConfig, value or {}, f"roles.{name}")
        )
        role.check(name)
        out[name] = role
    return out


TrainDtype = Literal["float32", "bfloat16"]
RolloutDtype = Literal["float32", "bfloat16", "int8"]


@dataclass
class ModelConfig:
    # `model: Qwen/...` in a config file: configio's error says to write model.path
    shorthand: ClassVar[str] = "path"
    #: A model folder, a checkpoint folder (its model/), a run folder (its newest
    #: checkpoint's model/) or a hub id; "starter" builds (or reuses) tether's warmed-up
    #: starter model.
    path: str = "starter"
    #: cpu, cuda, cuda:1, ...
    device: str = "cpu"
    #: Autocast dtype of the trainer's forward/backward: float32 or bfloat16 (weights stay fp32).
    train_dtype: TrainDtype = "float32"
    #: Most sequences the embedded engine decodes at once.
    max_batch_size: int = 64
    #: Weights the embedded engine samples with: float32 (the trainer's own), bfloat16 or
    #: int8 (its own cast / weight-only quantized copy, rebuilt after each update; int8
    #: needs torchao). Pair int8 with trainer.tis_cap (docs/int8.md).
    rollout_dtype: RolloutDtype = "float32"

    def __post_init__(self) -> None:
        _one_of("model.train_dtype", self.train_dtype, ("float32", "bfloat16"))
        _one_of("model.rollout_dtype", self.rollout_dtype, ("float32", "bfloat16", "int8"))
        _at_least(1, "model.max_batch_size", self.max_batch_size, "e.g. model.max_batch_size=64")


@dataclass
class TasksConfig:
    # `tasks: data.jsonl` in a config file: configio's error says to write tasks.source
    shorthand: ClassVar[str] = "source"
    #: "calc" (generated arithmetic tasks) or a JSONL file with one task object per line
    #: and a "split" field ("train"/"val") on each; in a config file, relative to its folder.
    #: A file where no line has a "split" gets a seeded held-out share (holdout) as val.
    source: str = "calc"
    #: Train tasks used (the first ones; the calc generator makes this many).
    train_size: int = 2000
    #: Held-out (val) tasks used; 0 only with eval.enabled=false.
    val_size: int = 100
    #: Seed of the calc task generator and of the order in which train tasks are drawn
    #: (one seeded permutation per pass over them).
    seed: int = 0
    #: The share of a split-less file's tasks held out as val (seeded by tasks.seed), as
    #: ``train_test_split(test_size=0.1)`` would; at least one task when there are two or more.
    holdout: float = 0.1
    #: Task fields the agent never receives (TETHER_TASK, the in-process agent's ``task``,
    #: the stored rollout's task), e.g. [answer]; the grader still gets the whole row. A
    #: row's own "grader" object is always kept from the agent (the calc tasks' answer is there).
    private_fields: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _at_least(1, "tasks.train_size", self.train_size, "every update draws its tasks from them")
        _at_least(0, "tasks.val_size", self.val_size, "0 keeps no held-out tasks")
        if isinstance(self.holdout, bool) or not 0 <= self.holdout < 1:
            raise UserError(
                f"tasks.holdout ({self.holdout}) must be in [0, 1): the share of a file "
                "without split fields held out as val; e.g. 0.1"
            )


#: ``rollout.success_threshold`` when ``rollout.grader`` is ``judge`` and it is unset.
_JUDGE_SUCCESS = 0.5


@dataclass
class RolloutConfig:
    #: Rollouts per task (the GRPO group size).
    n: int = 8
    #: Groups (tasks) per update; a batch is batch_groups × n rollouts.
    batch_groups: int = 8
    #: "module:function" or "path/file.py:function" grading (task, final_answer) -> float,
    #: or -> {"reward": float, "success": bool} to say itself what counts as solved, and/or
    #: "turn_rewards": {call seq: float} beside "reward" (intermediate rewards, for
    #: trainer.credit=turn; a file path in a config file is relative to its folder);
    #: "judge" = each group's rollouts scored against each other by a judge model
    #: (rollout.judge, docs/judge.md); empty = the agent's own reward.
    grader: str = "tether.starter.calc:grade"
    #: When a rollout counts as a success (the success rate of train steps and evals), unless
    #: the grader says so itself: None = reward > 0; a number = reward >= success_threshold.
    #: With grader=judge, None means 0.5 (a judge scores nearly every answer above 0).
    success_threshold: float | None = None
    #: Drop groups that carry no signal (every rollout's reward equal; with trainer.credit
    #: "turn", every turn's return equal) from the update and sample more groups in their
    #: place, as DAPO's dynamic sampling does (docs/credit.md). Async mode drops them as
    #: they finish, while its scheduler keeps starting groups.
    filter_groups: bool = False
    #: With filter_groups: the most groups one update may sample, as a multiple of
    #: batch_groups (the first batch included; async: at most (this − 1) × batch_groups
    #: groups dropped per update); when they run out the update trains on the groups with
    #: signal it has. 1 = drop without sampling more.
    max_oversample: int = 3
    #: The judge of rollout.grader=judge: its endpoint, model, key and prompt.
    judge: JudgeConfig = field(default_factory=JudgeConfig)

    def __post_init__(self) -> None:
        if self.grader == "judge":
            self.judge.check_ready()
            if self.success_threshold is None:  # reward > 0 would count nearly every answer
                self.success_threshold = _JUDGE_SUCCESS
        _at_least(1, "rollout.max_oversample", self.max_oversample, "1 samples no extra groups")
        if self.n < 2:
            raise UserError(
                f"rollout.n ({self.n}) must be >= 2: group advantages need 2 samples or more per task"
            )
        _at_least(1, "rollout.batch_groups", self.batch_groups, "it is the tasks per update")
        t = self.success_threshold
        if t is not None and (isinstance(t, bool) or not math.isfinite(t)):
            raise UserError(
                f"rollout.success_threshold ({t}) must be a finite number, or null for reward > 0"
            )


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
    #: Sampling temperature of the eval's sampled rollouts (0: greedy).
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.every < 0:
            raise UserError(f"eval.every ({self.every}) must be >= 0 (0: only before and after)")
        if self.tasks < 1 or self.samples < 1:
            raise UserError(
                f"eval.tasks ({self.tasks}) and eval.samples ({self.samples}) must be >= 1; "
                "to skip held-out evaluation set eval.enabled=false"
            )
        t = self.temperature
        if isinstance(t, bool) or not (math.isfinite(t) and t >= 0):
            raise UserError(
                f"eval.temperature ({t}) must be a finite number >= 0 (0: greedy); e.g. 1.0"
            )


@dataclass
class CheckpointConfig:
    #: Save every this many updates (and at the end); 0 = only at the end.
    every: int = 0
    #: How many checkpoints to keep.
    keep: int = 2

    def __post_init__(self) -> None:
        _at_least(0, "checkpoint.every", self.every, "0 saves only at the end")
        _at_least(1, "checkpoint.keep", self.keep, "the newest one is what --resume continues")


@dataclass
class TrainConfig:
    # trainer.mode etc. load as run.mode etc., with a notice (configio)
    renamed: ClassVar[dict[str, str]] = {f"trainer.{k}": f"run.{k}" for k in MOVED}

    #: Name of the run; its files go to {dir}/{name}. One run per name: a new run under
    #: a name whose folder holds one is refused (continue it with --resume, or rename).
    name: str = "calc"
    #: Where run folders go, relative to the current directory.
    dir: str = "runs"
    #: The model trained and served (the policy), and where it runs.
    model: ModelConfig = field(default_factory=ModelConfig)
    #: Which engine serves rollouts: the embedded one (default) or vLLM / SGLang servers
    #: you started, sent new weights after every update (docs/engines.md).
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: Where the tasks come from and how many of each split are used.
    tasks: TasksConfig = field(default_factory=TasksConfig)
    #: How agents start; default: the calc agent in-process (tether.starter.calc:agent).
    #: In a config file, agent.entry "path/file.py:fn" and agent.cwd are relative to the
    #: file's folder, and each word of agent.command that names a file or folder there
    #: (agent.py, ./run.sh) becomes its absolute path; the agent still starts in the
    #: current directory (or agent.cwd, and then agent.command is left as written).
    agent: RunnerConfig = field(
        default_factory=lambda: RunnerConfig(mode="inprocess", entry="tether.starter.calc:agent")
    )
    #: Rollouts per task and per update, and how they are graded.
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    #: The policy update: algorithm, optimizer, batching (tether/trainer/config.py).
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: How collection and updates take turns: sync or async and async's bounds, the
    #: training processes, when a collapsed run stops (tether/run/_run_config.py).
    run: RunConfig = field(default_factory=RunConfig)
    #: Held-out evaluation on the val split: how often and how many rollouts.
    eval: EvalConfig = field(default_factory=EvalConfig)
    #: How often checkpoints are saved ({dir}/{name}/checkpoints/step-N) and how many are kept.
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    #: The run's gateway, which agents call: its address, caps and timeouts (tether/gateway/_config.py).
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    #: Metrics to TensorBoard (default), W&B, MLflow: a list of sinks, or a mapping
    #: (sinks, log_samples, ...); see tether/tracking/config.py and docs/tracking.md.
    tracking: TrackingConfig | list[str] = field(default_factory=TrackingConfig)
    #: Several agents in one run: each role an agent names in its URL
    #: ({base}/rollouts/{id}/roles/{role}/v1) → {train, adapter, weight} (docs/credit.md,
    #: "Roles"), e.g. {solver: {adapter: true}, critic: {train: false}}. Calls without a
    #: role train the shared policy; {} = any role, each training the shared policy.
    roles: dict[str, RoleConfig] = field(default_factory=dict)
    #: Continue the run of this name from its newest checkpoint (``tether train --resume``).
    resume: bool = False
    #: Free-form notes kept with the run's store record; tether reads none of them.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.tracking, TrackingConfig):  # the list form: the sinks
            self.tracking = TrackingConfig(sinks=list(self.tracking))
        if self.eval.enabled and self.tasks.val_size < 1:
            raise UserError(
                f"tasks.val_size ({self.tasks.val_size}) must be >= 1 with eval.enabled: "
                "the evals run on them; raise it or set eval.enabled=false"
            )
        self.run.check_async(self.rollout.batch_groups, self.rollout.n, self.agent.concurrency)
        self._check_engine()
        self._check_roles()

    def _check_engine(self) -> None:
        e = self.engine
        if not e.remote:
            return
        if e.transport == "lora" and self.trainer.lora is None:
            raise UserError(
                "engine.transport=lora pushes the LoRA adapter, so it needs a LoRA trainer: "
                "set trainer.lora (e.g. trainer.lora.r=16) or use engine.transport=disk"
            )
        if self.model.rollout_dtype != "float32":
            raise UserError(
                f"model.rollout_dtype ({self.model.rollout_dtype}) is the embedded engine's; "
                f"with engine.kind={e.kind} the server's own --dtype decides"
            )

    def _check_roles(self) -> None:
        self.roles = _role_configs(self.roles)
        if not self.roles:
            return
        self.gateway.roles = tuple(self.roles)  # the gateway serves exactly these
        special = [n for n, r in self.roles.items() if r.adapter or not r.train]
        if not special:
            return
        if self.trainer.lora is None:
            raise UserError(
                f"roles {', '.join(special)}: own adapters and frozen roles need a LoRA trainer "
                "(one base model, an adapter per role); set trainer.lora (e.g. trainer.lora.r=8)"
            )
        if self.engine.remote:
            raise UserError(
                f"roles {', '.join(special)}: own adapters and frozen roles are served by the "
                f"embedded engine only; use engine.kind=transformers (not {self.engine.kind})"
            )
        if self.model.rollout_dtype != "float32" or self.run.processes != 1:
            raise UserError(
                f"roles {', '.join(special)}: own adapters and frozen roles need "
                "model.rollout_dtype=float32 and run.processes=1 for now"
            )
        reserved = [n for n, r in self.roles.items() if r.adapter and n in ("default", "base")]
        if reserved:
            raise UserError(
                f"roles.{reserved[0]}: a role with its own adapter cannot be named "
                f"{reserved[0]!r} (the engine's name for the policy / the base weights); rename it"
            )
        self.gateway.role_adapters = {  # the engine adapter serving each special role
            n: n if r.adapter else BASE_ADAPTER for n, r in self.roles.items() if n in special
        }

    @staticmethod
    def resolve_file_paths(data: dict[str, Any], folder: Any) -> dict[str, Any]:
        """The load_config hook (configio): file-relative paths, and ``tracking: [...]`` as
        ``{sinks: [...]}`` so that ``tracking.log_samples=true`` overrides it."""
        return normalize_tracking(resolve_file_paths(data, folder))

    def gateway_for(self, admin_key: str) -> GatewayConfig:
        """The run's gateway config, a new object: ``admin_key`` (as
        :func:`tether.gateway.resolve_admin_key` decided it), and in async mode
        ``run.hold_timeout_s`` as the admission timeout."""
        gcfg = dataclasses.replace(self.gateway, admin_key=admin_key)
        hold = self.run.hold_timeout_s
        if self.run.mode == "async" and hold is not None:
            gcfg = dataclasses.replace(gcfg, admission_timeout_s=hold)
        return gcfg

    @property
    def groups_in_flight(self) -> int:
        """Async mode's bound on running groups (``max_groups_in_flight``, default 2 × batch)."""
        return self.run.groups_in_flight(self.rollout.batch_groups)
