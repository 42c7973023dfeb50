"""The memory self-check: resident size as the OS sees it, and returning freed heap."""

from __future__ import annotations

import sys

import pytest

from tether._memory import resident_mb, trim_heap

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, glibc")


@linux
def test_resident_mb_sees_touched_memory_come_and_go() -> None:
    before = resident_mb()
    assert before is not None and before > 10
    block = bytearray(256 * 2**20)  # zero-filled, so every page is touched
    grown = resident_mb()
    del block
    trim_heap()
    after = resident_mb()
    assert grown is not None and after is not None
    assert grown - before > 200
    assert grown - after > 200


@linux
def test_trim_heap_returns_small_freed_blocks() -> None:
    """Many small blocks live in malloc's heap, not in their own mappings: freeing them
    keeps the pages resident until malloc_trim hands them back."""
    blocks = [bytearray(4096) for _ in range(60_000)]  # ~240 MiB in the heap
    kept = blocks[::50]  # survivors scattered through the heap, as in a real process
    peak = resident_mb()
    del blocks
    freed = resident_mb()
    assert trim_heap() is True
    after = resident_mb()
    assert peak is not None and freed is not None and after is not None
    assert peak - freed < 50  # free() alone gave (almost) nothing back
    assert freed - after > 150  # malloc_trim did
    assert len(kept) == 1200
