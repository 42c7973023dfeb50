"""Process memory: what is resident, and giving freed heap back to the OS.

Each update allocates and frees tensors of many sizes on several threads
(the engine's worker, the optimizer's). glibc keeps freed blocks in
per-thread arenas instead of returning them, so the resident size of a
training process grew by ~37 MiB per demo update (942 → 2,740 MiB in 50)
while the live tensors stayed at 37 MiB. ``malloc_trim(0)`` after each
update hands the free pages back (measured: 475 → ~590 MiB over 12 updates).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache
from pathlib import Path

__all__ = ["resident_mb", "trim_heap"]


def resident_mb() -> float | None:
    """This process's resident memory in MiB (Linux ``/proc``; None elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@cache
def _malloc_trim() -> object | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None else None  # glibc only
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Return freed heap pages to the OS (glibc's ``malloc_trim``); False where unavailable."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # type: ignore[operator]
    return True
