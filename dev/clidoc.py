"""Write the CLI reference (docs/reference/cli.md) from the typer app itself.

    .venv/bin/python dev/clidoc.py > docs/reference/cli.md

Each command's section is its real ``--help`` text, as click formats it for a terminal of 80 columns or more
(the app uses plain click help), so the page is the same on every machine;
tests/test_docs.py fails when the page is out of date.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

#: What click formats for a terminal of 80 or more columns: its help is capped at 80 columns,
#: less the 2 it keeps free.
WIDTH = 78

HEADER = """\
# CLI reference

Every `tether` command and its options: the text of `tether COMMAND --help`, generated
from the command-line app by `python dev/clidoc.py > docs/reference/cli.md`
(`tests/test_docs.py` fails when this page is out of date).

`-h` works wherever `--help` does. The exit statuses are at the end of `tether --help`,
the first section below.
"""


def _sections(cmd: Any, ctx: typer.Context) -> list[tuple[typer.Context, Any]]:
    """``cmd``'s context and those of its visible subcommands, depth first, in help order."""
    found = [(ctx, cmd)]
    if isinstance(cmd, TyperGroup):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found += _sections(sub, _context(sub, name, ctx))
    return found


def _context(cmd: Any, name: str, parent: typer.Context | None) -> typer.Context:
    settings = {**(cmd.context_settings or {}), "terminal_width": WIDTH}
    return typer.Context(cmd, info_name=name, parent=parent, **settings)


def cli_markdown(app: typer.Typer) -> str:
    """The CLI reference page for ``app``."""
    parts = [HEADER]
    root = typer.main.get_command(app)
    for ctx, cmd in _sections(root, _context(root, "tether", None)):
        help_text = cmd.get_help(ctx).rstrip()
        parts.append(f"## `{ctx.command_path}`\n\n```text\n{help_text}\n```\n")
    return "\n".join(parts)


def main() -> None:
    from tether.cli import app

    print(cli_markdown(app), end="")


if __name__ == "__main__":
    main()
