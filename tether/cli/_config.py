"""``tether config``: the full effective config as commented YAML, or the reference as Markdown.

::

    tether config                                   # every field of tether train's config
    tether config examples/calc/config.yaml trainer.lr=3e-5   # the effective values
    tether config --serve                           # tether serve's config
    tether config --markdown > docs/config.md       # the reference (a test keeps it in sync)

The help of each field is the ``#:`` comment above it in its dataclass
(:mod:`tether.configdoc`); both outputs come from the same walk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tether.cli._app import app
from tether.errors import UserError

__all__ = ["config_markdown", "config_yaml"]

INTRO = """\
# Config reference

Every field of the two config files, its type, its default and what it does:
`tether train CONFIG` / `tether eval CONFIG` read a training run's config, `tether serve
[CONFIG]` a server's. Any field can also be given on the command line as a dotted
override (`trainer.lr=3e-5`, `agent.concurrency=16`); `tether config [CONFIG]
[key=value ...]` prints the effective config (defaults, the file, the overrides) as
commented YAML that loads back.

Generated from the config dataclasses and the `#:` comment above each field
(`tether/run/config.py`, `tether/run/_run_config.py`, `tether/trainer/config.py`,
`tether/runner/_config.py`, `tether/runner/_remote_config.py`,
`tether/gateway/_config.py`, `tether/tracking/config.py`, `tether/cli/_serve_run.py`) by
`tether config --markdown > docs/config.md`; `tests/test_cli_config.py` fails when it
is out of date.

Renamed keys still load under their old names, each with a one-line notice naming the
new one: `trainer.mode`, `trainer.max_groups_in_flight`, `trainer.max_policy_lag`,
`trainer.lag_policy`, `trainer.hold_timeout_s`, `trainer.processes` and
`trainer.collapse_patience` are now `run.*`, and `agent.agent` is `agent.entry`.
"""


def _roots(serve: bool) -> tuple[type, str]:
    if serve:
        from tether.cli._serve_run import ServeConfig

        return ServeConfig, "tether serve"
    from tether.run import TrainConfig

    return TrainConfig, "tether train"


def config_yaml(config: str | None, overrides: list[str], *, serve: bool = False) -> str:
    """The effective config (defaults, then the file, then the overrides) as commented YAML."""
    from tether.configdoc import entries, to_yaml
    from tether.configio import load_config

    if config is not None and "=" in config and not Path(config).is_file():
        config, overrides = None, [config, *overrides]
    cls, command = _roots(serve)
    cfg: Any = load_config(cls, config, overrides)
    # the overrides are counted, not echoed: one may hold a key
    given = ["the defaults", *([config] if config else [])]
    given += [f"{len(overrides)} override(s)"] if overrides else []
    title = f"{command}'s config: {' + '.join(given)} (a value that is not the default says its default)"
    return to_yaml(entries(cfg, cls()), title)


def config_markdown() -> str:
    """docs/config.md: the reference of both configs."""
    from tether.configdoc import entries, to_markdown

    parts = [INTRO]
    for serve, heading in ((False, "tether train and tether eval"), (True, "tether serve")):
        cls, _ = _roots(serve)
        parts.append(f"## {heading}\n\n{to_markdown(entries(cls(), cls()))}")
    return "\n".join(parts)


@app.command("config")
def config_(
    config: Annotated[
        str | None, typer.Argument(help="YAML config (optional) whose effective values to show.")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides, e.g. trainer.lr=3e-5")
    ] = None,
    serve: Annotated[
        bool, typer.Option(help="tether serve's config instead of tether train's.")
    ] = False,
    markdown: Annotated[
        bool,
        typer.Option(help="The reference of every field as Markdown (docs/config.md)."),
    ] = False,
) -> None:
    """The full config as YAML, each field with its default.

    With CONFIG and overrides, their effective values (and the default beside each one
    that differs); --markdown: the reference of every field (docs/config.md).
    """
    if markdown:
        if config is not None or overrides or serve:
            raise UserError("--markdown prints the reference of both configs: pass nothing else")
        print(config_markdown(), end="")
        return
    print(config_yaml(config, list(overrides or []), serve=serve), end="")
