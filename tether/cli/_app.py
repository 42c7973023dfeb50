"""The typer app every command module registers on, what they share, and :func:`main`.

Every :class:`~tether.errors.TetherError` becomes one readable line on stderr
and exit status 2; logging is configured here (:func:`setup_logging`) and nowhere
else. SIGINT and SIGTERM are handled here too (:mod:`tether.cli._interrupt`): a
run stops cleanly, says where, and exits 130 or 143.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from tether import _exit
from tether.cli._interrupt import Interrupted, Interrupts
from tether.errors import TetherError

app = typer.Typer(
    name="tether",
    help="Train the model behind an unchanged LLM agent with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: wraps at any width, never cuts with "…"
)
rollouts_app = typer.Typer(
    help="What the trace store holds.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(rollouts_app, name="rollouts")

console = Console(stderr=True)
DEFAULT_STORE = Path(".tether/traces.sqlite")

StoreOpt = Annotated[
    Path | None, typer.Option("--store", help="SQLite trace store file (overrides a run name).")
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"tether {version('tether')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("tether (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Train the model behind an unchanged LLM agent with reinforcement learning."""


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time, so warnings logged while the live
    progress display runs (rich redirects stderr then) print above it, not under it."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_StderrHandler()],
    )
    # transformers imports torchao (when installed) to load any model; on a CPU-only torch
    # torchao logs that its CUDA fp8 kernels did not load, and torch logs pytree deprecation
    # notices for its enums: noise that int8 rollouts (tether.engine._rollout_copy) never use
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # httpx logs every request at INFO: with a vLLM/SGLang engine, one line per model call
    logging.getLogger("httpx").setLevel(logging.WARNING)


def interrupts_of(ctx: typer.Context) -> Interrupts:
    """The signal handling :func:`main` installed (a bare one when called another way)."""
    return ctx.obj if isinstance(ctx.obj, Interrupts) else Interrupts()


RunArg = Annotated[
    str | None,
    typer.Argument(help="A run name (runs/NAME/traces.sqlite) or run folder."),
]


def main() -> None:
    from tether.cli._progress import quiet_imports

    quiet_imports()  # before any command imports transformers (and so torchao)
    _exit.run(_main)  # leaves without the interpreter's slow teardown (tether/_exit.py)


def _main() -> None:
    with Interrupts() as interrupts:
        try:
            app(obj=interrupts)
        except TetherError as exc:
            console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            sys.exit(2)
        except Interrupted as exc:  # the run has stopped its agents and closed its store
            interrupts.report()
            sys.exit(exc.exit_code)
