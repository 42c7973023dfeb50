"""Tracking sinks (TensorBoard, W&B offline, MLflow file store), read back after a real run.

The shared tracked run (tests/tracking_run.py: 2 updates, 2 evals, through ``run_train``)
sends its metrics to all three sinks with ``tracking.log_samples: true``; each sink's
files are read back with that sink's own reader and compared with what the store recorded. A second run has W&B
missing and MLflow raising mid-run: it completes, with one warning line for each.
The run's export and report are checked in tests/test_export.py.
"""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import TETHER, free_port
from tests.tracking_run import Tracked, tiny_config, train_tiny
from tether.configio import load_config
from tether.errors import UserError
from tether.run import TrackingConfig, TrainConfig
from tether.tracking import Tracking, open_tracking
from tether.tracking._sinks import MlflowSink, flatten_config, metric_tag

SINK_LOGGER = "tether.tracking._fanout"


def test_tensorboard_event_files_hold_every_stored_metric(tracked: Tracked) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tracked.run_dir / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    names = {name for values in tracked.metrics.values() for name in values}
    assert {"reward_mean", "loss", "grad_norm", "eval/sampled_success"} <= names
    assert set(ea.Tags()["scalars"]) == {metric_tag(n) for n in names}
    for name in names:
        got = {e.step: e.value for e in ea.Scalars(metric_tag(name))}
        want = {s: v[name] for s, v in tracked.metrics.items() if name in v}
        assert got.keys() == want.keys(), name
        for step, value in want.items():  # event files hold float32
            assert got[step] == pytest.approx(value, rel=1e-6, abs=1e-6), (name, step)
    assert sorted(ea.Tags()["scalars"])[0].startswith("eval/")
    # the config as hyperparameters, and the samples (log_samples: true) as text
    assert "_hparams_/experiment" in ea.PluginTagToContent("hparams")
    text = ea.Tensors("samples/text_summary")
    assert [t.step for t in text] == [1, 2]  # updates 1 and 2
    assert f"{tracked.run_id}-s1-g0-0".encode() in text[0].tensor_proto.string_val[0]


def test_tether_tensorboard_serves_the_run(tracked: Tracked) -> None:
    """``tether tensorboard`` (TensorBoard 2.20 on a setuptools without pkg_resources too)
    lists the run's scalars over HTTP."""
    port = free_port()
    proc = subprocess.Popen(
        [*TETHER, "tensorboard", "--port", str(port), "--load_fast=false"],
        cwd=tracked.run_dir.parent.parent,  # --logdir defaults to runs/
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        tags: dict[str, Any] = {}
        for _ in range(240):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=2)
                tags = got.json() if got.status_code == 200 else {}
            except httpx.HTTPError:
                pass
            if tags:
                break
            time.sleep(0.5)
        assert {"train/reward_mean", "eval/sampled_success"} <= set(tags["tracked/tensorboard"])
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B ``.wandb`` file (LevelDB log format: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B"
    records, pos, partial = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:  # block padding
            pos += left - 7
            continue
        chunk, pos = data[pos : pos + length], pos + length
        if kind in (1, 4):  # full, last
            record = pb.Record()
            record.ParseFromString(partial + chunk)
            records.append(record)
            partial = b""
        else:  # first, middle
            partial += chunk
    return records


def test_wandb_offline_run_holds_the_metrics_config_and_samples(tracked: Tracked) -> None:
    (run_file,) = (tracked.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[int, dict[str, Any]] = defaultdict(dict)
    config: dict[str, Any] = {}
    for r in wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item
            }
            history[int(row["_step"])].update(row)
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
    assert config["trainer"]["lr"] == 1e-3
    assert config["extra"]["note"].startswith("<script>")
    for step, values in tracked.metrics.items():
        for name, value in values.items():
            assert history[step][metric_tag(name)] == pytest.approx(value, rel=1e-9), (name, step)
    assert history[1]["samples/_type"] == "table-file"  # nested keys
    table = json.loads((run_file.parent / "files" / history[2]["samples/path"]).read_text())
    assert table["columns"][0] == "rollout"
    assert {row[0] for row in table["data"]} == {
        f"{tracked.run_id}-s2-g{g}-{i}" for g in (0, 1) for i in (0, 1)
    }


def test_mlflow_file_store_holds_the_metrics_params_and_samples(tracked: Tracked) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{tracked.run_dir.parent.parent / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("tether").experiment_id])
    assert run.info.run_name == tracked.run_id and run.info.status == "FINISHED"
    assert run.data.params["trainer.lr"] == "0.001"
    assert run.data.params["rollout.n"] == "2"
    names = {name for values in tracked.metrics.values() for name in values}
    for name in names:
        got = {
            m.step: m.value for m in client.get_metric_history(run.info.run_id, metric_tag(name))
        }
        want = {s: v[name] for s, v in tracked.metrics.items() if name in v}
        assert got == pytest.approx(want, rel=1e-12), name
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert artifacts == ["samples/step-000001.jsonl", "samples/step-000002.jsonl"]


def test_train_prints_the_report_next_to_the_reward_curve(tracked: Tracked) -> None:
    assert (tracked.run_dir / "reward_curve.png").is_file()
    assert f"report: {tracked.run_dir / 'report.html'}" in tracked.output
    assert (tracked.run_dir / "report.html").is_file()


@pytest.mark.slow
def test_missing_and_failing_sinks_leave_the_run_going(
    starter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """W&B not installed: one line at the start; MLflow raising at its first step: one line,
    then off; TensorBoard carries on; prompts and completions go nowhere (log_samples off)."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")

    def server_gone(self: Any, step: int, metrics: dict[str, float]) -> None:
        raise ConnectionError("MLflow server went away\nsecond line of detail")

    monkeypatch.setattr(MlflowSink, "log_metrics", server_gone)
    tracking = TrackingConfig(
        sinks=["tensorboard", "wandb", "mlflow"], mlflow_uri=f"file:{tmp_path / 'mlruns'}"
    )
    with caplog.at_level(logging.WARNING, logger=SINK_LOGGER):
        evals, _ = train_tiny(starter_dir, tiny_config(tmp_path, "failing", tracking))
    assert len(evals) == 2  # the run went to its end
    lines = [r.getMessage() for r in caplog.records if r.name == SINK_LOGGER]
    assert len(lines) == 2, lines
    assert "wandb is not installed" in lines[0] and "pip install 'tether[wandb]'" in lines[0]
    assert lines[1].startswith("tracking: mlflow failed at step 0 while logging metrics")
    assert "ConnectionError: MLflow server went away" in lines[1] and "\n" not in lines[1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "failing" / "tensorboard"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/reward_mean")] == [1, 2]
    assert "samples/text_summary" not in ea.Tags()["tensors"]  # log_samples is off


# -- the sink hub and the config, unit level ---------------------------------------------------


class RecordingSink:
    def __init__(self, name: str = "recording", fail_at: int | None = None):
        self.name, self.fail_at = name, fail_at
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.samples: list[tuple[int, list[dict[str, Any]]]] = []
        self.closed = False

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        self.metrics.append((step, metrics))

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.samples.append((step, rows))

    def close(self, failed: bool = False) -> None:
        self.closed, self.failed = True, failed


def test_a_sink_that_raises_is_switched_off_with_one_line(caplog: Any) -> None:
    good, bad = RecordingSink("good"), RecordingSink("bad", fail_at=1)
    hub = Tracking([bad, good])
    with caplog.at_level(logging.WARNING, logger=SINK_LOGGER):
        for step in range(3):
            hub.log_metrics(step, {"loss": float(step)})
    assert [s for s, _ in good.metrics] == [0, 1, 2]
    assert [s for s, _ in bad.metrics] == [0]
    assert [r.getMessage() for r in caplog.records] == [
        "tracking: bad failed at step 1 while logging metrics (RuntimeError: bad broke); "
        "it is off for the rest of the run"
    ]
    hub.close(failed=True)
    assert good.closed and good.failed and not bad.closed


def test_samples_go_out_only_with_log_samples() -> None:
    rows = [{"rollout": "r0", "prompt": "secret prompt", "completion": "secret completion"}]
    off, on = RecordingSink(), RecordingSink()
    Tracking([off]).log_samples(0, rows)
    Tracking([on], log_samples=True).log_samples(0, rows)
    assert off.samples == [] and on.samples == [(0, rows)]


def test_mlflow_that_cannot_start_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # MLflow 3 refuses file:
    cfg = TrackingConfig(sinks=["tensorboard", "mlflow"], mlflow_uri=f"file:{tmp_path / 'ml'}")
    with caplog.at_level(logging.WARNING, logger=SINK_LOGGER):
        hub = open_tracking(cfg, tmp_path / "run", "run-1", {"trainer": {"lr": 0.1}})
    assert hub.names == ["tensorboard"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("tracking: mlflow did not start (MlflowException: ")
    assert "MLFLOW_ALLOW_FILE_STORE=true" in line and "\n" not in line
    hub.close()


def test_tracking_config_spellings(tmp_path: Path) -> None:
    assert TrainConfig().tracking == TrackingConfig(sinks=["tensorboard"])
    listed = tmp_path / "listed.yaml"
    listed.write_text("tracking: [wandb, mlflow, wandb]\n")
    cfg = load_config(TrainConfig, listed)
    assert cfg.tracking.sinks == ["wandb", "mlflow"] and not cfg.tracking.log_samples
    cfg = load_config(TrainConfig, listed, ["tracking.log_samples=true"])  # list form + override
    assert cfg.tracking.sinks == ["wandb", "mlflow"] and cfg.tracking.log_samples
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("tracking:\n  sinks: []\n  project: p\n")
    assert load_config(TrainConfig, mapping).tracking == TrackingConfig(sinks=[], project="p")
    assert load_config(TrainConfig, None, ["tracking=mlflow"]).tracking.sinks == ["mlflow"]
    assert load_config(TrainConfig, None, ["tracking=[]"]).tracking.sinks == []
    with pytest.raises(
        UserError, match=r"unknown sink 'tensorbord' \(did you mean 'tensorboard'\?\)"
    ):
        load_config(TrainConfig, None, ["tracking=[tensorbord]"])
    with pytest.raises(UserError, match=r"unknown config key 'tracking\.log_sample'"):
        load_config(TrainConfig, None, ["tracking.log_sample=true"])


def test_flatten_and_tags() -> None:
    flat = flatten_config(
        {"trainer": {"lr": 1e-3, "lora": None}, "tags": ["a"], "name": "x", "e": {}}
    )
    assert flat == {
        "trainer.lr": 1e-3,
        "trainer.lora": "null",
        "tags": '["a"]',
        "name": "x",
        "e": "{}",
    }
    assert (
        metric_tag("loss") == "train/loss"
        and metric_tag("eval/greedy_success") == "eval/greedy_success"
    )
    assert metric_tag("lag_hist/1") == "lag_hist/1"
