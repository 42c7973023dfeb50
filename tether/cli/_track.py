"""``tether export``, ``tether report`` and ``tether tensorboard``: their arguments
(what they run: ``_track_run.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console

from tether.cli._app import StoreOpt, app


@app.command("export")
def export(
    run: Annotated[str, typer.Argument(help="A run name (runs/NAME) or run folder.")],
    store: StoreOpt = None,
    format: Annotated[
        Literal["jsonl", "parquet"], typer.Option("--format", help="File format.")
    ] = "jsonl",
    out: Annotated[
        Path | None,
        typer.Option(
            help="Output file (RUN_FOLDER/export/rollouts.FORMAT or samples-stepN.FORMAT)."
        ),
    ] = None,
    samples: Annotated[
        bool,
        typer.Option(
            "--samples", help="The training samples of one update instead of the rollouts."
        ),
    ] = False,
    step: Annotated[
        int | None,
        typer.Option(
            help="With --samples: the update (1 is the first, as in `step 1/N`; default the last)."
        ),
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Only this run record of the store.")] = None,
) -> None:
    """Export a run's rollouts, or one update's training samples.

    Rollouts: one row per attempt, with its calls (messages, token ids, logprobs,
    policy version), reward, success, advantage, task, group and step. Samples:
    input ids, loss mask, old logprobs and advantage. Schema: docs/export.md.
    """
    from tether.cli._track_run import run_export

    run_export(
        run,
        store,
        format,
        out,
        samples=samples,
        step=step,
        run_id=run_id,
        console=Console(soft_wrap=True),
    )


@app.command("report")
def report(
    run: Annotated[str, typer.Argument(help="A run name (runs/NAME) or run folder.")],
    store: StoreOpt = None,
    out: Annotated[
        Path | None, typer.Option(help="The HTML file to write (RUN_FOLDER/report.html).")
    ] = None,
) -> None:
    """Write a run's HTML report: curves and held-out table.

    One self-contained file (PNGs inside), RUN_FOLDER/report.html by default.
    """
    from tether.cli._track_run import run_report

    run_report(run, store, out, Console(soft_wrap=True))


@app.command(
    "tensorboard",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,  # -h / --help are TensorBoard's (its own options)
)
def tensorboard(ctx: typer.Context) -> None:
    """TensorBoard on the runs' metrics (tensorboard --logdir runs).

    Every option is TensorBoard's and passes through (--logdir DIR, --port 6007,
    --help). Works where the tensorboard command cannot start (setuptools >= 82 has no
    pkg_resources).
    """
    from tether.tracking import run_tensorboard

    raise typer.Exit(run_tensorboard(ctx.args))
