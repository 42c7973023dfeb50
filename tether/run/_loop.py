"""The training loop: rollouts → rewards → advantages → update → new weights.

One asyncio loop holds the gateway (a uvicorn task), the runner and the
trainer; the engine decodes on its own thread and the optimizer step runs on
a worker thread, so agents' HTTP calls never wait on the loop.

Per update ``step`` (0-based):

1. ``batch_groups`` tasks (a pure function of seed and step) × ``n`` rollouts,
   each through the real gateway with its own token;
2. grade, drop groups with any unusable reward (counted, never scored 0),
   report zero-variance groups and the batch's diagnostics (``_diagnostics``);
3. advantages per group, samples (prefix-merged calls), one optimizer step;
4. push the weights to the engine; its policy version must rise by one;
5. metrics to the store (and the progress display); eval and checkpoint every K.

After each collection (an eval, a step's rollouts) ``_failures`` says on one
line when most rollouts failed, and stops the run when every rollout of its
first collection failed. "Success" is each rollout's own verdict (the
grader's flag or ``rollout.success_threshold``, see ``_collect``), so train
steps and evals count it the same way.

With ``resume`` (``tether train --resume``) the run continues from its
newest checkpoint (``_rundir.py``): at the checkpoint's step, with the
engine at the checkpoint's policy version, in a new store record linked to
the one it continues, and with the earlier sessions' metrics and evals in
``history`` and ``evals`` (the step-0 eval is not repeated).

That is sync mode. In async mode (``trainer.mode: async``, ``_async.py``)
groups keep running across updates, and steps 1 and 4 become: wait for
``batch_groups`` finished groups, pause admission at the gateway, drain,
update, push, resume.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import secrets
import time
from pathlib import Path
from typing import Any

import torch

from tether._memory import resident_mb, trim_heap
from tether.engine import Engine, TransformersEngine
from tether.gateway import Gateway, GatewayConfig, LoopServer, create_app
from tether.records import Checkpoint
from tether.run._async import AsyncRollouts
from tether.run._collect import RolloutOutcome, collect_groups, load_grader
from tether.run._diagnostics import batch_diagnostics
from tether.run._evaluate import EvalResult, StepReport, collect_eval, success_rate
from tether.run._events import Counted, EvalStart
from tether.run._failures import check_collection
from tether.run._ranks import RankGroup
from tether.run._rundir import ResumePoint, past_metrics, resume_point
from tether.run._setup import (
    async_rollouts,
    end_status,
    gateway_config,
    record_config,
    resolve_model_path,
)
from tether.run._tasks import load_tasks, tasks_for_step
from tether.run._ui import mount_ui, ui_line
from tether.run.config import TrainConfig
from tether.runner import make_runner
from tether.store import AlreadyExists, Store
from tether.tracking import Tracking, open_tracking, sample_rows
from tether.trainer import PolicyTrainer
from tether.trainer import algorithms as A
from tether.trainer.checkpoint import checkpoint_state, load_checkpoint, save_checkpoint
from tether.trainer.distributed import world_from_env
from tether.trainer.errors import PolicyCollapsed, RankFailed, TrainerError
from tether.trainer.samples import build_samples

__all__ = ["TrainingRun"]

log = logging.getLogger(__name__)


class TrainingRun:
    """A training run over one config. Use as ``async with TrainingRun(cfg) as run: await run.train()``.

    ``engine`` replaces the embedded TransformersEngine (the run then owns and
    closes it); tests use it to serve with a deterministic configuration.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        on_event: Any = None,
        model_path: Path | None = None,
        engine: Engine | None = None,
        command: str = "train",
    ):
        self.cfg = cfg
        #: "train", or "eval" for ``tether eval``: its store record is then not a training
        #: run (``extra.command: eval`` in the record, see _rundir.py).
        self.command = command
        self._engine = engine
        self.on_event = on_event or (lambda kind, payload: None)
        self.run_dir = Path(cfg.dir) / cfg.name
        self.model_path = model_path
        self.history: list[StepReport] = []
        self.evals: list[EvalResult] = []
        self.start_step = 0
        #: The id of the run's first store record: the same across --resume, and the
        #: ``run`` its checkpoints carry (pruning only touches this run's checkpoints).
        self.lineage: str | None = None
        self.step = 0  # updates done so far (what an interrupt reports)
        self.last_checkpoint: Path | None = None  # the newest checkpoint of this run
        self._async: AsyncRollouts | None = None
        #: The other training processes (``trainer.processes`` > 1, or a launcher); None alone.
        self.ranks: RankGroup | None = None
        self._clean_steps = 0  # optimizer steps after the last finished update (see _rank_failed)
        self._collections = 0  # checked so far (the first one stops the run if all fail)
        #: The run's config as its store record and checkpoints hold it (``extra`` gains
        #: ``command``, ``resumed_from``, ``resumed_at``); ``cfg`` itself is never changed.
        self.record_config: dict[str, Any] = {}
        #: The gateway's effective config: the admin key made when none was given, the
        #: server's URL, async mode's hold timeout (``cfg.gateway`` is left as given).
        self.gateway_config: GatewayConfig | None = None
        #: The run's tracking sinks (``tracking``; training runs only, see tether/tracking).
        self.tracking = Tracking([])

    # -- set-up and teardown ---------------------------------------------------

    async def __aenter__(self) -> TrainingRun:
        try:
            return await self._open()
        except BaseException as exc:  # cancelled (Ctrl-C) or failed half-way: close what was built
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise

    async def _open(self) -> TrainingRun:
        from tether.models import load_model, load_tokenizer

        cfg = self.cfg
        resume = (  # before the slow part: "nothing to resume" is a one-line error at once
            resume_point(Path(cfg.dir), cfg.name, cfg.trainer.steps) if cfg.resume else None
        )
        torch.manual_seed(cfg.trainer.seed)
        random.seed(cfg.trainer.seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.command == "train" and (cfg.trainer.processes > 1 or world_from_env() > 1):
            self.on_event("status", "starting the training processes")
            self.ranks = RankGroup.start(cfg.trainer, cfg.model.device)
        self.on_event("status", f"loading the model {self.model_path or cfg.model.path}")
        self.model_path = self.model_path or resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(self.model_path)
        policy = load_model(self.model_path, dtype=torch.float32, device=cfg.model.device)
        self.trainer = PolicyTrainer(
            policy,
            cfg.trainer,
            device=cfg.model.device,
            train_dtype=cfg.model.train_dtype,
            pad_id=self.tokenizer.pad_token_id or 0,
            ranks=self.ranks.ranks if self.ranks else None,
        )
        if self.ranks is not None:
            self.ranks.hello(self.trainer, self.model_path, cfg.model.train_dtype)
        share = self._engine is None and self.trainer.can_share_weights()  # one copy, not two
        self.engine = self._engine or TransformersEngine(
            self.trainer.model
            if share
            else load_model(self.model_path, dtype=torch.float32, device=cfg.model.device),
            self.tokenizer,
            device=cfg.model.device,
            max_batch_size=cfg.model.max_batch_size,
            seed=cfg.trainer.seed,
            rollout_dtype=None if cfg.model.rollout_dtype == "float32" else cfg.model.rollout_dtype,
        )
        if share:
            self.trainer.share_weights(self.engine.weights_lock)
        if cfg.model.rollout_dtype != "float32" and not cfg.trainer.tis_cap:
            log.warning(
                "model.rollout_dtype %s without trainer.tis_cap: the PPO ratio is taken against "
                "the rounded engine's logprobs; set trainer.tis_cap=2 to correct (docs/int8.md)",
                cfg.model.rollout_dtype,
            )
        self.store = Store(self.run_dir / "traces.sqlite")
        self.on_event(
            "status", f"run folder {self.run_dir}  traces {self.run_dir / 'traces.sqlite'}"
        )
        self.record_config = record_config(cfg, self.command, resume)
        self.run_record = self.store.create_run(
            self.record_config, run_id=f"{cfg.name}-{secrets.token_hex(4)}"
        )
        self.lineage = (resume.run if resume else None) or self.run_record.id
        if self.command == "train":
            self.tracking = open_tracking(
                cfg.tracking, self.run_dir, self.run_record.id, self.run_record.config
            )
        self.train_tasks, self.val_tasks = load_tasks(cfg.tasks)
        try:  # the run's task set, so its rollouts' task_ids resolve to their task
            self.store.add_tasks(self.train_tasks + self.val_tasks, run_id=self.run_record.id)
        except AlreadyExists as e:  # two tasks share an id: the run itself is unaffected
            log.warning("tasks not stored: %s; give each task in tasks.source its own id", e)
        self.grader = load_grader(cfg.rollout.grader)
        gcfg = gateway_config(cfg)
        gcfg.check_bind()
        self.on_event("status", "starting the gateway and the agent runner")
        self.gateway = Gateway(self.engine, self.tokenizer, self.store, gcfg, seed=cfg.trainer.seed)
        app = create_app(self.gateway)
        self._ui = mount_ui(app, self)  # the dashboard at /ui
        self.server = await LoopServer(app, gcfg.host, gcfg.port or 0).start()
        if not gcfg.public_url:  # port 0: the URL is known once the server listens
            gcfg = self.gateway.config = dataclasses.replace(gcfg, public_url=self.server.url)
        self.gateway_config = gcfg
        self.on_event("status", ui_line(self, self.server.url))
        self.runner = make_runner(cfg.agent)
        # rollouts wait as "queued" until the runner starts their agent
        self.runner.on_start = lambda launch: self.gateway.mark_running(
            launch.rollout_id, launch.attempt
        )
        if resume is not None:
            await self._resume(resume)
        if self.ranks is not None:  # every rank starts from rank 0's weights and optimizer
            self.ranks.sync(self.trainer)
        return self

    async def _resume(self, at: ResumePoint) -> None:
        self.start_step = load_checkpoint(at.path, self.trainer)
        self.last_checkpoint = at.path
        version = await self.engine.update_weights(
            self.trainer.state_dict(),
            **({} if at.policy_version is None else {"version": at.policy_version}),
        )
        if at.run_id is not None:
            steps, evals = past_metrics(self.store, at.run_id, self.start_step)
            self.history = [StepReport(s, m) for s, m in steps.items()]
            self.evals = [EvalResult.from_metrics(s, m) for s, m in evals.items()]
        log.info("resumed from %s at step %d, policy v%d", at.path, self.start_step, version)
        self.on_event("resume", at)

    async def __aexit__(self, *exc: object) -> None:
        """Stop the rollouts, then the agents, the gateway and the engine, and close the store.

        The runner goes before the gateway: an agent that outlived its gateway would
        fail as "unreachable" and be retried. Parts that were never built (start-up
        interrupted) are skipped.
        """
        if getattr(self, "trainer", None) is not None:
            self.trainer.stop()  # an update still running on its thread ends at its next micro-batch
        closes = [self.stop_rollouts]
        for name, method in (("runner", "close"), ("server", "stop"), ("engine", "close")):
            part = getattr(self, name, None)
            if part is not None:
                closes.append(getattr(part, method))
        if self.ranks is not None:
            ranks, clean = self.ranks, not exc or exc[0] is None
            closes.append(lambda: asyncio.to_thread(ranks.close, clean))
        for close in closes:
            try:
                await close()
            except Exception:  # teardown must reach every part
                log.exception("error while shutting down")
        if getattr(self, "_ui", None) is not None:
            self._ui.close()
        if getattr(self, "store", None) is not None:
            self.tracking.close(failed=bool(exc and exc[0] is not None))
            if getattr(self, "run_record", None) is not None:
                self.store.set_run_status(self.run_record.id, end_status(exc[0] if exc else None))
            self.store.close()

    # -- evaluation ------------------------------------------------------------

    async def evaluate(self, step: int) -> EvalResult:
        """Held-out success as the agent really runs: sampled (several per task) and greedy."""
        e = self.cfg.eval
        tasks = self.val_tasks[: e.tasks]
        what = f"{len(tasks)} tasks × {e.samples} samples{' + greedy' if e.greedy else ''}"
        log.info("eval @ step %d: %s", step, what)
        t0 = time.perf_counter()
        total = len(tasks) * (e.samples + (1 if e.greedy else 0))
        self.on_event("eval_start", EvalStart(step, total, what))
        sampled, greedy, outcomes = await collect_eval(
            self.gateway,
            Counted(self.runner, lambda: self.on_event("eval_progress", None)),
            tasks,
            e,
            step=step,
            grader=self.grader,
            run_id=self.run_record.id,
            success_threshold=self.cfg.rollout.success_threshold,
        )
        self._check(outcomes, f"the step-{step} eval")
        wall_s = time.perf_counter() - t0
        result = EvalResult(step, sampled, greedy, len(tasks), len(outcomes), wall_s)
        self.store.log_metrics(self.run_record.id, step, result.metrics())
        self.tracking.log_metrics(step, result.metrics())
        self.evals.append(result)
        trim_heap()
        self.on_event("eval", result)
        return result

    # -- one update --------------------------------------------------------------

    async def train_step(self, step: int) -> StepReport:
        cfg = self.cfg
        t0 = time.perf_counter()
        if cfg.trainer.mode == "async":
            return self._report(step, await self._async_rollouts().step(step), t0)
        tasks = tasks_for_step(self.train_tasks, step, cfg.rollout.batch_groups, cfg.tasks.seed)
        log.info("step %d: rollouts, %d tasks × %d", step + 1, len(tasks), cfg.rollout.n)
        collected = await collect_groups(
            self.gateway,
            self.runner,
            tasks,
            cfg.rollout.n,
            grader=self.grader,
            run_id=self.run_record.id,
            tag=f"s{step}",
            success_threshold=cfg.rollout.success_threshold,
        )
        t_rollouts = time.perf_counter() - t0
        m = await self.learn(collected.groups())
        m["rollout_s"] = t_rollouts
        m["gen_tokens_per_s"] = collected.completion_tokens / max(t_rollouts, 1e-9)
        return self._report(step, m, t0)

    async def learn(self, groups: list[list[RolloutOutcome]]) -> dict[str, float]:
        """Grade-filter ``groups``, update the policy on them and push the weights to the engine.

        Drops groups with any unusable reward (counted); returns the step's metrics.
        """
        cfg = self.cfg
        kept = [g for g in groups if all(o.usable for o in g)]
        outcomes = [o for g in groups for o in g]
        self._check(outcomes, f"step {self.start_step + len(self.history) + 1}")
        if self.tracking.samples_on:  # tracking.log_samples: prompts and completions
            self.tracking.log_samples(self.start_step + len(self.history), sample_rows(outcomes))
        rewards_all = [o.reward for o in outcomes if o.reward is not None]
        m: dict[str, float] = {
            "reward_mean": sum(rewards_all) / max(len(rewards_all), 1),
            "success": success_rate(outcomes),
            "groups_dropped": float(len(groups) - len(kept)),
            "rollouts": float(len(outcomes)),
        }
        version_before = self.engine.policy_version
        if kept:
            rewards = torch.tensor([[o.reward for o in g] for g in kept], dtype=torch.float64)
            adv = A.compute_advantages(rewards, cfg.trainer.advantage)
            flat = [o for g in kept for o in g]
            samples, sstats = build_samples(
                [o.calls for o in flat], adv.advantages.flatten().tolist()
            )
            m["zero_variance_groups"] = float(adv.zero_variance_groups)
            m.update(batch_diagnostics(samples, len(flat), len(kept), adv.zero_variance_groups))
            m["merge_fraction"] = sstats.merge_fraction
            m["failed_calls"] = float(sstats.failed_calls)
            if adv.zero_variance_groups < len(kept) and samples:
                t1 = time.perf_counter()
                m.update(await asyncio.to_thread(self.trainer.update, samples))
                self._clean_steps = self.trainer.optimizer_steps
                m["update_s"] = time.perf_counter() - t1
                version = await self.engine.update_weights(self.trainer.state_dict())
                if version != version_before + 1:
                    raise TrainerError(
                        f"engine policy version went {version_before} -> {version}, expected +1"
                    )
        m["policy_version"] = float(self.engine.policy_version)
        return m

    def _check(self, outcomes: list[RolloutOutcome], what: str) -> None:
        """Say loudly when most rollouts failed; stop when all of the first collection did."""
        first = self._collections == 0
        self._collections += 1
        check_collection(outcomes, what, first=first)

    def _report(self, step: int, m: dict[str, float], t0: float) -> StepReport:
        m["step_s"] = time.perf_counter() - t0
        trim_heap()  # freed tensors' pages back to the OS (see tether/_memory.py)
        rss = resident_mb()
        if rss is not None:  # self-check: memory that grows step after step is a leak
            m["rss_mb"] = rss
        self.store.log_metrics(self.run_record.id, step, m)
        self.tracking.log_metrics(step, m)
        report = StepReport(step, m)
        self.history.append(report)
        self.on_event("step", report)
        return report

    # -- async mode (tether/run/_async.py) ----------------------------------------

    def _async_rollouts(self) -> AsyncRollouts:
        if self._async is None:  # the config's sanity warnings are TrainConfig.__post_init__'s
            self._async = async_rollouts(self)
        return self._async

    async def stop_rollouts(self) -> None:
        """Async mode: cancel the groups still running (before the final eval, and on exit)."""
        if self._async is not None:
            await self._async.stop()

    def _collapsed(self) -> bool:
        k = self.cfg.trainer.collapse_patience
        recent = self.history[-k:] if k else []
        return bool(k) and len(recent) == k and all(r.metrics["reward_mean"] <= 0 for r in recent)

    async def train(self) -> list[EvalResult]:
        """Evaluate, train ``trainer.steps`` updates (evaluating/checkpointing every K), evaluate."""
        cfg = self.cfg
        evals_on = cfg.eval.enabled
        every = cfg.eval.every if evals_on else 0
        self.step = self.start_step
        if self.start_step == 0 and evals_on:
            await self.evaluate(0)
        for step in range(self.start_step, cfg.trainer.steps):
            try:
                await self.train_step(step)
            except RankFailed as exc:
                raise self._rank_failed(exc) from exc
            done = self.step = step + 1
            if self._collapsed():
                raise PolicyCollapsed(
                    f"reward has been 0 for {cfg.trainer.collapse_patience} updates in a row at step {done}: "
                    f"the policy collapsed; lower trainer.lr (now {cfg.trainer.lr:g}) or raise trainer.collapse_patience"
                )
            if (
                cfg.checkpoint.every
                and done % cfg.checkpoint.every == 0
                and done < cfg.trainer.steps
            ):
                self.save(done)
            if every and done % every == 0 and done < cfg.trainer.steps:
                await self.evaluate(done)
        await self.stop_rollouts()
        self.save(cfg.trainer.steps)
        if evals_on:
            await self.evaluate(cfg.trainer.steps)
        return self.evals

    def _rank_failed(self, exc: RankFailed) -> RankFailed:
        """A training process died or hung during an update: keep a checkpoint of the last
        finished step (rank 0's weights and optimizer are those of that step unless an
        optimizer step of the failed update already ran) and say how to go on."""
        exits = self.ranks.exits() if self.ranks else ""
        where = f"{exc}; {exits}" if exits else str(exc)
        ckpt = self.last_checkpoint
        done = ckpt is not None and ckpt.name == f"step-{self.step:06d}"
        if not done and self.trainer.optimizer_steps == self._clean_steps:
            ckpt = self.save(self.step)
        kept = (
            f"checkpoint of step {checkpoint_state(ckpt).get('step')}: {ckpt}"
            if ckpt
            else "no checkpoint"
        )
        return RankFailed(f"{where}; {kept}; continue it with --resume")

    def save(self, step: int) -> Path:
        log.info("saving the checkpoint of step %d", step)
        path = save_checkpoint(
            self.run_dir / "checkpoints",
            step,
            trainer=self.trainer,
            tokenizer=self.tokenizer,
            base_model_dir=self.model_path,
            config=self.record_config,
            keep=self.cfg.checkpoint.keep,
            run=self.lineage,
            run_id=self.run_record.id,
            policy_version=self.engine.policy_version,
        )
        self.last_checkpoint = path
        self.store.add_checkpoint(Checkpoint(run_id=self.run_record.id, step=step, path=str(path)))
        self.on_event("checkpoint", path)
        return path
