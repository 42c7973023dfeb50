"""The ``tether`` command. Nothing imports this module; it imports everything.

Every :class:`~tether.errors.TetherError` becomes one readable line on stderr
and exit status 2; logging is configured here and nowhere else. SIGINT and
SIGTERM are handled here too (:mod:`tether._interrupt`): a run stops cleanly,
says where, and exits 130 or 143.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether._interrupt import Interrupted, Interrupts
from tether.errors import TetherError, UserError

app = typer.Typer(
    name="tether",
    help="Train the model behind an unchanged LLM agent with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
rollouts_app = typer.Typer(help="What the trace store holds.", no_args_is_help=True)
app.add_typer(rollouts_app, name="rollouts")

console = Console(stderr=True)
DEFAULT_STORE = Path(".tether/traces.sqlite")

StoreOpt = Annotated[Path, typer.Option("--store", help="SQLite trace store file.")]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _admin_key(store: Path, host: str) -> tuple[str, Path | None]:
    """TETHER_ADMIN_KEY, or on loopback a new key written to a file only the user can read."""
    key = os.environ.get("TETHER_ADMIN_KEY")
    if key:
        return key, None
    from tether.gateway import is_loopback

    if not is_loopback(host):
        raise UserError(
            f"refusing to bind {host} without an admin key: set TETHER_ADMIN_KEY "
            "(e.g. export TETHER_ADMIN_KEY=$(openssl rand -hex 32)) or bind 127.0.0.1"
        )
    path = store.parent / "admin_key"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.chmod(path, 0o600)
    return key, path


@app.command()
def serve(
    model: Annotated[
        str | None, typer.Option(help="Model folder or hub id; the starter model if omitted.")
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to bind; non-loopback needs TETHER_ADMIN_KEY.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8321,
    store: StoreOpt = DEFAULT_STORE,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
    max_batch_size: Annotated[
        int, typer.Option(help="Most sequences the engine decodes at once.")
    ] = 64,
    tool_parser: Annotated[
        str, typer.Option(help="Tool-call format of the model: hermes, llama3_json.")
    ] = "hermes",
    allow_agent_rewards: Annotated[
        bool, typer.Option(help="Let agents post their own reward.")
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
) -> None:
    """Serve a model behind the gateway and record every call."""
    _setup_logging(log_level)
    from tether.gateway import Gateway, GatewayConfig, create_app, make_server
    from tether.store import Store

    key, key_path = _admin_key(store, host)
    cfg = GatewayConfig(
        host=host,
        port=port,
        admin_key=key,
        tool_parser=tool_parser,
        allow_agent_rewards=allow_agent_rewards,
    )
    cfg.check_bind()
    model_path, engine, tokenizer = _load_engine(
        model, device=device, max_batch_size=max_batch_size
    )
    store.parent.mkdir(parents=True, exist_ok=True)
    db = Store(store)
    gw = Gateway(engine, tokenizer, db, cfg)
    run = db.create_run({"command": "serve", "model": model_path, "tool_parser": tool_parser})
    gw.default_run_id = run.id
    console.print(f"tether gateway on [bold]http://{host}:{port}[/]  store {store}")
    if key_path:
        console.print(
            f"admin key written to {key_path} (mode 600); set TETHER_ADMIN_KEY to choose one"
        )
    console.print(
        f"create a rollout: POST http://{host}:{port}/admin/rollouts  (Bearer: admin key)"
    )
    server = make_server(create_app(gw), host, port, log_level="warning")
    try:
        server.run()
    finally:
        db.close()


def _load_engine(model: str | None, *, device: str, max_batch_size: int):
    from tether.engine import TransformersEngine
    from tether.starter import build_starter, load_tokenizer

    path = model or str(build_starter(warm=True))
    tokenizer = load_tokenizer(path)
    engine = TransformersEngine.from_pretrained(
        path, tokenizer=tokenizer, device=device, max_batch_size=max_batch_size
    )
    return path, engine, tokenizer


def _interrupts(ctx: typer.Context) -> Interrupts:
    """The signal handling :func:`main` installed (a bare one when called another way)."""
    return ctx.obj if isinstance(ctx.obj, Interrupts) else Interrupts()


@app.command()
def demo(
    ctx: typer.Context,
    seed: Annotated[int, typer.Option(help="Seed of the tasks, sampling and training.")] = 0,
    steps: Annotated[int, typer.Option(help="GRPO updates.")] = 150,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
) -> None:
    """The CPU demo: the starter model learns the calc task with GRPO; prints before/after success."""
    _setup_logging(log_level)
    from ._cli_train import run_demo

    run_demo(seed, steps, Console(soft_wrap=True), _interrupts(ctx))


@app.command()
def train(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="YAML config (e.g. examples/calc/config.yaml).")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides, e.g. trainer.lr=3e-5")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the run's latest checkpoint.")
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "warning",
) -> None:
    """Train from a config file, with overrides."""
    _setup_logging(log_level)
    from tether.configio import load_config
    from tether.trainer.config import TrainConfig

    from ._cli_train import run_train

    cfg = load_config(TrainConfig, config, list(overrides or []))
    if resume:
        cfg.extra["resume"] = True
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
    """Evaluate on the val split (the config's model, or a checkpoint)."""
    _setup_logging(log_level)
    from tether.configio import load_config
    from tether.trainer.config import TrainConfig

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


@rollouts_app.command("list")
def rollouts_list(
    store: StoreOpt = DEFAULT_STORE,
    run: Annotated[str | None, typer.Option(help="Only this run.")] = None,
    status: Annotated[str | None, typer.Option(help="Only this status.")] = None,
    limit: Annotated[int, typer.Option(help="Most rows to show.")] = 50,
) -> None:
    """List stored rollouts, newest last."""
    from ._cli_views import print_rollouts

    print_rollouts(_open_store(store), run=run, status=status, limit=limit)


@rollouts_app.command("show")
def rollouts_show(
    rollout_id: Annotated[str, typer.Argument(help="The rollout id.")],
    store: StoreOpt = DEFAULT_STORE,
    tokens: Annotated[
        bool, typer.Option(help="Show each completion token with its id and logprob.")
    ] = True,
) -> None:
    """Show one rollout and its calls: messages, completion tokens and logprobs."""
    from ._cli_views import print_rollout

    print_rollout(_open_store(store), rollout_id, tokens=tokens)


def _open_store(path: Path):
    from tether.store import Store

    if not path.exists():
        raise UserError(
            f"no trace store at {path}: pass --store FILE (tether serve writes {DEFAULT_STORE})"
        )
    return Store(path)


def main() -> None:
    with Interrupts() as interrupts:
        try:
            app(obj=interrupts)
        except TetherError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
            sys.exit(2)
        except Interrupted as exc:  # the run has stopped its agents and closed its store
            interrupts.report()
            sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
