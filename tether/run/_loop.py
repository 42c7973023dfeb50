"""The training loop: rollouts → rewards → advantages → update → new weights.

One asyncio loop holds the gateway (a uvicorn task), the runner and the
trainer; the engine decodes on its own thread and the optimizer step runs on
a worker thread, so agents' HTTP calls never wait on the loop.

Steps are numbered by updates, from 1: step N is the N-th update, and its metrics,
samples, rollouts (groups ``s{N}``), tracking scalars and checkpoint ``step-0000NN``
all say N. The eval before any update is at step 0, the one after update N at step N.
Per update ``step``:

1. ``batch_groups`` tasks (a pure function of seed and step) × ``n`` rollouts,
   each through the real gateway with its own token;
2. grade, drop groups with any unusable reward (counted, never scored 0),
   report zero-variance groups and the batch's diagnostics (``_diagnostics``);
3. advantages per group, samples (prefix-merged calls), one optimizer step;
4. push the weights to the engine; its policy version must rise by one;
5. metrics to the store (and the progress display); eval and checkpoint every K.

While it trains (or, for ``tether eval``, evaluates) the run asks its engine whether
it is gone (``_watch``: every remote server down past its grace period, the embedded
worker thread dead) and stops on one line if so, with no eval after it.

After each collection (an eval, a step's rollouts) ``_failures`` says on one
line when most rollouts failed, and stops the run when every rollout of its
first collection failed. "Success" is each rollout's own verdict (the
grader's flag or ``rollout.success_threshold``, see ``_finish``), so train
steps and evals count it the same way.

With ``resume`` (``tether train --resume``) the run continues from its
newest checkpoint (``_rundir.py``): at the checkpoint's step, with the
engine at the checkpoint's policy version, in a new store record linked to
the one it continues, and with the earlier sessions' metrics and evals in
``history`` and ``evals`` (the step-0 eval is not repeated).

The run is built once (``_parts.py``: store, engine, trainer, gateway, runner,
tracking, dashboard, in one :class:`RunParts`) and torn down in reverse
order; the step counter is the run's own (``step``: 0 before the first update, N from
the start of update N until update N + 1 starts), never derived from how many reports
it holds.
Listeners get typed events (``_events.py``).

That is sync mode. In async mode (``run.mode: async``, ``_async.py``)
groups keep running across updates, and steps 1 and 4 become: wait for
``batch_groups`` finished groups, pause admission at the gateway, drain,
update, push, resume.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TypeVar

import torch

from tether._memory import limit_arenas, resident_mb, trim_heap
from tether.engine import Engine
from tether.records import Phase, Place, Task, UpdateGroup
from tether.run._async import AsyncRollouts
from tether.run._async_parts import async_rollouts
from tether.run._checkpoints import rank_failed, save_step
from tether.run._collect import Collected, Collector, RolloutOutcome
from tether.run._diagnostics import check_collapse, first_rollout
from tether.run._evaluate import EvalResult, StepReport, collect_eval, success_rate
from tether.run._events import (
    CheckpointSaved,
    Counted,
    EvalDone,
    EvalProgress,
    EvalStart,
    Resumed,
    RunEvent,
    Status,
    StepDone,
    ignore,
)
from tether.run._failures import check_collection
from tether.run._filter_groups import collect_with_signal, extra_tasks
from tether.run._learn import Learning, learn_metrics, update_record
from tether.run._memwatch import MemoryWatch
from tether.run._parts import PartsView, RunParts, open_parts
from tether.run._rundir import ResumePoint, past_metrics, resume_point
from tether.run._tasks import tasks_for_step
from tether.run._watch import watched
from tether.run._weights import push_update, restore
from tether.run.config import TrainConfig
from tether.tracking import sample_rows
from tether.trainer.errors import RankFailed

__all__ = ["TrainingRun"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class TrainingRun(PartsView):
    """A training run over one config. Use as ``async with TrainingRun(cfg) as run: await run.train()``.

    ``engine`` replaces the embedded TransformersEngine (the run then owns and
    closes it); tests use it to serve with a deterministic configuration.
    ``on_event`` gets the run's :data:`RunEvent` s.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        on_event: Callable[[RunEvent], None] | None = None,
        model_path: Path | None = None,
        engine: Engine | None = None,
        command: str = "train",
    ):
        limit_arenas()  # before the run's threads start, as the tether command does (_memory.py)
        self.cfg = cfg
        #: "train", or "eval" for ``tether eval``: its store record is then not a training
        #: run (``extra.command: eval`` in the record, see _rundir.py).
        self.command = command
        self.on_event = on_event or ignore
        self.run_dir = Path(cfg.dir) / cfg.name
        self._model_path, self._engine = model_path, engine
        self._parts: RunParts | None = None
        self._stack = AsyncExitStack()
        self.history: list[StepReport] = []  # every update's report, earlier sessions' too
        self.evals: list[EvalResult] = []
        self.start_step = 0  # the step this session started at (a checkpoint's, with resume)
        #: The step the run is at (the one numbering, see the module docstring): N from the
        #: start of update N (the one in progress) until update N + 1 starts; 0 before the
        #: first. What an interrupt reports; an eval after update N runs at it.
        self.step = 0
        self._at = "before the first update"  # where the run is, for the engine-lost line
        self.last_checkpoint: Path | None = None  # the newest checkpoint of this run
        self._async: AsyncRollouts | None = None
        self._collector: Collector | None = None
        self._clean_steps = (
            0  # optimizer steps after the last finished update (see _checkpoints.py)
        )
        self._collections = 0  # checked so far (the first one stops the run if all fail)
        self._said_no_val = False  # "no val tasks: the evals are skipped", said once
        #: resident memory past the warm-up: its growth per update, one warning (_memwatch.py)
        self.memory = MemoryWatch(cfg.trainer.memory_warn_mib, cfg.trainer.memory_warmup)

    # -- open and close ----------------------------------------------------------

    async def __aenter__(self) -> TrainingRun:
        cfg = self.cfg
        try:
            resume = (  # before the slow part: "nothing to resume" is a one-line error at once
                resume_point(Path(cfg.dir), cfg.name, cfg.trainer.steps) if cfg.resume else None
            )
            torch.manual_seed(cfg.trainer.seed)
            random.seed(cfg.trainer.seed)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._parts = await open_parts(
                cfg,
                self._stack,
                self.on_event,
                command=self.command,
                model_path=self._model_path,
                engine=self._engine,
                resume=resume,
            )
            self._stack.push_async_callback(self.stop_rollouts)  # first at teardown
            if resume is not None:
                await self._resume(resume)
            if self.ranks is not None:  # every rank starts from rank 0's weights and optimizer
                self.ranks.sync(self.trainer)
        except BaseException as exc:  # cancelled (Ctrl-C) or failed half-way: close what was built
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def _resume(self, at: ResumePoint) -> None:
        self.step, version = await restore(self.trainer, self.engine, at)
        self.start_step, self.last_checkpoint = self.step, at.path
        if at.run_id is not None:
            steps, evals = past_metrics(self.store, at.run_id, self.start_step)
            self.history = [StepReport(s, m) for s, m in steps.items()]
            self.evals = [EvalResult.from_metrics(s, m) for s, m in evals.items()]
        log.info("resumed from %s at step %d, policy v%d", at.path, self.start_step, version)
        self.on_event(Resumed(at))

    async def __aexit__(self, *exc: object) -> None:
        """Stop the rollouts and the update, then tear the parts down in reverse order of
        construction (``_parts.py``); parts that were never built are skipped."""
        stack, self._stack = self._stack, AsyncExitStack()
        await stack.__aexit__(*exc)  # type: ignore[arg-type]

    # -- the parts ------------------------------------------------------------------

    # -- the loop -------------------------------------------------------------------

    async def train(self) -> list[EvalResult]:
        """Evaluate, train ``trainer.steps`` updates (evaluating/checkpointing every K), evaluate;
        :class:`~tether.engine.EngineLost` when the engine is gone (``_watch.py``)."""
        return await self.watching(self._train())

    async def watching(self, work: Awaitable[T]) -> T:
        """Await ``work`` (the run's training, or an eval of ``tether eval``), stopping it
        with :class:`~tether.engine.EngineLost` once the engine is gone (``_watch.py``)."""
        return await watched(self.engine, work, lambda: self._at)

    async def _train(self) -> list[EvalResult]:
        cfg = self.cfg
        steps = cfg.trainer.steps
        every = cfg.eval.every if cfg.eval.enabled else 0
        if self.start_step == 0 and cfg.eval.enabled:
            await self.evaluate(0)
        for step in range(self.start_step + 1, steps + 1):
            try:
                await self.train_step(step)
            except RankFailed as exc:
                ckpt, clean = self.last_checkpoint, self._clean_steps
                raise rank_failed(exc, self.parts, step, ckpt, clean, self.save) from exc
            self._check_collapse(step)
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < steps:
                self.save(step)
            if every and step % every == 0 and step < steps:
                await self.evaluate(step)
        await self.stop_rollouts()
        self.save(steps)
        if cfg.eval.enabled:
            await self.evaluate(steps)
        return self.evals

    # -- evaluation ------------------------------------------------------------

    async def evaluate(self, step: int) -> EvalResult | None:
        """Held-out success and mean reward as the agent really runs: sampled (several per
        task) and greedy. None without val tasks: an eval over no task is not run, not
        recorded, and said once."""
        e, parts = self.cfg.eval, self  # the parts as the run's attributes
        tasks = parts.val_tasks[: e.tasks]
        if not tasks:
            if not self._said_no_val:
                self._said_no_val = True
                line = "no val tasks: the held-out evals are skipped (none is run or recorded)"
                log.warning("%s", line)
                self.on_event(Status(line))
            return None
        self._at = f"in the step-{step} eval"
        samples = f"{e.samples} sample{'s' if e.samples != 1 else ''}"
        what = f"{len(tasks)} tasks × {samples}{' + greedy' if e.greedy else ''}"
        log.info("eval @ step %d: %s", step, what)
        t0 = time.perf_counter()
        total = len(tasks) * (e.samples + (1 if e.greedy else 0))
        self.on_event(EvalStart(step, total, what))
        counted = Counted(parts.runner, lambda: self.on_event(EvalProgress()))
        rollouts = await collect_eval(self.collector.with_runner(counted), tasks, e, step=step)
        self._check(rollouts.outcomes, f"the step-{step} eval")
        result = rollouts.result(step, len(tasks), time.perf_counter() - t0)
        parts.store.log_metrics(parts.run_record.id, step, result.metrics())
        parts.tracking.log_metrics(step, result.metrics())
        self.evals.append(result)
        trim_heap()
        self.on_event(EvalDone(result))
        return result

    # -- one update --------------------------------------------------------------

    async def train_step(self, step: int) -> StepReport:
        """Update ``step`` (from 1): collect its rollouts, learn, report. From here on the
        run is at ``step`` (the one place that moves the counter)."""
        cfg, parts = self.cfg, self  # the parts as the run's attributes
        self.step, self._at = step, f"at update {step}"
        t0 = time.perf_counter()
        if cfg.run.mode == "async":
            return self._report(step, await self._async_rollouts().step(step), t0)
        tasks = tasks_for_step(parts.train_tasks, step, cfg.rollout.batch_groups, cfg.tasks.seed)
        log.info("step %d: rollouts, %d tasks × %d", step, len(tasks), cfg.rollout.n)

        async def collect(tasks: list[Task], first_group: int) -> Collected:
            at = Place(Phase.TRAIN, step)
            return await self.collector.collect(tasks, cfg.rollout.n, at, first_group=first_group)

        groups, filtered = await collect_with_signal(  # rollout.filter_groups: and more groups
            collect,
            tasks,
            lambda r, k: extra_tasks(parts.train_tasks, step, r, k, cfg.tasks.seed),
            Learning.of(cfg),
            cfg.rollout.max_oversample,
        )
        tokens = filtered.pop("completion_tokens")
        t_rollouts = time.perf_counter() - t0
        m = await self.learn(groups, step)
        m.update(filtered)
        m["rollout_s"] = t_rollouts
        m["gen_tokens_per_s"] = tokens / max(t_rollouts, 1e-9)
        return self._report(step, m, t0)

    async def learn(
        self, groups: list[list[RolloutOutcome]], step: int, dropped: Sequence[UpdateGroup] = ()
    ) -> dict[str, float]:
        """Update ``step``: grade-filter ``groups``, update the policy on them and push the
        weights to the engine. Drops groups with any unusable reward (counted); stores what
        it trained (with the groups async mode ``dropped`` before it); returns the step's
        metrics."""
        parts = self  # the parts as the run's attributes
        outcomes = [o for g in groups for o in g]
        self._check(outcomes, f"step {step}")
        if parts.tracking.samples_on:  # tracking.log_samples: prompts and completions
            parts.tracking.log_samples(step, sample_rows(outcomes))
        how = Learning.of(self.cfg)
        m, samples, fates = learn_metrics(groups, how)
        m["success"] = success_rate(outcomes)
        version = None
        if samples:
            t1 = time.perf_counter()
            m.update(await asyncio.to_thread(parts.trainer.update, samples))
            self._clean_steps = parts.trainer.optimizer_steps
            m["update_s"] = time.perf_counter() - t1
            version = await push_update(parts.trainer, parts.engine)
        m["policy_version"] = float(parts.engine.policy_version)
        record = update_record(parts.run_record.id, step, version, how, [*dropped, *fates])
        parts.store.add_update(record)
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
            if warning := self.memory.add(step, rss):
                log.warning("%s", warning)
        self.store.log_metrics(self.run_record.id, step, m)
        self.tracking.log_metrics(step, m)
        report = StepReport(step, m)
        self.history.append(report)
        self.on_event(StepDone(report))
        return report

    def _check_collapse(self, step: int) -> None:
        """Stop after ``run.collapse_patience`` updates of reward <= 0 (``_diagnostics``)."""
        check_collapse(
            step,
            [r.metrics for r in self.history],
            self.cfg.run.collapse_patience,
            self.cfg.trainer.lr,
            lambda: first_rollout(self.store, self.run_record.id),
        )

    # -- collection (tether/run/_collect.py), async mode (tether/run/_async.py) -----

    @property
    def collector(self) -> Collector:
        """How the run collects its rollouts: with its gateway, store, runner and grader."""
        if self._collector is None:
            self._collector = Collector(
                self.gateway, self.store, self.runner, run_id=self.run_record.id,
                grader=self.grader, success_threshold=self.cfg.rollout.success_threshold,
            )  # fmt: skip
        return self._collector

    def _async_rollouts(self) -> AsyncRollouts:
        if self._async is None:  # the config's sanity warnings are TrainConfig.__post_init__'s
            self._async = async_rollouts(
                self.cfg,
                self.parts,
                self.collector,
                lambda groups, dropped: self.learn(groups, self.step, dropped),  # this step
                self.start_step,
            )
        return self._async

    async def stop_rollouts(self) -> None:
        """Async mode: cancel the groups still running (before the final eval, and on exit)."""
        if self._async is not None:
            await self._async.stop()

    # -- checkpoints --------------------------------------------------------------

    def save(self, step: int) -> Path:
        log.info("saving the checkpoint of step %d", step)
        path = save_step(self.parts, self.run_dir / "checkpoints", step, self.cfg.checkpoint.keep)
        self.last_checkpoint = path
        self.on_event(CheckpointSaved(step, path))
        return path
