"""``tether demo``, ``tether train`` and ``tether eval``: their arguments. What they run
(``_train_run.py``) imports torch, so it is imported on first use."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from tether.cli._app import LogLevelOpt, app, interrupts_of, setup_logging
from tether.errors import UserError

if TYPE_CHECKING:
    from tether.run import TrainConfig


@app.command()
def demo(
    ctx: typer.Context,
    seed: Annotated[int, typer.Option(help="Seed of the tasks, sampling and training.")] = 0,
    steps: Annotated[int, typer.Option(help="GRPO updates.")] = 80,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
    eval_tasks: Annotated[int, typer.Option(help="Held-out tasks per evaluation.")] = 100,
    model: Annotated[
        Path | None, typer.Option(help="A model folder instead of the warm starter (quick checks).")
    ] = None,
    log_level: LogLevelOpt = "warning",
) -> None:
    """The CPU demo: the starter model learns calc with GRPO.

    Prints held-out success before and after training.
    """
    setup_logging(log_level)
    from tether.cli._train_run import run_demo

    run_demo(
        seed,
        steps,
        Console(soft_wrap=True),
        interrupts_of(ctx),
        device=device,
        eval_tasks=eval_tasks,
        model=model,
    )


@app.command()
def train(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="YAML config (e.g. examples/calc/config.yaml).")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides, e.g. trainer.lr=3e-5")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue run NAME from its latest checkpoint (step, policy, curve)."),
    ] = False,
    log_level: LogLevelOpt = "warning",
) -> None:
    """Train from a config file, with overrides.

    Runs the checks of tether check first, so a missing file or an agent that does not
    import stops it before the model loads.
    """
    setup_logging(log_level)
    from tether.cli._train_run import run_train
    from tether.configio import load_config
    from tether.run import TrainConfig

    cfg = load_config(
        TrainConfig, config, [*(overrides or []), *(["resume=true"] if resume else [])]
    )
    _check_first(cfg)
    again = shlex.join(["tether", "train", str(config), *(overrides or [])])
    run_train(cfg, Console(soft_wrap=True), interrupts_of(ctx), command=again)


def _check_first(cfg: TrainConfig) -> None:
    """``tether check``'s checks, before the model loads: a missing file fails in seconds.
    Ranks 1.. of a launcher (torchrun) skip them: rank 0 ran them."""
    from tether.cli._check_run import check_run, problems_error
    from tether.run import rank_from_env

    if rank_from_env() == 0:
        problems = check_run(cfg).problems
        if problems:
            raise problems_error(problems)


@app.command("eval")
def eval_(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="YAML config of the run.")],
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="A checkpoint folder (step-N), a run folder (its newest checkpoint) or a model folder."
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides")
    ] = None,
    log_level: LogLevelOpt = "warning",
) -> None:
    """Evaluate a model or a checkpoint on the val split."""
    setup_logging(log_level)
    from tether.cli._train_run import run_eval
    from tether.configio import load_config
    from tether.run import TrainConfig

    if checkpoint is not None and not checkpoint.is_dir():
        raise UserError(
            f"--checkpoint {checkpoint} is not a folder: pass runs/NAME/checkpoints/step-N"
        )
    cfg = load_config(TrainConfig, config, list(overrides or []))
    r = run_eval(cfg, checkpoint, Console(soft_wrap=True), interrupts_of(ctx))
    greedy = "-" if r.greedy is None else f"{r.greedy:.0%}"
    print(
        f"held-out success: sampled {r.sampled:.0%}, greedy {greedy} ({r.tasks} tasks, {r.rollouts} rollouts)"
    )
