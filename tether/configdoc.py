"""A config reference from the config dataclasses themselves: ``tether config`` and docs/config.md.

Each field's help is the ``#:`` comment above it in its dataclass (read from the
source with :mod:`ast`, as Sphinx reads them). :func:`entries` walks a config —
the effective one (a file and overrides applied) beside the defaults — and is the
one walk both renderings use: :func:`to_yaml` (every field, its value, its default
when the value differs, its help as a comment; what ``tether config`` prints) and
:func:`to_markdown` (a table per section; ``docs/config.md``).

Generic like :mod:`tether.configio`: it knows dataclasses, type hints and source
comments, nothing of tether's components. A field declared with ``repr=False``
(an admin key, record keys) is a secret: its value is shown as ``***`` when set.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["Entry", "entries", "field_help", "to_markdown", "to_yaml"]

_UNSET = object()


@dataclass(frozen=True)
class Entry:
    """One field of a config: a value, or a section (a nested dataclass) that holds fields."""

    key: str  # dotted, e.g. "trainer.lora.r"
    depth: int  # 0 for a top-level field
    help: str  # the ``#:`` comment, joined into one paragraph ("" when there is none)
    type: str  # the annotation, readable ("int", "float | None", "'sync' | 'async'")
    value: Any = None  # effective value (a field) — None for a section
    default: Any = None  # the default (a field)
    section: bool = False
    unset: bool = (
        False  # a section that is None (e.g. trainer.lora: null): its fields show defaults
    )
    secret: bool = False  # repr=False: never shown

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """``{field: help}`` from the ``#:`` comment lines right above each field of ``cls``."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    found: dict[str, str] = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        comment: list[str] = []
        i = item.lineno - 2  # the line above, 0-based
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        found[item.target.id] = " ".join(comment)
    return found


def _type_text(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if tp is type(None):
        return "None"
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_text(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    return getattr(tp, "__name__", str(tp))


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass an annotation names (``LoraConfig | None`` → LoraConfig), if any."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def entries(cfg: Any, defaults: Any = None, prefix: str = "", depth: int = 0) -> list[Entry]:
    """Every field of dataclass instance ``cfg`` (and of its sections, depth first) beside
    its value in ``defaults`` (the same class built without arguments, by the caller: a
    nested default can differ from its class's own, as ``TrainConfig().agent`` does)."""
    cls = type(cfg)
    hints, helps = typing.get_type_hints(cls), field_help(cls)
    out: list[Entry] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        value = getattr(cfg, f.name)
        default = getattr(defaults, f.name, _UNSET) if defaults is not None else _UNSET
        common = {"key": key, "depth": depth, "help": helps.get(f.name, ""), "type": ""}
        common["type"] = _type_text(hints[f.name])
        inner = _dataclass_in(hints[f.name])
        if dataclasses.is_dataclass(value) or (value is None and inner is not None):
            unset = value is None
            shown = inner() if unset and inner is not None else value
            below = default if dataclasses.is_dataclass(default) else shown
            out.append(Entry(**common, section=True, unset=unset))
            out += entries(shown, below, f"{key}.", depth + 1)
            continue
        out.append(
            Entry(
                **common,
                value=value,
                default=value if default is _UNSET else default,
                secret=not f.repr,
            )
        )
    return out


def _scalar(value: Any, secret: bool = False) -> str:
    """A value as it is written in YAML (flow style, one line)."""
    if secret and value not in (None, (), [], ""):
        return "'***'"
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


def _comment(text: str, indent: str, width: int = 88) -> list[str]:
    if not text:
        return []
    return textwrap.wrap(text, width - len(indent) - 2, initial_indent=f"{indent}# ",
                         subsequent_indent=f"{indent}# ")  # fmt: skip


def to_yaml(items: list[Entry], title: str = "") -> str:
    """The config as YAML that loads back: each field under its help comment, ``# default:``
    beside a value that differs; a section that is unset is ``null``, its fields commented."""
    lines = [f"# {title}", ""] if title else []
    muted_below: int | None = None  # inside an unset section: the depth it started at
    for e in items:
        if muted_below is not None and e.depth <= muted_below:
            muted_below = None
        indent = "  " * e.depth
        mute = "# " if muted_below is not None else ""
        if e.depth == 0 and lines and lines[-1] != "":
            lines.append("")
        lines += [f"{indent}{mute}{c.lstrip()}" if mute else c for c in _comment(e.help, indent)]
        if e.section:
            unset = " null  # {} turns it on, with the fields below" if e.unset else ""
            lines.append(f"{indent}{mute}{e.name}:{unset}")
            if e.unset and muted_below is None:
                muted_below = e.depth
            continue
        line = f"{indent}{mute}{e.name}: {_scalar(e.value, e.secret)}"
        if e.value != e.default:
            line += f"  # default: {_scalar(e.default, e.secret)}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(items: list[Entry], heading: str = "###") -> str:
    """The top-level fields as one table, then each section under its heading (its help,
    then a table of its own fields): key, type, default, help."""
    head = "| key | type | default | what it does |\n|---|---|---|---|"
    rows: dict[str, list[str]] = {"": []}
    intro: dict[str, str] = {}
    for e in items:
        if e.section:
            rows.setdefault(e.key, [])
            note = " Unset (`null`) by default; `{}` turns it on with these defaults."
            intro[e.key] = f"{e.help}{note if e.unset else ''}".strip()
            continue
        default = "`***`" if e.secret and e.default else f"`{_cell(_scalar(e.default))}`"
        row = f"| `{e.key}` | {_cell(e.type)} | {default} | {_cell(e.help)} |"
        rows.setdefault(e.key.rpartition(".")[0], []).append(row)
    blocks = [f"{head}\n" + "\n".join(rows.pop(""))]
    for key, mine in rows.items():
        block = f"{heading} `{key}`\n\n" + (f"{intro[key]}\n\n" if intro.get(key) else "")
        blocks.append(block + (f"{head}\n" + "\n".join(mine) if mine else "").rstrip())
    return "\n\n".join(b.rstrip() for b in blocks) + "\n"
