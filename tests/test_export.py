"""``tether export`` and ``tether report`` on the shared tracked run (tests/tracking_run.py).

- rollout attempts to Parquet and JSONL, loaded back with ``datasets.load_dataset``, hold
  the store's calls, token ids, logprobs and rewards, and the advantages the trainer used;
- ``--samples`` rebuilds each update's training samples equal to what
  ``PolicyTrainer.update`` was given in the run;
- the HTML report embeds the curves as PNGs and the store's held-out numbers, escaped;
- bad RUN, step, format: one line naming the fix.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.helpers import TETHER
from tests.tracking_run import Tracked
from tether.cli._track_run import run_export
from tether.errors import UserError
from tether.records import AttemptEnd, Rollout
from tether.store import Store
from tether.tracking import (
    CALL_FIELDS,
    ROW_FIELDS,
    export_attempts,
    step_samples,
    write_report,
    write_rows,
)


def tether(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TETHER, *args], capture_output=True, text=True, timeout=300, cwd=cwd, check=False
    )


def load(fmt: str, path: Path, cache: Path) -> Any:
    from datasets import load_dataset

    kind = "json" if fmt == "jsonl" else "parquet"
    return load_dataset(kind, data_files=str(path), split="train", cache_dir=str(cache))


def trained_rollout(tracked: Tracked, step: int, index: int) -> str:
    """The rollout id of ``rollout_index`` ``index`` of update ``step`` (from 1; every group kept:
    the alternating grader gives each group rewards 0 and 1; rollout.n is 2)."""
    return f"{tracked.run_id}-s{step}-g{index // 2}-{index % 2}"


def test_parquet_and_jsonl_exports_load_with_datasets(tracked: Tracked, tmp_path: Path) -> None:
    out = tmp_path / "rollouts.parquet"
    done = tether("export", str(tracked.run_dir), "--format", "parquet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    with Store(tracked.run_dir / "traces.sqlite") as store:
        rollouts = store.list_rollouts()
        calls = {r.id: store.calls(r.id, attempt=r.attempt) for r in rollouts}
    attempts = sum(r.attempt for r in rollouts)
    assert done.stdout.strip() == f"wrote {attempts} rollout attempts to {out}"
    ds = load("parquet", out, tmp_path / "hf")
    assert len(ds) == attempts == 20  # 2 evals × (2 tasks × 2 + 2 greedy) + 2 updates × 4
    assert set(ds.column_names) == set(ROW_FIELDS) | {"calls"}
    rows = {row["rollout_id"]: row for row in ds}
    for r in rollouts:
        row = rows[r.id]
        assert (row["run_id"], row["task_id"], row["reward"]) == (r.run_id, r.task_id, r.reward)
        assert row["status"] == r.status.value and json.loads(row["task"])["id"] == r.task_id
        assert len(row["calls"]) == len(calls[r.id]) >= 1
        for got, call in zip(row["calls"], calls[r.id], strict=True):
            assert set(got) == set(CALL_FIELDS)
            assert got["prompt_ids"] == call.prompt_ids
            assert got["completion_ids"] == call.completion_ids
            assert got["logprobs"] == pytest.approx(call.logprobs, abs=1e-6)  # float32
            assert got["policy_version"] == call.policy_version
            assert json.loads(got["messages"]) == call.request["messages"]
    kinds = {(row["kind"], row["step"]) for row in ds}
    assert kinds == {("train", 1), ("train", 2), ("eval_sampled", 0), ("eval_sampled", 2)} | {
        ("eval_greedy", 0),
        ("eval_greedy", 2),
    }
    for step, batch in enumerate(tracked.samples, 1):  # the advantages the trainer was given
        for s in batch:
            assert rows[trained_rollout(tracked, step, s.rollout_index)]["advantage"] == s.advantage
    assert all(row["advantage"] is None for row in ds if row["kind"] != "train")
    assert all(row["success"] == (row["reward"] == 1.0) for row in ds)

    jsonl = tmp_path / "rollouts.jsonl"
    run_export(
        str(tracked.run_dir), None, "jsonl", jsonl, samples=False, step=None, run_id=None,
        console=Console(file=None, quiet=True),
    )  # fmt: skip
    same = load("jsonl", jsonl, tmp_path / "hf")
    assert [r["rollout_id"] for r in same] == [r["rollout_id"] for r in ds]
    assert [r["advantage"] for r in same] == [r["advantage"] for r in ds]
    assert [r["calls"][0]["completion_ids"] for r in same] == [
        r["calls"][0]["completion_ids"] for r in ds
    ]


def test_samples_export_equals_what_the_trainer_was_given(tracked: Tracked, tmp_path: Path) -> None:
    assert len(tracked.samples) == 2  # two updates
    out = tmp_path / "step1.jsonl"
    done = tether("export", str(tracked.run_dir), "--samples", "--step", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"wrote {len(tracked.samples[0])} training samples of step 1 ({tracked.run_id}) to {out}"
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(tracked.samples[0]) > 0
    for row, s in zip(rows, tracked.samples[0], strict=True):
        assert row["input_ids"] == s.input_ids
        assert row["loss_mask"] == s.loss_mask
        assert row["old_logprobs"] == s.old_logprobs  # the stored float32 values, exactly
        assert row["advantage"] == s.advantage
        assert row["rollout_id"] == trained_rollout(tracked, 1, s.rollout_index)
    parquet = tmp_path / "last.parquet"  # no --step: the last update
    run_export(
        str(tracked.run_dir), None, "parquet", parquet, samples=True, step=None, run_id=None,
        console=Console(quiet=True),
    )  # fmt: skip
    ds = load("parquet", parquet, tmp_path / "hf")
    assert set(ds["step"]) == {2}
    assert ds["input_ids"] == [s.input_ids for s in tracked.samples[1]]
    assert ds["loss_mask"] == [s.loss_mask for s in tracked.samples[1]]
    assert ds["advantage"] == [s.advantage for s in tracked.samples[1]]
    for got, s in zip(ds["old_logprobs"], tracked.samples[1], strict=True):
        assert got == pytest.approx(s.old_logprobs, abs=1e-6)
    with Store(tracked.run_dir / "traces.sqlite") as store:
        assert step_samples(store).updated and step_samples(store, 1).step == 1


def test_bad_run_step_and_format_are_one_line_naming_the_fix(
    tracked: Tracked, tmp_path: Path
) -> None:
    def error(**kw: Any) -> str:
        args: dict[str, Any] = {"samples": False, "step": None, "run_id": None}
        args.update(kw)
        run, fmt = args.pop("run", str(tracked.run_dir)), args.pop("fmt", "jsonl")
        with pytest.raises(UserError) as e:
            run_export(run, None, fmt, tmp_path / "x", console=Console(quiet=True), **args)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert error(samples=True, step=7) == (
        "step 7 is not in this store: pass --step between 1 and 2"
    )
    assert error(step=1).startswith("--step picks the update of --samples: add --samples")
    assert error(fmt="csv") == "--format 'csv' is not known: use --format jsonl or --format parquet"
    assert error(run_id="nope").startswith("no run record 'nope' in ")
    assert error(run=str(tmp_path / "nowhere")).startswith(f"no run '{tmp_path / 'nowhere'}'")
    done = tether("export", "nope", cwd=tmp_path)  # the CLI: one line, exit status 2
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: no run 'nope': runs/nope/traces.sqlite does not exist (tether serve writes "
        ".tether/traces.sqlite, tether train writes runs/NAME/traces.sqlite)"
    ]


def test_report_embeds_the_curves_and_the_held_out_table(tracked: Tracked, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = tether("report", str(tracked.run_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"report: {out}"
    page = out.read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)">', page)
    assert [alt for alt, _ in images] == [
        "reward", "success", "loss", "KL", "grad norm", "logprob gap"
    ]  # fmt: skip
    assert all(base64.b64decode(png).startswith(b"\x89PNG\r\n\x1a\n") for _, png in images)
    assert "<script" not in page and 'src="http' not in page  # self-contained, no scripts
    for step, values in tracked.metrics.items():
        if "eval/sampled_success" in values:
            cells = f"<tr><td>{step}</td><td>{values['eval/sampled_success']:.1%}</td>"
            cells += f"<td>{values['eval/greedy_success']:.1%}</td>"
            assert cells in page
    # the run's config note "<script>alert('x')</script> & <b>bold</b>" is text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp;amp; &lt;b&gt;" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    with Store(tracked.run_dir / "traces.sqlite") as store:
        named = write_report(store, tmp_path / "named.html", '<img src=x onerror="alert(1)">')
    assert "<img src=x" not in named.read_text()
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in named.read_text()


def test_report_of_a_store_without_training_is_one_line(tmp_path: Path) -> None:
    Store(tmp_path / "traces.sqlite").close()
    done = tether("report", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: this store holds no training run: pass a run folder that `tether train` wrote"
    )


def test_each_attempt_row_carries_what_the_judge_saw_and_said(tmp_path: Path) -> None:
    detail = {
        "judge": "judge",
        "model": "m",
        "messages": [{"role": "user", "content": "<task>…</task>"}],
        "raw": '{"1": {"explanation": "right", "score": 1}}',
        "scores": {"1": 1.0, "2": 0.0},
        "explanations": {"1": "right", "2": "wrong"},
        "candidate": "1",
    }
    with Store(tmp_path / "traces.sqlite") as s:
        run = s.create_run({"name": "j"}, "j-1")
        s.create_rollout(Rollout(id="j-1-s1-g0-0", run_id=run.id, group_id="j-1-s1-g0", task={}))
        a = s.start_attempt("j-1-s1-g0-0")
        s.finish_rollout(AttemptEnd("j-1-s1-g0-0", a, "failed", error="lost worker; retried"))
        a = s.start_attempt("j-1-s1-g0-0")
        s.finish_rollout(
            AttemptEnd("j-1-s1-g0-0", a, "succeeded", success=True, grade_detail=detail),
            reward=1.0,
            reward_source="grader",
        )
        rows = list(export_attempts(s))
    assert (rows[0]["attempt"], rows[0]["grade_detail"]) == (1, None)  # the retried one
    assert json.loads(rows[1]["grade_detail"]) == detail
    for fmt in ("jsonl", "parquet"):  # both formats hold the column
        out = tmp_path / f"rows.{fmt}"
        assert write_rows(iter(rows), out, fmt) == 2
        loaded = load(fmt, out, tmp_path / "hf")
        assert [r["grade_detail"] for r in loaded] == [None, rows[1]["grade_detail"]]
