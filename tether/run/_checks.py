"""The run config's shared value checks: one line naming the value, the rule and the fix."""

from __future__ import annotations

from tether.errors import UserError

__all__ = ["at_least", "one_of"]


def at_least(least: int, where: str, value: int, fix: str) -> None:
    """``where (value) must be >= least; fix`` unless ``value >= least``."""
    if not value >= least:
        raise UserError(f"{where} ({value}) must be >= {least}; {fix}")


def one_of(where: str, value: object, options: tuple[str, ...]) -> None:
    """The Literal fields' check for configs built in Python (configio checks loaded ones)."""
    if value not in options:
        raise UserError(f"{where} ({value!r}) must be one of {', '.join(map(repr, options))}")
