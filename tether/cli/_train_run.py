"""``tether train``, ``tether eval`` and ``tether demo``: building the run and reporting it."""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from tether.cli._interrupt import Interrupts
from tether.cli._progress import Progress, plot_curve, quiet_loading
from tether.cli._starter import starter_model
from tether.engine import EngineLost
from tether.errors import UserError
from tether.gateway import resolve_admin_key
from tether.models import model_folder
from tether.run import (
    CheckpointConfig,
    EvalConfig,
    EvalResult,
    ModelConfig,
    RolloutConfig,
    TasksConfig,
    TrainConfig,
    TrainerConfig,
    TrainingRun,
    check_new_run,
    rank_from_env,
    serve_rank,
)
from tether.runner import RunnerConfig, kill_live_groups
from tether.trainer.checkpoint import checkpoint_state, load_checkpoint

__all__ = [
    "demo_config",
    "interrupted_line",
    "lost_line",
    "memory_line",
    "replace_demo_run",
    "run_demo",
    "run_eval",
    "run_train",
    "summary_line",
    "write_run_report",
]


DEMO_STEPS = 80


def demo_config(
    seed: int = 0, steps: int = DEMO_STEPS, device: str = "cpu", eval_tasks: int = 100
) -> TrainConfig:
    """The embedded default: the warmed-up starter model learning the calc task on CPU.

    The warmed-up agent answers multiplication and division problems without its
    calculator (its warm-up teacher mostly did), so greedy decoding fails on them;
    RL teaches it to call the tool. No KL term: at lr 1e-4 it was not needed to
    keep greedy success, and it costs a reference forward (docs/demo.md).
    Held-out evals at the start, every quarter of the run and the end draw both curves.
    ``device`` (cuda: the GPU check, dev/gpu_check.sh) holds the engine and the trainer;
    ``eval_tasks`` fewer held-out tasks make a quick check's evals quick.
    """
    return TrainConfig(
        name=f"demo-seed{seed}",
        model=ModelConfig(device=device),
        tasks=TasksConfig(source="calc", train_size=4000, val_size=100, seed=seed),
        agent=RunnerConfig(
            mode="inprocess", entry="tether.starter.calc:agent", concurrency=64, timeout_s=120
        ),
        rollout=RolloutConfig(n=8, batch_groups=8),
        trainer=TrainerConfig(
            steps=steps, lr=1e-4, clip_low=0.2, clip_high=0.28, kl_coef=0.0, seed=seed
        ),
        eval=EvalConfig(every=max(steps // 4, 1), tasks=eval_tasks, samples=4, greedy=True),
        checkpoint=CheckpointConfig(every=0, keep=1),
    )


def summary_line(
    evals: list[EvalResult], steps: int, minutes: float, updates: int | None = None
) -> str:
    """The run's last line. ``updates`` (policy updates made; None = not counted): with 0,
    a difference between the evals is sampling noise, so no gain is claimed."""
    if not evals:
        return (
            f"no held-out eval (eval.enabled is false, or no val tasks), {steps} steps, "
            f"{minutes:.1f} min"
        )
    before, after = evals[0], evals[-1]
    points = (after.sampled - before.sampled) * 100
    change = "no update happened" if updates == 0 else f"{points:+.0f} points"
    line = (
        f"held-out success: before {before.sampled:.0%} -> after {after.sampled:.0%} "
        f"({change}), {steps} steps, {minutes:.1f} min"
    )
    if before.greedy is not None and after.greedy is not None:
        line += f"  [greedy: {before.greedy:.0%} -> {after.greedy:.0%}]"
    return line


def interrupted_line(run: TrainingRun, command: str | None) -> str:
    """``interrupted at step N; last checkpoint: PATH; resume with: COMMAND --resume``, or
    without a checkpoint (nothing to resume: the name stays free, see ``holds_run``)
    ``...; last checkpoint: none; start it again with: COMMAND``. N is the step that was
    running (update N, or the eval after it; 0: the eval before training). ``command``:
    the ``tether train`` command line without ``--resume`` (None: not said)."""
    ckpt = run.last_checkpoint
    line = f"interrupted at step {run.step}; last checkpoint: {ckpt or 'none'}"
    if command is None:
        return line
    if ckpt is None:
        return f"{line}; start it again with: {command}"
    return f"{line}; resume with: {command} --resume"


def lost_line(run: TrainingRun, exc: EngineLost, command: str | None) -> str:
    """The run's engine went away (``tether/run/_watch.py``): its line, then how to go on,
    as :func:`interrupted_line` says it."""
    ckpt = run.last_checkpoint
    if command is None:
        return f"{exc}; last checkpoint: {ckpt or 'none'}"
    if ckpt is None:
        return f"{exc}; no checkpoint yet: start the run again with: {command}"
    return f"{exc}; resume from {ckpt.name} with: {command} --resume"


def _on_interrupt(interrupts: Interrupts, describe: Callable[[], str]) -> None:
    """What an interrupt prints, and the agents a forced exit kills (process groups)."""
    interrupts.describe = describe
    interrupts.on_force_exit.append(kill_live_groups)


def _train(
    cfg: TrainConfig,
    console: Console,
    interrupts: Interrupts,
    command: str | None,
    model_path: Path | None = None,
) -> tuple[list[EvalResult], TrainingRun]:
    """Run ``cfg`` to its end, or until a signal (then :class:`Interrupted` is raised)."""
    quiet_loading()
    progress = Progress(cfg.trainer.steps, console)
    run = TrainingRun(cfg, on_event=progress, model_path=model_path)
    _on_interrupt(interrupts, lambda: interrupted_line(run, command))

    async def go() -> list[EvalResult]:
        with progress:
            async with run:
                return await run.train()

    try:
        return interrupts.run(go()), run
    except EngineLost as exc:  # one line, with how to go on
        raise EngineLost(lost_line(run, exc, command)) from exc


def run_train(
    cfg: TrainConfig,
    console: Console,
    interrupts: Interrupts | None = None,
    *,
    command: str | None = None,
) -> list[EvalResult]:
    """``tether train``: a new run (refused when its folder holds one) or, with
    ``resume``, the continuation of the run of that name. ``command``: its command line
    without ``--resume``, for the message an interrupt prints."""
    t0 = time.monotonic()
    if rank_from_env() > 0:  # under torchrun / accelerate launch: this rank only trains
        raise SystemExit(serve_rank(cfg.trainer.collective_timeout_s, cfg.model.device))
    if not cfg.resume:
        check_new_run(Path(cfg.dir), cfg.name)
    resolve_admin_key(cfg.gateway.host, Path(cfg.dir), cfg.gateway.admin_key)  # refused: now
    # the starter on a cold start: built here, saying so, not inside the live display
    model_path = starter_model(console) if cfg.model.path == "starter" else None
    evals, run = _train(cfg, console, interrupts or Interrupts(), command, model_path)
    png = plot_curve(run.history, evals, run.run_dir / "reward_curve.png")
    if png:
        console.print(f"reward curve: {png}")
    report = write_run_report(run)
    if report:
        console.print(f"report: {report}", highlight=False)
    memory = memory_line(run)
    if memory:
        console.print(memory, highlight=False)
    line = summary_line(evals, cfg.trainer.steps, (time.monotonic() - t0) / 60, _updates(run))
    console.print(line, highlight=False, markup=False)  # "[greedy: …]" is text, not markup
    return evals


def run_eval(
    cfg: TrainConfig,
    checkpoint: Path | None,
    console: Console,
    interrupts: Interrupts | None = None,
) -> EvalResult:
    """``tether eval``: the config's model or a checkpoint (or a run folder: its newest),
    reported at the checkpoint's step."""
    quiet_loading()
    # a checkpoint's model/, a run's newest checkpoint's, or a model folder as it is
    model_path = model_folder(checkpoint) if checkpoint else None
    adapters = None  # own-adapter or frozen roles: the checkpoint's adapters on the base model
    special = any(r.adapter or not r.train for r in cfg.roles.values())
    if model_path and special and (model_path.parent / "trainer.pt").is_file():
        adapters, model_path = model_path.parent, None
    if model_path is None and cfg.model.path == "starter":
        model_path = starter_model(console)  # a cold start says what it builds
    if model_path is not None and (model_path.parent / "state.json").is_file():
        checkpoint = model_path.parent  # the checkpoint whose step is reported
    checkpoint = adapters or checkpoint
    step = int(checkpoint_state(checkpoint).get("step", 0)) if checkpoint else 0
    interrupts = interrupts or Interrupts()
    run = TrainingRun(  # command="eval": its store record is not a training run
        cfg, on_event=Progress(0, console, live=False), model_path=model_path, command="eval"
    )
    _on_interrupt(interrupts, lambda: "interrupted during the evaluation; no result")

    async def go() -> EvalResult | None:
        async with run:
            if adapters is not None:
                await _load_adapters(run, adapters)
            return await run.watching(run.evaluate(step))

    result = interrupts.run(go())
    if result is None:
        raise UserError(
            f"tether eval: {cfg.tasks.source} gives no val tasks to evaluate on; mark some "
            'with "split": "val" (or drop every split field to hold out tasks.holdout of them)'
        )
    return result


async def _load_adapters(run: TrainingRun, checkpoint: Path) -> None:
    """Every adapter of ``checkpoint`` (a run with own-adapter or frozen roles) into the
    run's trainer and engine: its ``model/`` holds the shared policy only."""
    load_checkpoint(checkpoint, run.trainer)
    await run.engine.weight_push.push(run.trainer)


def run_demo(
    seed: int,
    steps: int,
    console: Console,
    interrupts: Interrupts | None = None,
    device: str = "cpu",
    eval_tasks: int = 100,
    model: Path | None = None,
) -> str:
    t0 = time.monotonic()
    where = "this CPU" if device == "cpu" else device
    console.print(
        f"[bold]tether demo[/]: the starter model learns the calc task with GRPO, on {where}"
    )
    console.print("1/3 starter model: build and supervised warm-up (cached after the first run)")
    quiet_loading()
    model_path = model or starter_model(console)  # a cold start says what it builds
    console.print(f"  starter: {starter_line(model_path)}", highlight=False)
    cfg = demo_config(seed, steps, device, eval_tasks)
    replace_demo_run(Path(cfg.dir) / cfg.name, console)
    console.print(
        f"2/3 GRPO through the gateway: {cfg.rollout.batch_groups} tasks x {cfg.rollout.n} rollouts "
        f"per update, {steps} updates; agent = the calc agent (official openai SDK, in-process)"
    )
    evals, run = _train(cfg, console, interrupts or Interrupts(), None, model_path)
    png = plot_curve(run.history, evals, run.run_dir / "reward_curve.png")
    report = write_run_report(run)
    console.print(
        f"3/3 done. traces: {run.run_dir / 'traces.sqlite'}"
        + (f"  reward curve: {png}" if png else "")
        + (f"  report: {report}" if report else "")
    )
    memory = memory_line(run)
    if memory:
        console.print(memory, highlight=False)
    line = summary_line(evals, steps, (time.monotonic() - t0) / 60, _updates(run))
    console.print(line, highlight=False, markup=False)
    return line


def write_run_report(run: TrainingRun) -> Path | None:
    """The run's HTML report (``tether report``) next to its reward curve; None without
    matplotlib (the ``plot`` extra), as for the reward curve."""
    from tether.store import Store
    from tether.tracking import write_report

    try:
        with Store(run.run_dir / "traces.sqlite") as store:
            return write_report(store, run.run_dir / "report.html", run.cfg.name)
    except UserError as exc:
        logging.getLogger(__name__).info("no report: %s", exc)
        return None


def starter_line(path: Path) -> str:
    """The starter's folder and weights hash: two runs with one hash start from one model."""
    from tether.starter import read_info

    digest = read_info(path).get("weights_sha256", "unrecorded (built by an older tether)")
    return f"{path}  weights sha256 {digest[:16]}"


def _updates(run: TrainingRun) -> int:
    """Policy updates this run made (a step with nothing to learn from makes none)."""
    return sum(1 for r in run.history if "update_s" in r.metrics)


def replace_demo_run(run_dir: Path, console: Console) -> None:
    """The demo's own folder is replaced, not refused: ``make demo`` twice just works."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
        console.print(f"replacing the previous demo run in {run_dir}", highlight=False)


def memory_line(run: TrainingRun) -> str | None:
    """Resident memory after the first and the last update, and its growth per update past
    the warm-up as the run's memory check measures it (a self-check for leaks: the median
    pairwise slope, ``tether/run/_memwatch.py``; first to last when the run was too short
    to have one)."""
    rows = [r for r in run.history if "rss_mb" in r.metrics]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    rss0, rss1 = first.metrics["rss_mb"], last.metrics["rss_mb"]
    fitted = run.memory.slope()
    if not math.isnan(fitted):  # two updates or more past the warm-up
        growth = f"{fitted:+.2f} MiB per update after the first {run.memory.warmup}"
    else:
        growth = f"{(rss1 - rss0) / (len(rows) - 1):+.2f} MiB per update"
    return (
        f"memory: {rss0:.0f} MiB after update {first.step}, {rss1:.0f} MiB after update "
        f"{last.step} ({growth})"
    )
