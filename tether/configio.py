"""YAML + dotted overrides → nested config dataclasses, with errors that say the fix.

Generic: it knows dataclasses and type hints, nothing of tether's components.
Each component keeps its own dataclass and validates itself in
``__post_init__``; this module only builds them::

    cfg = load_config(TrainConfig, "examples/calc/config.yaml", ["trainer.lr=3e-5", "rollout.n=8"])

:func:`build` checks every key it is given before it gives up, and raises one
:class:`ConfigErrors` holding each problem (its dotted key and its message);
:func:`load_config` says where each one is: the file's line (from the YAML
node marks) or the override that set it. One problem is one line::

    examples/calc/config.yaml:36: unknown config key 'trainer.lrr' (did you mean 'lr'?)

A class may declare ``shorthand: ClassVar[str]``, the field that a scalar given for
the whole section most likely meant (``model: Qwen/...`` → ``model.path``): the
error says to write that field.

A class may declare ``renamed: ClassVar[dict[str, str]]``, old dotted key → new
dotted key (both under the class): a value given under the old key is moved to the
new one, with a one-line notice (a warning on this module's logger) naming the new
key; both given is one problem.

A class may define ``resolve_file_paths(data, folder) -> data`` (a classmethod
or staticmethod): it gets the mapping read from the file, before the
overrides, and the file's folder, so that paths written in a file can be
relative to the file while overrides stay relative to the current directory.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import re
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import yaml

from tether.errors import UserError

__all__ = ["ConfigErrors", "Problem", "apply_overrides", "build", "dump", "load_config"]

T = TypeVar("T")

_log = logging.getLogger(__name__)


class Problem(NamedTuple):
    """One thing wrong in a config: the dotted key it is at ("" = the whole config)."""

    key: str
    message: str


class ConfigErrors(UserError):
    """Every problem :func:`build` found, each message on its own line."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(p.message for p in self.problems))


def _suggest(key: str, options: list[str]) -> str:
    near = difflib.get_close_matches(key, options, n=1)
    return f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(sorted(options))})"


def _not_a_mapping(cls: type, value: Any, where: str) -> str:
    """``model: expected a mapping with keys path, device, ...; write model.path: X``: the
    hint names the field a class declares as its ``shorthand`` (a ``ClassVar[str]``), the
    one a scalar given for the whole section most likely meant."""
    names = [f.name for f in dataclasses.fields(cast(Any, cls)) if f.init]
    keys = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    shorthand = getattr(cls, "shorthand", None)
    hint = f"; write {where}.{shorthand}: {value}" if isinstance(shorthand, str) else ""
    return f"{where}: expected a mapping with keys {keys}, got {value!r}{hint}"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors: list[UserError] = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except UserError as exc:
                errors.append(exc)
        raise errors[0] if errors else UserError(f"{where}: invalid value {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise UserError(_not_a_mapping(tp, value, where))
        return build(tp, value, where)
    if origin is typing.Literal:
        if value not in args:
            raise UserError(f"{where} ({value!r}) must be one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str) and origin is list and args and args[0] is str:
            value = value.split()
        if not isinstance(value, list | tuple):
            raise UserError(f"{where} must be a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    return _scalar(value, tp, where)


def _scalar(value: Any, tp: Any, where: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"{where} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{where} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise UserError(f"{where} must be a string, got {value!r}")
    return value


def build(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a mapping. Unknown keys and wrong types are errors, all
    of them found before :class:`ConfigErrors` is raised; ``cls``'s own checks
    (``__post_init__``) run once its fields are right."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cast(Any, cls)) if f.init}
    data, problems = _renamed(cls, data, where)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            problems.append(Problem(path, f"unknown config key {path!r}{_suggest(key, [*fields])}"))
            continue
        try:
            kwargs[key] = _coerce(value, hints[key], path)
        except ConfigErrors as exc:
            problems += exc.problems
        except UserError as exc:
            problems.append(Problem(path, str(exc)))
    if problems:
        raise ConfigErrors(problems)
    try:
        return cls(**kwargs)
    except ConfigErrors:
        raise
    except UserError as exc:  # named by the section unless the message names its key
        message = str(exc)
        named = not where or message.startswith(f"{where}.")
        raise ConfigErrors([Problem(where, message if named else f"{where}: {message}")]) from None
    except (TypeError, ValueError) as exc:
        raise ConfigErrors([Problem(where, f"{where or cls.__name__}: {exc}")]) from None


_ABSENT = object()


def _at(data: Any, dotted: str) -> Any:
    """The value at ``dotted`` in nested mappings, or ``_ABSENT``."""
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return _ABSENT
        data = data[part]
    return data


def _renamed(cls: type, data: dict[str, Any], where: str) -> tuple[dict[str, Any], list[Problem]]:
    """``data`` with each old key of ``cls.renamed`` moved to its new key (a copy when one
    moves), one notice per key moved, and a problem for each key given under both names."""
    renamed: dict[str, str] = getattr(cls, "renamed", {})
    given = [(old, new) for old, new in renamed.items() if _at(data, old) is not _ABSENT]
    if not given:
        return data, []
    data, problems = copy.deepcopy(data), []
    for old, new in given:
        full_old, full_new = (f"{where}.{k}" if where else k for k in (old, new))
        *section, last = old.split(".")
        value = (_at(data, ".".join(section)) if section else data).pop(last)
        if _at(data, new) is not _ABSENT:
            problems.append(
                Problem(full_old, f"{full_old} is the old name of {full_new}: keep only {full_new}")
            )
            continue
        *section, last = new.split(".")
        node = data
        for part in section:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # build names the section's own problem
                break
        else:
            node[last] = value
        _log.warning("config key %s is now %s; please write %s", full_old, full_new, full_new)
    return data, problems


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML) to a nested mapping."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(
                f"override {item!r} must look like dotted.key=value (e.g. trainer.lr=3e-5)"
            )
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise UserError(f"override {item!r}: its value is not valid YAML ({exc})") from None
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(cls: type[T], path: str | Path | None, overrides: Sequence[str] = ()) -> T:
    """Read a YAML file (or start empty), apply overrides, build and validate ``cls``.

    Raises one :class:`~tether.errors.UserError` naming every problem and where it is."""
    data: dict[str, Any] = {}
    lines: dict[str, int] = {}
    p = None if path is None else Path(path)
    if p is not None:
        data, lines = _read(p)
        hook = getattr(cls, "resolve_file_paths", None)
        if hook is not None:
            data = hook(data, p.resolve().parent)
    try:
        return build(cls, apply_overrides(data, list(overrides)))
    except ConfigErrors as exc:
        raise UserError(_located(exc.problems, p, lines, list(overrides))) from None


def _read(p: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """A YAML file's mapping and the line of each of its dotted keys."""
    if not p.is_file():
        raise UserError(
            f"config file {p} not found: pass the path of a YAML file (e.g. examples/calc/config.yaml)"
        )
    text = p.read_text()
    try:
        loaded = yaml.safe_load(text) or {}
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:  # file:line:column, not "<unicode string>"
        raise UserError(_yaml_line(p, exc)) from None
    except yaml.YAMLError as exc:
        raise UserError(f"{p} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise UserError(f"{p} must hold a mapping at the top level (key: value lines)")
    lines: dict[str, int] = {}
    _key_lines(node, "", lines)
    return loaded, lines


def _yaml_line(p: Path, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
    context = f" ({exc.context})" if exc.context else ""
    return f"{where}: not valid YAML: {exc.problem}{context}"


def _key_lines(node: Any, prefix: str, out: dict[str, int]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        dotted = f"{prefix}.{key.value}" if prefix else str(key.value)
        out[dotted] = key.start_mark.line + 1
        _key_lines(value, dotted, out)


def _located(
    problems: list[Problem], path: Path | None, lines: dict[str, int], overrides: list[str]
) -> str:
    """One line for one problem (``FILE:LINE: message``), else a heading and a line each."""
    spots = [_where(p.key, lines, overrides) for p in problems]
    if len(problems) == 1:
        spot = spots[0]
        prefix = f"{path}:{spot}" if isinstance(spot, int) else spot or (path and str(path))
        return f"{prefix}: {problems[0].message}" if prefix else problems[0].message
    rows = [
        f"  {f'line {spot}' if isinstance(spot, int) else spot}: {p.message}"
        if spot
        else f"  {p.message}"
        for spot, p in zip(spots, problems, strict=True)
    ]
    return "\n".join([f"config error in {path}:" if path else "config error:", *rows])


def _where(key: str, lines: dict[str, int], overrides: list[str]) -> int | str | None:
    """``override KEY=VALUE`` when an override set ``key`` (or a key in it, or its section),
    else the line of ``key`` in the file (or of its nearest section); None: neither."""
    if not key:
        return None
    for item in reversed(overrides):
        given = item.partition("=")[0]
        if given == key or given.startswith(f"{key}.") or key.startswith(f"{given}."):
            return f"override {item}"
    parts = re.sub(r"\[\d+\]", "", key).split(".")
    while parts:
        line = lines.get(".".join(parts))
        if line is not None:
            return line
        parts.pop()
    return None


def dump(cfg: Any) -> dict[str, Any]:
    """A config dataclass as plain data (for the run record and checkpoints)."""
    return dataclasses.asdict(cfg)
