"""How values become column values, and back.

- token ids: packed little-endian int32 blobs (4 bytes per id)
- logprobs: packed little-endian float32 blobs (4 bytes per value)
- rewards: REAL (float64); a value that is not a finite number is stored as
  NULL and the reason is kept beside it, never turned into a number
- config, task data, request/response: JSON text (strict: no NaN/Infinity)

Packing uses :mod:`array`, so it needs no numpy and costs a few microseconds
for a few hundred tokens.
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from tether.records import read_reward
from tether.store._errors import InvalidRecord

__all__ = [
    "REDACTED",
    "dump_json",
    "load_json",
    "pack_floats",
    "pack_ids",
    "redact_secrets",
    "reward_column",
    "reward_value",
    "unpack_floats",
    "unpack_ids",
]

_SWAP = sys.byteorder != "little"
assert array("i").itemsize == 4 and array("f").itemsize == 4, "array('i'/'f') must be 4 bytes"


def pack_ids(ids: Sequence[int], name: str = "token ids") -> bytes:
    """Token ids → little-endian int32 bytes; ids outside int32 are refused."""
    return _pack("i", ids, f"{name} must be integers in int32 range")


def unpack_ids(blob: bytes) -> list[int]:
    """Little-endian int32 bytes → token ids."""
    return _unpack("i", blob)


def pack_floats(values: Sequence[float], name: str = "logprobs") -> bytes:
    """Floats → little-endian float32 bytes (rounded to float32, as the engine reports them)."""
    return _pack("f", values, f"{name} must be real numbers")


def unpack_floats(blob: bytes) -> list[float]:
    """Little-endian float32 bytes → Python floats (exactly the stored float32 values)."""
    return _unpack("f", blob)


def _pack(typecode: str, values: Sequence[Any], refusal: str) -> bytes:
    """``values`` as a little-endian array of ``typecode``; InvalidRecord ``refusal``
    (with the reason) for a value the array cannot hold."""
    try:
        packed = array(typecode, values)
    except (OverflowError, TypeError) as e:
        raise InvalidRecord(f"{refusal} ({e})") from None
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, blob: bytes) -> list[Any]:
    values = array(typecode)
    values.frombytes(blob)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def dump_json(value: Any, name: str) -> str:
    """Strict JSON text for a column; refuses NaN/Infinity and non-JSON objects."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise InvalidRecord(f"{name} must be JSON-serializable ({e})") from None


def load_json(text: str | None) -> Any:
    """JSON text from a column → value (``None`` stays ``None``)."""
    return None if text is None else json.loads(text)


def reward_column(value: object) -> tuple[float | None, str | None, str | None]:
    """A reward as given → ``(REAL column value, the value as text, why it is unusable)``.

    A training signal (:func:`tether.records.read_reward`) becomes a float64:
    ``(value, None, None)``. Anything else (NaN, ±inf, a bool, a string, None, an
    int beyond float64) becomes ``(None, text, reason)``: it is stored as NULL, the
    rollout stays unusable, and the reason is kept. It never becomes ``0.0``.
    """
    as_float, why = read_reward(value)
    if why is None:
        return as_float, None, None
    if isinstance(value, float):
        return None, repr(float(value)), why  # "nan", "inf", "-inf"
    if isinstance(value, int) and not isinstance(value, bool):  # beyond float64; repr() of
        return None, f"int of {value.bit_length()} bits", why  # 10**5000 would raise
    return None, repr(value)[:200], why


def reward_value(stored: float | None, given: str | None) -> float:
    """The REAL column (and the text kept for an unusable one) → ``Reward.value``.

    An unusable reward reads back as the non-finite float it was (``nan``,
    ``inf``) or ``nan`` when it was not a number at all, so
    :func:`tether.records.usable_reward` stays False for it.
    """
    if stored is not None:
        return stored
    try:
        value = float(given) if given is not None else math.nan
    except ValueError:
        return math.nan
    return math.nan if math.isfinite(value) else value  # "nan", "inf", "-inf" only


REDACTED = "<redacted>"
_SECRET_NAMES = ("key", "keys", "token", "secret", "password", "credentials")


def _is_secret(name: str) -> bool:
    low = name.lower()
    return any(low == s or low.endswith(("_" + s, "-" + s)) for s in _SECRET_NAMES)


def redact_secrets(value: Any) -> Any:
    """A copy of a config with the values of secret-named keys replaced by ``REDACTED``.

    A key is secret when its name is, or ends with ``_``/``-`` followed by, one
    of key(s), token, secret, password, credentials (``admin_key``,
    ``record_keys``, ``OPENAI_API_KEY`` in an ``extra_env``); ``max_tokens``
    is not. Empty values are kept, so a config still shows a key was unset.
    """
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _is_secret(k) and v else redact_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_secrets(v) for v in value]
    return value
