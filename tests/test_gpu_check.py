"""dev/gpu_check.sh in its CPU fast mode: it runs every step and writes every figure file,
so the check is ready the day a GPU is lent (docs/gpu.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_on_cpu_in_fast_mode(tmp_path: Path, starter_dir: Path) -> None:
    out = tmp_path / "figures"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    cmd = [str(ROOT / "dev" / "gpu_check.sh"), str(out), "--device", "cpu", "--fast"]
    done = subprocess.run(
        [*cmd, "--demo-model", str(starter_dir)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = [
        "pytest_gpu",
        "real_servers",
        "engine_throughput",
        "train_memory",
        "logprob_gap",
        "fsdp2",
        "demo",
    ]
    timings = (out / "timings.txt").read_text().splitlines()
    assert [line.split()[:2] for line in timings] == [[n, "ok"] for n in names]
    assert "skipped" in (out / "pytest_gpu.txt").read_text()  # collected, no CUDA here
    real = (out / "real_servers.txt").read_text()  # no vLLM / SGLang here: skipped, with why
    assert "vllm is not importable here" in real and "sglang is not importable here" in real
    engine = (out / "engine_throughput.txt").read_text()
    assert "model.generate, one at a time" in engine and "TransformersEngine" in engine
    gap = (out / "logprob_gap.txt").read_text()
    assert all(f"{d} " in gap for d in ("float32", "bfloat16", "int8"))
    fsdp2 = (out / "fsdp2.txt").read_text()
    assert "fsdp2: 1 process(es) on cpu" in fsdp2 and "resumed from" in fsdp2
    assert "step   2/2" in fsdp2 and "gap" in fsdp2
    summary = (out / "summary.txt").read_text()
    assert "held-out success: before" in summary and "device=cpu fast=1" in summary
    assert "lora/chunked+ckpt" in (out / "train_memory.txt").read_text()
    assert (out / "runs").is_dir()  # the demo ran in OUTDIR, not in the checkout


def test_gpu_check_refuses_unknown_flags(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "dev" / "gpu_check.sh"), str(tmp_path), "--devices", "cuda"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "usage: dev/gpu_check.sh OUTDIR" in done.stderr
