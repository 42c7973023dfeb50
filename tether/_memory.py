"""Process memory: what is resident, and giving freed heap back to the OS.

Each update allocates and frees tensors of many sizes on several threads
(the engine's worker, the optimizer's). glibc keeps freed blocks in
per-thread arenas instead of returning them, so the resident size of a
training process grew by ~37 MiB per demo update (942 → 2,740 MiB in 50)
while the live tensors stayed at 37 MiB. ``malloc_trim(0)`` after each
update hands the free pages back (measured: 475 → ~590 MiB over 12 updates).

Within one update, glibc's *dynamic* mmap threshold does the same harm at a real
model's size: once a large block has been freed, blocks up to that size (up to 32 MiB:
the layer activations of 8,192 tokens at hidden 896 are 29 MiB) come from the heap,
and an update's many short-lived ones leave holes that count as resident. One LoRA
update of the Qwen2.5-0.5B shape at 8 × 1,024 tokens peaked at 9.69 GiB RSS with it
and 4.02 GiB with a fixed 1 MiB threshold, in about the same time (docs/memory.md).
:func:`map_large_blocks` fixes the threshold, as ``MALLOC_MMAP_THRESHOLD_`` would.

Across updates, glibc's per-thread arenas did the same: every thread that meets a busy
arena gets one of its own (up to 8 per core), and what one frees the others cannot use,
so a run's resident memory kept rising with its length. ``tether demo --steps 40`` on a
2-core x86_64 machine, twice each, A B A B: the slope after update 10 was +2.66 and +1.10
MiB per update with glibc's default, +0.21 and -0.53 with ``MALLOC_ARENA_MAX=2`` (peak
764/734 against 663/669 MiB), in 3.2 against 2.7 min for the unloaded pair.
:func:`limit_arenas` caps them so, as the ``tether`` command starts and as a
``TrainingRun`` is built (for a program that runs one itself).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache
from pathlib import Path

__all__ = ["limit_arenas", "map_large_blocks", "resident_mb", "trim_heap"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
_M_ARENA_MAX = -8
#: heap arenas a tether process keeps (glibc's default: 8 per core)
ARENAS = 2
# blocks of this many bytes or more are mapped on their own and unmapped when freed
_MAP_FROM = 1 << 20


def resident_mb() -> float | None:
    """This process's resident memory in MiB (Linux ``/proc``; None elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@cache
def _libc_function(name: str) -> object | None:
    lib = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(lib) if lib else None
        return getattr(libc, name) if libc is not None else None  # glibc only
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Return freed heap pages to the OS (glibc's ``malloc_trim``); False where unavailable."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)  # type: ignore[operator]
    return True


def map_large_blocks() -> bool:
    """Fix glibc's mmap threshold at 1 MiB (no dynamic rise), so that
    freed large blocks go back to the OS at once instead of staying resident as heap
    holes (module doc). Once per process; a ``MALLOC_MMAP_THRESHOLD_`` the user set wins.
    False where it does not apply (not glibc, or the user's setting)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MAP_FROM))  # type: ignore[operator]


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's heap arenas at ``arenas`` (as ``MALLOC_ARENA_MAX`` would), before the
    process starts its threads: each thread that meets a busy arena otherwise gets one of
    its own (up to 8 per core), and blocks freed in one stay resident while the others
    grow. A run's resident memory then rose with its length (module doc, docs/memory.md).
    Once per process, early; a ``MALLOC_ARENA_MAX`` the user set wins. False where it does
    not apply (not glibc, or the user's setting)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))  # type: ignore[operator]
