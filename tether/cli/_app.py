"""The typer app every command module registers on, what they share, and :func:`main`.

Every :class:`~tether.errors.TetherError` becomes one readable line on stderr
and an exit status chosen by its class (:func:`exit_status`: 2 for a
:class:`~tether.errors.UserError`, 1 for any other); logging is configured here
(:func:`setup_logging`) and nowhere else. SIGINT and SIGTERM are handled here too (:mod:`tether.cli._interrupt`): a
run stops cleanly, says where, and exits 130 or 143.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape

from tether import _exit, _memory
from tether.cli._interrupt import Interrupted, Interrupts
from tether.errors import TetherError, UserError

#: The exit statuses, as `tether --help` shows them.
EXIT_STATUSES = (
    "Exit status: 0 done; 1 a runtime failure (every rollout failed, the engine went "
    "away, the run stopped itself); 2 a usage or config error (a bad flag or value, an "
    "unknown config key, a file the config names is missing); 130 / 143 interrupted "
    "(Ctrl-C / SIGTERM)."
)
#: -h works wherever --help does (subcommands inherit it from the app's context).
CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="tether",
    help="Train the model behind an unchanged LLM agent with reinforcement learning.",
    epilog=EXIT_STATUSES,
    context_settings=CONTEXT,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: wraps at any width, never cuts with "…"
)
rollouts_app = typer.Typer(
    help="What the trace store holds.",
    context_settings=CONTEXT,
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(rollouts_app, name="rollouts")

console = Console(stderr=True)
DEFAULT_STORE = Path(".tether/traces.sqlite")

StoreOpt = Annotated[
    Path | None, typer.Option("--store", help="SQLite trace store file (overrides a run name).")
]


def _version(value: bool) -> None:
    if value:
        from tether import __version__

        print(f"tether {__version__}")
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


#: A Literal option: --help lists its values, and another value is a usage error (exit 2).
LogLevelOpt = Annotated[
    Literal["debug", "info", "warning", "error"],
    typer.Option(help="How much tether logs to stderr."),
]


RunArg = Annotated[
    str | None,
    typer.Argument(help="A run name (runs/NAME/traces.sqlite) or run folder."),
]


def main() -> None:
    from tether.cli._progress import quiet_imports

    _memory.limit_arenas()  # before any thread starts (tether/_memory.py)
    quiet_imports()  # before any command imports transformers (and so torchao)
    _exit.run(_main)  # leaves without the interpreter's slow teardown (tether/_exit.py)


def exit_status(exc: TetherError) -> int:
    """The one rule: 2 for a mistake in what the user gave (a :class:`UserError`: usage,
    config, a missing file), as click exits for a bad flag; 1 for every other failure."""
    return 2 if isinstance(exc, UserError) else 1


def _main() -> None:
    with Interrupts() as interrupts:
        try:
            app(obj=interrupts)
        except TetherError as exc:
            console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            sys.exit(exit_status(exc))
        except Interrupted as exc:  # the run has stopped its agents and closed its store
            interrupts.report()
            sys.exit(exc.exit_code)
