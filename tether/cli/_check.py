"""``tether check CONFIG [overrides]``: the run's checks, before any model loads
(``_check_run.py``; ``tether train`` runs them first too)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli._app import app


@app.command()
def check(
    config: Annotated[Path, typer.Argument(help="YAML config (e.g. examples/calc/config.yaml).")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides, e.g. trainer.lr=3e-5")
    ] = None,
) -> None:
    """Check a config before any model loads; print the plan.

    Loads the config, imports the agent and the grader, reads the tasks, finds the
    model's tokenizer and renders one task with its chat template; prints the plan and
    "ok", or each problem on its own line (exit status 2).
    """
    from tether.cli._check_run import check_run, problems_error
    from tether.configio import load_config
    from tether.run import TrainConfig

    report = check_run(load_config(TrainConfig, config, list(overrides or [])))
    print("\n".join(report.lines))
    if report.problems:
        raise problems_error(report.problems)
    print("ok")
