"""The ``tether`` command. Nothing imports this module; it imports everything.

Every :class:`~tether.errors.TetherError` becomes one readable line on stderr
and exit status 2; logging is configured here and nowhere else. SIGINT and
SIGTERM are handled here too (:mod:`tether._interrupt`): a run stops cleanly,
says where, and exits 130 or 143.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from tether import _exit
from tether._interrupt import Interrupted, Interrupts
from tether.errors import TetherError, UserError

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
def _main(
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


def _setup_logging(level: str) -> None:
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


@app.command()
def serve(
    config: Annotated[
        str | None, typer.Argument(help="YAML config (optional): model, store, gateway.*.")
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="dotted.key=value overrides, e.g. gateway.log_prompts=true"),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model folder or hub id; the starter model if omitted.")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to bind (127.0.0.1); others need an admin key.")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (8321; 0: a free one, printed).")
    ] = None,
    store: Annotated[
        Path | None, typer.Option(help=f"SQLite trace store file ({DEFAULT_STORE}).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N.")] = None,
    max_batch_size: Annotated[
        int | None, typer.Option(help="Most sequences the engine decodes at once (64).")
    ] = None,
    tool_parser: Annotated[
        str | None, typer.Option(help="Tool-call format of the model: hermes, llama3_json.")
    ] = None,
    allow_agent_rewards: Annotated[
        bool | None, typer.Option(help="Let agents post their own reward.")
    ] = None,
    record_key: Annotated[
        list[str] | None,
        typer.Option(
            envvar="TETHER_RECORD_KEYS",
            metavar="KEY",
            help="A key for record mode (POST /v1/chat/completions); repeat for more.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
) -> None:
    """Serve a model behind the gateway and record every call."""
    _setup_logging(log_level)
    from ._cli_serve import run_serve, serve_config

    flags = {
        "model": model,
        "host": host,
        "port": port,
        "store": None if store is None else str(store),
        "device": device,
        "max_batch_size": max_batch_size,
        "tool_parser": tool_parser,
        "allow_agent_rewards": allow_agent_rewards,
        "record_keys": record_key or None,
    }
    cfg = serve_config(config, list(overrides or []), flags)
    run_serve(cfg, console)


def _interrupts(ctx: typer.Context) -> Interrupts:
    """The signal handling :func:`main` installed (a bare one when called another way)."""
    return ctx.obj if isinstance(ctx.obj, Interrupts) else Interrupts()


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
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
) -> None:
    """The CPU demo: the starter model learns the calc task with GRPO.

    Prints held-out success before and after training.
    """
    _setup_logging(log_level)
    from ._cli_train import run_demo

    run_demo(
        seed,
        steps,
        Console(soft_wrap=True),
        _interrupts(ctx),
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
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
) -> None:
    """Train from a config file, with overrides."""
    _setup_logging(log_level)
    from tether.configio import load_config
    from tether.run import TrainConfig

    from ._cli_train import run_train

    cfg = load_config(
        TrainConfig, config, [*(overrides or []), *(["resume=true"] if resume else [])]
    )
    again = shlex.join(["tether", "train", str(config), *(overrides or []), "--resume"])
    run_train(cfg, Console(soft_wrap=True), _interrupts(ctx), resume_command=again)


@app.command("eval")
def eval_(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="YAML config of the run.")],
    checkpoint: Annotated[
        Path | None, typer.Option(help="A checkpoint folder (step-N) or model folder.")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
) -> None:
    """Evaluate on the val split (the config's model or a checkpoint)."""
    _setup_logging(log_level)
    from tether.configio import load_config
    from tether.run import TrainConfig

    from ._cli_train import run_eval

    if checkpoint is not None and not checkpoint.is_dir():
        raise UserError(
            f"--checkpoint {checkpoint} is not a folder: pass runs/NAME/checkpoints/step-N"
        )
    cfg = load_config(TrainConfig, config, list(overrides or []))
    r = run_eval(cfg, checkpoint, Console(soft_wrap=True), _interrupts(ctx))
    greedy = "-" if r.greedy is None else f"{r.greedy:.0%}"
    print(
        f"held-out success: sampled {r.sampled:.0%}, greedy {greedy} ({r.tasks} tasks, {r.rollouts} rollouts)"
    )


@app.command()
def dashboard(
    store: Annotated[
        Path | None, typer.Option(help="One SQLite trace store file (instead of --dir).")
    ] = None,
    dir: Annotated[
        Path, typer.Option("--dir", help="A folder of runs: every NAME/traces.sqlite in it.")
    ] = Path("runs"),
    host: Annotated[
        str, typer.Option(help="Address to bind; others than loopback need TETHER_ADMIN_KEY.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8322,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
) -> None:
    """Watch runs in a browser: curves, rollouts and tokens, live.

    Serves http://127.0.0.1:8322/ui/ (every run under --dir, or one --store) until
    Ctrl-C; log in with the admin key. Tokens are coloured by their logprob.
    """
    _setup_logging(log_level)
    from ._cli_dashboard import run_dashboard

    run_dashboard(store, dir, host, port, console)


RunArg = Annotated[
    str | None,
    typer.Argument(help="A run name (runs/NAME/traces.sqlite) or run folder."),
]


@rollouts_app.command("list")
def rollouts_list(
    run: RunArg = None,
    store: StoreOpt = None,
    run_id: Annotated[str | None, typer.Option(help="Only this run id.")] = None,
    status: Annotated[str | None, typer.Option(help="Only this status.")] = None,
    limit: Annotated[int, typer.Option(help="Most rows to show.")] = 50,
) -> None:
    """List stored rollouts, newest last.

    Reads tether serve's store (.tether/traces.sqlite), or a run's with RUN.
    """
    from ._cli_stores import open_store
    from ._cli_views import print_rollouts

    print_rollouts(open_store(store, run), run=run_id, status=status, limit=limit)


@rollouts_app.command("show")
def rollouts_show(
    rollout_id: Annotated[str, typer.Argument(help="The rollout id.")],
    run: RunArg = None,
    store: StoreOpt = None,
    tokens: Annotated[
        bool, typer.Option(help="Show each completion token with its id and logprob.")
    ] = True,
) -> None:
    """Show one rollout: its calls, messages, tokens and logprobs."""
    from ._cli_stores import store_for_rollout
    from ._cli_views import print_rollout

    print_rollout(store_for_rollout(rollout_id, store, run), rollout_id, tokens=tokens)


@app.command("export")
def export(
    run: Annotated[str, typer.Argument(help="A run name (runs/NAME) or run folder.")],
    store: StoreOpt = None,
    format: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
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
        int | None, typer.Option(help="With --samples: the update (0-based; default the last).")
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Only this run record of the store.")] = None,
) -> None:
    """Export a run's rollouts, or one update's training samples.

    Rollouts: one row per attempt, with its calls (messages, token ids, logprobs,
    policy version), reward, success, advantage, task, group and step. Samples:
    input ids, loss mask, old logprobs and advantage. Schema: docs/export.md.
    """
    from ._cli_track import run_export

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
    from ._cli_track import run_report

    run_report(run, store, out, Console(soft_wrap=True))


@app.command(
    "tensorboard",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    hidden=True,  # a stand-in for `tensorboard` where it cannot start (docs/tracking.md)
)
def tensorboard(ctx: typer.Context) -> None:
    """TensorBoard on the runs' event files (--logdir runs by default; any tensorboard
    option passes through, e.g. --port 6007). Works where setuptools has no pkg_resources."""
    from tether.tracking import run_tensorboard

    raise typer.Exit(run_tensorboard(ctx.args))


def main() -> None:
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


if __name__ == "__main__":
    main()
