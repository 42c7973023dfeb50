"""One short real training run with every tracking sink, shared by the tracking and export
tests (a session fixture, registered in conftest.py): the starter model, the calc agent
in-process, 2 updates and 2 evals, through ``tether train``'s own code path (``run_train``),
with the samples each update trained on recorded as ``PolicyTrainer.update`` got them.
"""

from __future__ import annotations

import copy
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tether.run import (
    EvalConfig,
    RolloutConfig,
    TasksConfig,
    TrackingConfig,
    TrainConfig,
    TrainerConfig,
)
from tether.runner import RunnerConfig
from tether.store import Store

__all__ = ["Tracked", "stored_metrics", "tiny_config", "tracked", "train_tiny"]


def tiny_config(root: Path, name: str, tracking: TrackingConfig) -> TrainConfig:
    cfg = TrainConfig(
        name=name,
        dir=str(root),
        tasks=TasksConfig(source="calc", train_size=20, val_size=4),
        agent=RunnerConfig(
            mode="inprocess", entry="tether.starter.calc:agent", concurrency=8, timeout_s=60
        ),
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=2, lr=1e-3),
        eval=EvalConfig(tasks=2, samples=2, greedy=True),
        tracking=tracking,
        extra={"note": "<script>alert('x')</script> & <b>bold</b>"},
    )
    cfg.gateway.default_max_tokens = 24
    return cfg


@dataclass
class Tracked:
    run_dir: Path
    run_id: str
    metrics: dict[int, dict[str, float]]  # what the store recorded: step -> name -> value
    samples: list[list[Any]]  # what PolicyTrainer.update was given, per update
    output: str  # what run_train printed


def train_tiny(
    starter_dir: Path, cfg: TrainConfig, samples: list[list[Any]] | None = None
) -> tuple[Any, str]:
    """``tether train``'s code path (run_train) on ``cfg``; returns (evals, printed text)."""
    from tether.cli import _train_run
    from tether.trainer import PolicyTrainer

    real_update = PolicyTrainer.update

    def spy(self: Any, batch: list[Any]) -> dict[str, float]:
        if samples is not None:
            samples.append(copy.deepcopy(batch))
        return real_update(self, batch)

    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PolicyTrainer, "update", spy)
        # run_train loads the starter from cfg.model.path: point it at the test cache
        cfg.model.path = str(starter_dir)
        evals = _train_run.run_train(cfg, Console(file=buf, width=200))
    return evals, buf.getvalue()


def stored_metrics(db_path: Path) -> tuple[str, dict[int, dict[str, float]]]:
    with Store(db_path) as store:
        (run,) = store.list_runs()
        by: dict[int, dict[str, float]] = defaultdict(dict)
        for m in store.metrics(run.id):
            by[m.step][m.name] = m.value
    return run.id, dict(by)


@pytest.fixture(scope="session")
def tracked(starter_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Tracked:
    root = tmp_path_factory.mktemp("tracked")
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb-dir"),
        "WANDB_SILENT": "true",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 refuses a file: store without it
    }
    tracking = TrackingConfig(
        sinks=["tensorboard", "wandb", "mlflow"],
        log_samples=True,
        mlflow_uri=f"file:{root / 'mlruns'}",
    )
    samples: list[list[Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        cfg = tiny_config(root / "runs", "tracked", tracking)  # root/runs/tracked
        _, output = train_tiny(starter_dir, cfg, samples)
        import wandb

        wandb.teardown()  # stop the W&B service process this run started
    run_dir = root / "runs" / "tracked"
    run_id, metrics = stored_metrics(run_dir / "traces.sqlite")
    return Tracked(run_dir, run_id, metrics, samples, output)
