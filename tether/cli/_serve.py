"""``tether serve``: its flags (the config and the run: ``_serve_run.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.chat import parser_names
from tether.cli._app import DEFAULT_STORE, LogLevelOpt, app, console, setup_logging

#: The tool-call parsers' registry names (tether.chat.register_parser adds more).
ToolParserOpt = Annotated[
    str | None,
    typer.Option(metavar=f"<{'|'.join(parser_names())}>", help="Tool-call format of the model."),
]


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
        str | None,
        typer.Option(
            help="Model folder, checkpoint or run folder (its newest checkpoint), or hub id; "
            "the starter model if omitted."
        ),
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
    engine: Annotated[
        str | None,
        typer.Option(
            help="transformers (embedded, default), vllm or sglang: a server you started "
            "(--engine-url; docs/engines.md)."
        ),
    ] = None,
    engine_url: Annotated[
        list[str] | None,
        typer.Option(
            metavar="URL",
            help="A vLLM/SGLang server's base URL (http://host:8000); repeat for replicas.",
        ),
    ] = None,
    tool_parser: ToolParserOpt = None,
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
    log_level: LogLevelOpt = "info",
) -> None:
    """Serve a model behind the gateway and record every call."""
    setup_logging(log_level)
    from tether.cli._serve_run import run_serve, serve_config

    flags = {
        "model": model,
        "host": host,
        "port": port,
        "store": None if store is None else str(store),
        "device": device,
        "max_batch_size": max_batch_size,
        "engine": engine,
        "engine_url": engine_url or None,
        "tool_parser": tool_parser,
        "allow_agent_rewards": allow_agent_rewards,
        "record_keys": record_key or None,
    }
    cfg = serve_config(config, list(overrides or []), flags)
    run_serve(cfg, console)
