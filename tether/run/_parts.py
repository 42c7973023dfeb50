"""The parts of a training run, built once, in order, and torn down in reverse.

:func:`open_parts` builds the training processes (``run.processes`` > 1),
the tokenizer and the trainer, the engine, the store and the run's record,
the tracking sinks, the tasks and the grader, the gateway with its dashboard
and server, and the agent runner, in that order, into one :class:`RunParts`.
Each part's close goes on the caller's :class:`contextlib.AsyncExitStack` as
soon as the part exists, so closing the stack tears down what was built, in
reverse: the runner before the server (an agent that outlived its gateway
would fail as "unreachable" and be retried), the server before the engine,
the store last but the model. A close that raises is logged and the others
still run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from tether.dashboard import Catalog
from tether.engine import Engine, TransformersEngine
from tether.gateway import (
    AdminKey,
    Gateway,
    GatewayConfig,
    LoopServer,
    create_app,
    resolve_admin_key,
)
from tether.records import Run, Task
from tether.run._events import RunEvent, Status
from tether.run._grading import AnyGrader
from tether.run._judge import open_grader
from tether.run._paths import resolve_model_path
from tether.run._ranks import RankGroup
from tether.run._rundir import ResumePoint, end_status, record_config
from tether.run._tasks import exposed_fields, load_task_set
from tether.run._ui import mount_ui, ui_line
from tether.run.config import TrainConfig
from tether.runner import Runner, make_runner
from tether.store import AlreadyExists, Store
from tether.tracking import Tracking, TrackingConfig, open_tracking
from tether.trainer import PolicyTrainer
from tether.trainer.distributed import world_from_env
from tether.trainer.errors import TrainerError

__all__ = ["ModelParts", "PartsView", "RecordParts", "RunParts", "ServingParts", "open_parts"]

log = logging.getLogger(__name__)

Say = Callable[[RunEvent], None]
T = TypeVar("T")


@dataclass(frozen=True)
class ModelParts:
    """The model's parts: the tokenizer, the trainer and the engine (:func:`_model`)."""

    path: Path  # the model's folder (a Hub id resolved)
    tokenizer: Any
    trainer: PolicyTrainer
    engine: Engine


@dataclass(frozen=True)
class RecordParts:
    """What the run records and reads: the store, its record, tracking, the tasks
    (:func:`_records`)."""

    store: Store
    #: The run's config as its store record and checkpoints hold it (``extra`` gains
    #: ``command``, ``resumed_from``, ``resumed_at``); the TrainConfig itself is never changed.
    config: dict[str, Any]
    run_record: Run
    #: The id of the run's first store record: the same across --resume, and the ``run``
    #: its checkpoints carry (pruning only touches this run's checkpoints).
    lineage: str
    tracking: Tracking
    train_tasks: list[Task]
    val_tasks: list[Task]


@dataclass(frozen=True)
class ServingParts:
    """The gateway, its dashboard and server, and the agent runner (:func:`_serve`)."""

    gateway: Gateway
    #: The gateway's effective config: the admin key made when none was given, the
    #: server's URL, async mode's hold timeout (``cfg.gateway`` is left as given).
    config: GatewayConfig
    ui: Catalog  # the dashboard at /ui
    server: LoopServer
    runner: Runner


@dataclass(frozen=True)
class RunParts:
    """Everything an open training run uses (see the module docstring for the order)."""

    ranks: RankGroup | None  # the other training processes; None alone
    grader: AnyGrader | None
    model: ModelParts
    records: RecordParts
    serving: ServingParts


class _Part(Generic[T]):
    """One part of an open run as an attribute of :class:`PartsView` (typed by ``get``)."""

    def __init__(self, get: Callable[[RunParts], T]) -> None:
        self._get = get

    def __get__(self, view: PartsView, owner: object = None) -> T:
        return self._get(view.parts)


class PartsView:
    """The parts of an open run as its attributes (``run.store``, ``run.engine``, ...)."""

    _parts: RunParts | None
    _model_path: Path | None

    @property
    def parts(self) -> RunParts:
        if self._parts is None:
            raise TrainerError("the run is not open: use it as `async with TrainingRun(cfg)`")
        return self._parts

    @property
    def ranks(self) -> RankGroup | None:
        return self._parts.ranks if self._parts else None

    @property
    def model_path(self) -> Path | None:
        return self._parts.model.path if self._parts else self._model_path

    grader = _Part(lambda p: p.grader)
    tokenizer = _Part(lambda p: p.model.tokenizer)
    trainer = _Part(lambda p: p.model.trainer)
    engine = _Part(lambda p: p.model.engine)
    store = _Part(lambda p: p.records.store)
    run_record = _Part(lambda p: p.records.run_record)
    tracking = _Part(lambda p: p.records.tracking)
    train_tasks = _Part(lambda p: p.records.train_tasks)
    val_tasks = _Part(lambda p: p.records.val_tasks)
    gateway = _Part(lambda p: p.serving.gateway)
    gateway_config = _Part(lambda p: p.serving.config)
    server = _Part(lambda p: p.serving.server)
    runner = _Part(lambda p: p.serving.runner)


def _close(stack: AsyncExitStack, close: Callable[[], Awaitable[object] | object]) -> None:
    """Put ``close`` on ``stack``; its error is logged, so teardown reaches every part."""

    async def quietly() -> None:
        try:
            done = close()
            if asyncio.iscoroutine(done) or isinstance(done, asyncio.Future):
                await done
        except Exception:
            log.exception("error while shutting down")

    stack.push_async_callback(quietly)


def _on_exit(stack: AsyncExitStack, close: Callable[[bool], object]) -> None:
    """Like :func:`_close`, with whether the run failed (an exception is ending it)."""

    async def quietly(exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            done = close(exc_type is not None)
            if asyncio.iscoroutine(done):
                await done
        except Exception:
            log.exception("error while shutting down")

    stack.push_async_exit(quietly)


async def open_parts(
    cfg: TrainConfig,
    stack: AsyncExitStack,
    say: Say,
    *,
    command: str,
    model_path: Path | None,
    engine: Engine | None,
    resume: ResumePoint | None,
) -> RunParts:
    """Build the run's parts (their closes on ``stack``); ``engine`` replaces the embedded one."""
    # first: off loopback without a key, or a key file others can read, stops it at once
    admin_key = resolve_admin_key(cfg.gateway.host, Path(cfg.dir), cfg.gateway.admin_key)
    grader = await open_grader(cfg.rollout)  # a judge that cannot be reached stops it
    ranks = None
    alone = cfg.run.processes == 1 and world_from_env() == 1
    if command == "train" and (not alone or cfg.trainer.sharded):  # sharded even alone
        say(Status("starting the training processes"))
        ranks = group = RankGroup.start(cfg.run.processes, cfg.trainer, cfg.model.device)
        if group is not None:  # None: one process after all
            _on_exit(stack, lambda failed: asyncio.to_thread(group.close, not failed))
    # a resumed run pushes its checkpoint's weights itself; an eval pushes what it evaluates
    push: bool | None = None if resume is not None else command == "eval"
    model = await _model(cfg, stack, say, ranks, model_path, engine, push=push)
    records = _records(cfg, stack, say, command, resume)
    serving = await _serve(cfg, stack, say, model.engine, model.tokenizer, records.store, admin_key)
    _close(stack, model.trainer.stop)  # first at teardown: an update on its thread ends soon
    return RunParts(ranks, grader, model, records, serving)


async def _model(
    cfg: TrainConfig,
    stack: AsyncExitStack,
    say: Say,
    ranks: RankGroup | None,
    model_path: Path | None,
    engine: Engine | None,
    *,
    push: bool | None = False,
) -> ModelParts:
    """The tokenizer, the trainer and the engine (one copy of the weights when they can share)."""
    from tether.models import load_model, load_tokenizer

    say(Status(f"loading the model {model_path or cfg.model.path}"))
    path = resolve_model_path(model_path or cfg.model.path)
    tokenizer = load_tokenizer(path)
    where = "cpu" if cfg.trainer.sharded else cfg.model.device  # sharded: fully_shard moves them
    policy = load_model(path, dtype=torch.float32, device=where)
    trainer = PolicyTrainer(
        policy,
        cfg.trainer,
        device=cfg.model.device,
        train_dtype=cfg.model.train_dtype,
        pad_id=tokenizer.pad_token_id or 0,
        ranks=ranks.ranks if ranks else None,
        adapters=[n for n, r in cfg.roles.items() if r.adapter],
    )
    if ranks is not None:
        ranks.hello(trainer, path, cfg.model.train_dtype)
    if engine is None and cfg.engine.remote:
        engine = await _remote_engine(cfg, say, path, trainer, push=push)
    share = engine is None and trainer.can_share_weights()  # one copy, not two
    if engine is None:
        m = cfg.model
        served = trainer.model if share else load_model(path, dtype=torch.float32, device=m.device)
        if any(r.adapter or not r.train for r in cfg.roles.values()):  # every adapter, unmerged
            served = trainer.serving_model(served)
        engine = TransformersEngine(
            served,
            tokenizer,
            device=m.device,
            max_batch_size=m.max_batch_size,
            seed=cfg.trainer.seed,
            rollout_dtype=None if m.rollout_dtype == "float32" else m.rollout_dtype,
        )
    _close(stack, engine.close)  # the run owns the engine, a given one too
    if share and isinstance(engine, TransformersEngine):
        trainer.share_weights(engine.weights_lock)
    if cfg.model.rollout_dtype != "float32" and not cfg.trainer.tis_cap:
        log.warning(
            "model.rollout_dtype %s without trainer.tis_cap: the PPO ratio is taken against "
            "the rounded engine's logprobs; set trainer.tis_cap=2 to correct (docs/int8.md)",
            cfg.model.rollout_dtype,
        )
    return ModelParts(path, tokenizer, trainer, engine)


async def _remote_engine(
    cfg: TrainConfig, say: Say, path: Path, trainer: PolicyTrainer, *, push: bool | None
) -> Engine:
    """The vLLM or SGLang servers of ``cfg.engine``, checked; pushes go by its transport.

    They must serve the trainer's starting weights. A server at version 0 is taken to
    serve ``model.path`` as it was started (the logprob gap of step 1 says otherwise); a
    server at another version (an earlier run pushed to it), or ``push`` (``tether
    eval``: what it evaluates), gets the trainer's weights as v0 first. ``push=None``: a
    resumed run, which pushes its checkpoint's weights itself.
    """
    from tether.engine import connect_engine

    e = cfg.engine
    say(Status(f"connecting to the {e.kind} server(s) {', '.join(e.urls)} ({e.transport} weights)"))
    engine = await connect_engine(
        e,
        weights_dir=Path(cfg.dir).resolve() / cfg.name / "weights",
        model_dir=path,
        lora_config=trainer.adapter_config() if e.transport == "lora" else None,
        pause_mode="wait",
    )
    if push or (push is not None and engine.policy_version != 0):
        why = "other weights" if push else f"v{engine.policy_version}, from an earlier run"
        say(Status(f"the servers serve {why}: pushing the run's starting weights as v0"))
        try:
            await engine.weight_push.push(trainer, version=0)
        except BaseException:
            await engine.close()
            raise
    return engine


def _records(
    cfg: TrainConfig, stack: AsyncExitStack, say: Say, command: str, resume: ResumePoint | None
) -> RecordParts:
    """The store, the run's record (its final status set at teardown), tracking, the tasks."""
    run_dir = Path(cfg.dir) / cfg.name
    store = Store(run_dir / "traces.sqlite")
    _close(stack, store.close)
    say(Status(f"run folder {run_dir}  traces {run_dir / 'traces.sqlite'}"))
    config = record_config(cfg, command, resume)
    record = store.create_run(config, run_id=f"{cfg.name}-{secrets.token_hex(4)}")

    def set_status(exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            store.set_run_status(record.id, end_status(exc_type))
        except Exception:
            log.exception("error while shutting down")

    stack.push(set_status)
    tracking = Tracking([])
    if command == "train":
        sinks = cfg.tracking  # a TrackingConfig once built (TrainConfig.__post_init__)
        assert isinstance(sinks, TrackingConfig)
        tracking = open_tracking(sinks, run_dir, record.id, record.config)
        _on_exit(stack, lambda failed: tracking.close(failed=failed))
    tasks = load_task_set(cfg.tasks)
    train_tasks, val_tasks = tasks.train, tasks.val
    if tasks.note:
        log.info("%s", tasks.note)
        say(Status(tasks.note))
    exposed = exposed_fields(train_tasks + val_tasks)
    if exposed:  # once per run: the policy could read the answer from its prompt
        log.warning(
            "the agent receives the task field(s) %s: an agent that puts its task in the "
            "prompt shows the policy the answer; keep them for the grader with "
            'tasks.private_fields=[%s] or a task field "grader": {...}',
            ", ".join(exposed),
            ",".join(exposed),
        )
    try:  # the run's task set, so its rollouts' task_ids resolve to their task
        store.add_tasks(train_tasks + val_tasks, run_id=record.id)
    except AlreadyExists as e:  # two tasks share an id: the run itself is unaffected
        log.warning("tasks not stored: %s; give each task in tasks.source its own id", e)
    lineage = (resume.run if resume else None) or record.id
    return RecordParts(
        store, config, record, lineage, tracking, train_tasks=train_tasks, val_tasks=val_tasks
    )


async def _serve(
    cfg: TrainConfig,
    stack: AsyncExitStack,
    say: Say,
    engine: Engine,
    tokenizer: Any,
    store: Store,
    admin_key: AdminKey,
) -> ServingParts:
    """The gateway, its dashboard and its server, and the runner that starts the agents."""
    gcfg = cfg.gateway_for(admin_key.value)
    say(Status("starting the gateway and the agent runner"))
    gateway = Gateway(engine, tokenizer, store, gcfg, seed=cfg.trainer.seed)
    app = create_app(gateway)
    ui = mount_ui(app, Path(cfg.dir) / cfg.name, cfg.name, admin_key.value, tokenizer)
    _close(stack, ui.close)
    server = await LoopServer(app, gcfg.host, gcfg.port or 0).start()
    _close(stack, server.stop)
    if not gcfg.public_url:  # port 0: the URL is known once the server listens
        gcfg = gateway.config = dataclasses.replace(gcfg, public_url=server.url)
    say(Status(ui_line(server.url, admin_key.how)))
    runner = make_runner(cfg.agent)
    _close(stack, runner.close)
    # rollouts wait as "queued" until the runner starts their agent
    runner.on_start = lambda launch: gateway.mark_running(launch.rollout_id, launch.attempt)
    return ServingParts(gateway, gcfg, ui, server, runner)
