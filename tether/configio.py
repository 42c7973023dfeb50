"""YAML + dotted overrides → nested config dataclasses, with errors that say the fix.

Generic: it knows dataclasses and type hints, nothing of tether's components.
Each component keeps its own dataclass and validates itself in
``__post_init__``; this module only builds them::

    cfg = load_config(TrainConfig, "examples/calc/config.yaml", ["trainer.lr=3e-5", "rollout.n=8"])

A class may define ``resolve_file_paths(data, folder) -> data`` (a classmethod
or staticmethod): it gets the mapping read from the file, before the
overrides, and the file's folder, so that paths written in a file can be
relative to the file while overrides stay relative to the current directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml

from tether.errors import UserError

__all__ = ["apply_overrides", "build", "dump", "load_config"]

T = TypeVar("T")


def _suggest(key: str, options: list[str]) -> str:
    near = difflib.get_close_matches(key, options, n=1)
    return f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(sorted(options))})"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a mapping of its fields, got {value!r}")
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
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types are errors."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cast(Any, cls)) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise UserError(f"unknown config key {path!r}{_suggest(key, list(fields))}")
        kwargs[key] = _coerce(value, hints[key], path)
    try:
        return cls(**kwargs)
    except UserError as exc:  # named by the section unless the message names its key
        message = str(exc)
        named = not where or message.startswith(f"{where}.")
        raise UserError(message if named else f"{where}: {message}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where or cls.__name__}: {exc}") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML) to a nested mapping."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(
                f"override {item!r} must look like dotted.key=value (e.g. trainer.lr=3e-5)"
            )
        value = yaml.safe_load(raw) if raw != "" else ""
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] = ()) -> T:  # type: ignore[assignment]
    """Read a YAML file (or start empty), apply overrides, build and validate ``cls``."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(
                f"config file {p} not found: pass the path of a YAML file (e.g. examples/calc/config.yaml)"
            )
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"{p} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise UserError(f"{p} must hold a mapping at the top level")
        data = loaded
        hook = getattr(cls, "resolve_file_paths", None)
        if hook is not None:
            data = hook(data, p.resolve().parent)
    return build(cls, apply_overrides(data, list(overrides)))


def dump(cfg: Any) -> dict[str, Any]:
    """A config dataclass as plain data (for the run record and checkpoints)."""
    return dataclasses.asdict(cfg)
