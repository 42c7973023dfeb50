"""Write the CLI reference (docs/reference/cli.md) from the typer app itself.

    .venv/bin/python dev/clidoc.py > docs/reference/cli.md

Each command's section is its real ``--help`` text, as click formats it at 88 columns
(the app uses plain click help), so the page is the same on every machine;
tests/test_docs.py fails when the page is out of date.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

WIDTH = 88

HEADER = """\
# CLI reference

Every `tether` command and its options: the text of `tether COMMAND --help`, generated
from the command-line app by `python dev/clidoc.py > docs/reference/cli.md`
(`tests/test_docs.py` fails when this page is out of date).

Exit status: 0 on success; 130 after Ctrl-C and 143 after SIGTERM (a run stops cleanly
and says how to resume). See each command's help for its other codes.
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
    return typer.Context(
        cmd, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
    )


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
