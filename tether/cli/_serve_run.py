"""``tether serve``: its config (a YAML file and dotted overrides, like ``tether train``;
the flags are shortcuts for a few keys) and the gateway + engine it runs.

::

    tether serve                                  # the starter model on 127.0.0.1:8321
    tether serve serve.yaml gateway.log_prompts=true gateway.max_tokens=2048
    tether serve model=Qwen/Qwen2.5-0.5B-Instruct --port 9000
    tether serve --model Qwen/Qwen2.5-0.5B-Instruct --engine vllm --engine-url http://gpu:8000

A flag given on the command line wins over the file and the overrides.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from tether.configio import load_config
from tether.engine import EngineConfig
from tether.errors import UserError
from tether.gateway import DEFAULT_PORT, GatewayConfig, resolve_admin_key
from tether.records import RunStatus

__all__ = ["ServeConfig", "run_serve", "serve_config"]

#: The flags of ``tether serve`` that set a key of ``gateway:``, and of ``engine:``; the
#: others set a top-level key.
GATEWAY_FLAGS = ("host", "port", "tool_parser", "allow_agent_rewards", "record_keys")
ENGINE_FLAGS = {"engine": "kind", "engine_url": "urls"}


@dataclass
class ServeConfig:
    #: A model folder, a checkpoint or run folder (its newest checkpoint's model/), or a hub
    #: id; unset = tether's starter model.
    model: str | None = None
    #: cpu, cuda, cuda:1, ...
    device: str = "cpu"
    #: Most sequences the embedded engine decodes at once.
    max_batch_size: int = 64
    #: The embedded engine (kind: transformers, the default) or vLLM / SGLang servers you
    #: started (kind, urls; docs/engines.md). model then names the model they serve, whose
    #: tokenizer the gateway uses.
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: The SQLite trace store file; relative to the current directory.
    store: str = ".tether/traces.sqlite"
    #: host, port, record_keys, log_prompts, the caps, ... (tether/gateway/_config.py).
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise UserError(f"max_batch_size ({self.max_batch_size}) must be >= 1")


def serve_config(config: str | None, overrides: list[str], flags: dict[str, Any]) -> ServeConfig:
    """The file (optional; an ``a.b=c`` in its place is an override), the overrides, then
    the flags that were given (None = not given)."""
    if config is not None and "=" in config and not Path(config).is_file():
        config, overrides = None, [config, *overrides]
    cfg = load_config(ServeConfig, config, overrides)
    given = {k: v for k, v in flags.items() if v is not None}
    gateway = {k: given.pop(k) for k in GATEWAY_FLAGS if k in given}
    if "record_keys" in gateway:
        gateway["record_keys"] = tuple(gateway["record_keys"])
    if gateway:
        given["gateway"] = dataclasses.replace(cfg.gateway, **gateway)
    engine = {field: given.pop(flag) for flag, field in ENGINE_FLAGS.items() if flag in given}
    if engine:
        given["engine"] = dataclasses.replace(cfg.engine, **engine)
    return dataclasses.replace(cfg, **given) if given else cfg


def run_serve(cfg: ServeConfig, console: Console) -> None:
    """Serve ``cfg.model`` behind the gateway until stopped; every call goes to the store.

    The port is bound and served at once; while the model loads (minutes on a cold
    start: the starter is built first) the server answers with a :class:`LoadingApp`
    (``/healthz`` 503 ``{"status": "loading"}``), then with the gateway.
    """
    if cfg.model:  # a misspelled or unreachable model fails here, before torch loads
        from tether.models import model_source

        model_source(cfg.model)
    from tether.gateway import LoadingApp, bind_socket, make_server
    from tether.run import end_status

    host = cfg.gateway.host
    port = DEFAULT_PORT if cfg.gateway.port is None else cfg.gateway.port
    # the one rule (docs/serve.md); off loopback without a key: refused, before the model loads
    key = resolve_admin_key(host, Path(cfg.store).parent, cfg.gateway.admin_key)
    gcfg = dataclasses.replace(
        cfg.gateway,
        port=port,
        admin_key=key.value,
        record_keys=_record_keys(cfg.gateway.record_keys),
    )
    sock = bind_socket(host, port)  # before the model loads: a port in use is one line now
    port = gcfg.port = sock.getsockname()[1]  # --port 0: the port the OS chose
    loading = LoadingApp()
    server = make_server(loading, host, port, log_level="warning")
    console.print(
        f"tether gateway on [bold]http://{host}:{port}[/]: loading the model "
        "(GET /healthz answers 503 until it is ready)"
    )
    opened = _Opened(cfg, gcfg, key.path, console)
    threading.Thread(
        target=opened.load, args=(loading, server), name="tether-serve-load", daemon=True
    ).start()
    status = RunStatus.FINISHED
    try:
        server.run(sockets=[sock])
    except BaseException as exc:
        status = end_status(type(exc))
        raise
    finally:
        opened.close(status)
    if opened.error is not None:  # the model did not load: its one line, not a traceback
        raise opened.error


class _Opened:
    """What ``tether serve`` opens once its model has loaded (on a thread, while the
    server answers "loading"): the engine, the store and its run record, the app."""

    def __init__(
        self, cfg: ServeConfig, gcfg: GatewayConfig, key_path: Path | None, console: Console
    ) -> None:
        self.cfg, self.gcfg, self.key_path, self.console = cfg, gcfg, key_path, console
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._db: Any = None
        self._run: Any = None
        self._catalog: Any = None

    def load(self, loading: Any, server: Any) -> None:
        """Load, open, then hand the app to ``loading``; on failure stop ``server``."""
        try:
            cfg = self.cfg
            model_path, engine, tokenizer = _load_engine(cfg, self.console)
            with self._lock:
                if self._closed:  # stopped while loading
                    return
                loading.ready(self._open(model_path, engine, tokenizer))
        except BaseException as exc:
            self.error = exc
            server.should_exit = True

    def _open(self, model_path: str, engine: Any, tokenizer: Any) -> Any:
        from tether.dashboard import PREFIX, Catalog, mount_dashboard
        from tether.gateway import Gateway, create_app
        from tether.store import Store

        gcfg, console = self.gcfg, self.console
        host, port, store = gcfg.host, gcfg.port, Path(self.cfg.store)
        store.parent.mkdir(parents=True, exist_ok=True)
        self._db = db = Store(store)
        gw = Gateway(engine, tokenizer, db, gcfg)
        self._run = db.create_run(
            {"command": "serve", "model": model_path, "tool_parser": gcfg.tool_parser}
        )
        gw.default_run_id = self._run.id
        console.print(f"tether gateway on [bold]http://{host}:{port}[/]  store {store}")
        if self.key_path:
            console.print(
                f"admin key in {self.key_path} (mode 600, kept across restarts): "
                f"export TETHER_ADMIN_KEY=$(cat {self.key_path})",
                soft_wrap=True,  # one line: the export command is copied as a whole
            )
        console.print(
            f"create a rollout: POST http://{host}:{port}/admin/rollouts  (Bearer: admin key)"
        )
        app = create_app(gw)
        self._catalog = Catalog.of_file(store, key="serve")
        admin_key = gcfg.admin_key
        assert admin_key, "serve made or read the admin key first (resolve_admin_key)"
        mount_dashboard(app, self._catalog, admin_key, tokenizers=lambda _k, _r: tokenizer)
        console.print(
            f"dashboard: http://{host}:{port}{PREFIX}/  (log in with the admin key)",
            soft_wrap=True,
        )
        if gcfg.record_keys:
            console.print(
                f"record mode: POST http://{host}:{port}/v1/chat/completions  "
                f"(Bearer: one of {len(gcfg.record_keys)} record key(s))"
            )
        return app

    def close(self, status: Any) -> None:
        """The run record ends with ``status``; the store and the catalog close."""
        with self._lock:
            self._closed = True
            if self._db is not None:
                self._db.set_run_status(self._run.id, status)
                self._db.close()
            if self._catalog is not None:
                self._catalog.close()


def _record_keys(given: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """--record-key values or ``gateway.record_keys``; TETHER_RECORD_KEYS may hold several,
    comma-separated."""
    keys = [k.strip() for v in given for k in v.split(",") if k.strip()]
    short = [k for k in keys if len(k) < 16]
    if short:
        raise UserError(
            f"a record key must be at least 16 characters ({len(short[0])} given): "
            "use e.g. --record-key $(openssl rand -hex 16)"
        )
    return tuple(keys)


def _load_engine(cfg: ServeConfig, console: Console) -> tuple[str, Any, Any]:
    from tether.cli._progress import quiet_loading
    from tether.cli._starter import starter_model
    from tether.models import load_tokenizer, model_source

    quiet_loading()

    # a checkpoint or run folder: the model folder in it (recorded as the run's model)
    path = model_source(cfg.model) if cfg.model else str(starter_model(console))
    tokenizer = load_tokenizer(path)
    if cfg.engine.remote:
        return path, _remote_engine(cfg.engine, console), tokenizer
    from tether.engine import TransformersEngine

    engine = TransformersEngine.from_pretrained(
        path, tokenizer=tokenizer, device=cfg.device, max_batch_size=cfg.max_batch_size
    )
    return path, engine, tokenizer


def _remote_engine(cfg: EngineConfig, console: Console) -> Any:
    """The servers of ``cfg``, checked here (one line naming a server that fails), then
    handed over to the gateway's event loop."""
    import asyncio

    from tether.engine import connect_engine

    async def connect() -> Any:
        engine = await connect_engine(cfg)
        await engine.handover()
        return engine

    engine = asyncio.run(connect())
    console.print(
        f"engine: {cfg.kind} server(s) {', '.join(cfg.urls)} serving {engine.model} "
        f"(weights v{engine.policy_version})"
    )
    return engine
