"""benchmarks/train_memory.py runs and prints its table (``--quick``: a tiny model with the
real 151,936-token vocabulary; the figures are the benchmark's business, not asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run_prints_a_row_per_configuration() -> None:
    rows = ["lora/plain", "full/chunked+ckpt"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/train_memory.py"), "--quick", "--rows", *rows],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("device cpu") and "available" in lines[0]
    assert lines[1].split()[:2] == ["row", "seqs×tokens"]
    for name in rows:
        (line,) = [ln for ln in lines if ln.startswith(name + " ")]
        cells = line.split()
        assert cells[1] == "4×64", line  # the quick size, run in full
        assert 0.1 < float(cells[3]) < 2.5 and float(cells[4]) > 0, line  # peak GiB (tiny), s


def test_unknown_row_is_one_line() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/train_memory.py"), "--rows", "lora/fast"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 1 and "unknown row 'lora/fast'" in out.stderr
