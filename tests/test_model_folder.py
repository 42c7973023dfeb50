"""A model folder of one's own (Qwen2/Llama-style, saved with ``save_pretrained``) loads
through the ordinary ``from_pretrained`` path: ``tether serve --model DIR`` and
``model.path: DIR`` in a training run, through the real CLI.

The folder holds a randomly initialised Qwen2-architecture model and the starter
tokenizer. It is test-sized, not Qwen2.5-0.5B-shaped: the 0.5B model is 2 GB of
safetensors and its random init + save + load takes well over 20 s on the shared
2-core test machine; ``benchmarks/train_memory.py`` builds and trains that shape.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import TETHER, serving, tiny_qwen2

ROOT = Path(__file__).resolve().parents[1]


def _folder(tmp: Path, tokenizer: Any, vocab: int) -> Path:
    model = tiny_qwen2(
        vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    folder = tmp / f"qwen2-random-{vocab}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    # an embedding larger than the tokenizer (as Qwen2.5's 151,936 rows for 151,665 tokens)
    return _folder(tmp_path_factory.mktemp("models"), tokenizer, len(tokenizer) + 64)


def test_the_folder_keeps_the_tokenizer_it_was_saved_with(model_folder: Path, tokenizer) -> None:
    """AutoTokenizer alone would build a Qwen2Tokenizer from the config's model_type and
    split numbers differently; load_tokenizer keeps the folder's tokenizer.json."""
    from tether.models import load_tokenizer

    text = 'What is 12 * (3 + 4)? <tool_call>{"a": 1}</tool_call>'
    loaded = load_tokenizer(model_folder)
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.chat_template == tokenizer.chat_template


def test_serve_a_model_folder(model_folder: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TETHER_ADMIN_KEY": "folder-admin-key"}
    with serving(model_folder, tmp_path / "t.sqlite", "--log-level", "warning", env=env) as s:
        admin = {"Authorization": "Bearer folder-admin-key"}
        opened = httpx.post(
            f"{s.base}/admin/rollouts", json={"task": {"q": 1}, "rollout_id": "r1"}, headers=admin
        ).json()
        client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["token"], max_retries=0)
        reply = client.chat.completions.create(
            model="policy", max_tokens=6, messages=[{"role": "user", "content": "2 + 2?"}]
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        calls = httpx.get(f"{s.base}/admin/rollouts/r1", headers=admin).json()["calls"]
        assert len(calls[0]["completion_ids"]) == reply.usage.completion_tokens


def test_a_model_smaller_than_its_tokenizer_is_one_line(tmp_path: Path, tokenizer: Any) -> None:
    small = _folder(tmp_path, tokenizer, len(tokenizer) - 100)
    r = subprocess.run(
        [*TETHER, "serve", "--model", str(small), "--store", str(tmp_path / "t.sqlite")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    # (torchao, when installed, logs import warnings of its own on this machine)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"tokenizer has {len(tokenizer)} tokens" in lines[0]
    assert f"{len(tokenizer) - 100} rows" in lines[0]


@pytest.mark.slow
def test_train_from_a_model_folder_with_gradient_checkpointing(
    model_folder: Path, tmp_path: Path
) -> None:
    overrides = [
        f"dir={tmp_path}",
        f"model.path={model_folder}",
        "tasks.train_size=8",
        "tasks.val_size=2",
        "agent.mode=inprocess",
        "agent.entry=tether.starter.calc:agent",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "trainer.steps=1",
        "trainer.gradient_checkpointing=true",
        "eval.tasks=2",
        "eval.samples=1",
        "gateway.default_max_tokens=8",
    ]
    out = subprocess.run(
        [*TETHER, "train", str(ROOT / "examples/calc/config.yaml"), *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "held-out success: before " in out.stdout and ", 1 steps, " in out.stdout


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def _checkpoint(run_dir: Path, starter_dir: Path, tokenizer: Any, step: int) -> Path:
    """A real checkpoint (``save_checkpoint`` of a trainer over the starter) in ``run_dir``."""
    from tether.models import load_model
    from tether.trainer import PolicyTrainer
    from tether.trainer.checkpoint import save_checkpoint
    from tether.trainer.config import TrainerConfig

    trainer = PolicyTrainer(load_model(starter_dir), TrainerConfig())
    return save_checkpoint(
        run_dir / "checkpoints",
        step,
        trainer=trainer,
        tokenizer=tokenizer,
        base_model_dir=starter_dir,
        config={},
        keep=5,
        run="r",
        run_id="r-rec",
        policy_version=step,
    )


def test_serve_a_checkpoint_folder_and_a_run_folder_stands_for_its_newest(
    starter_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """``--model runs/NAME/checkpoints/step-N`` serves its ``model/`` (it said "has no
    config.json"); ``runs/NAME`` (``model.path``, ``--checkpoint`` too) its newest one's."""
    from tether.models import model_folder, model_source

    run_dir = tmp_path / "runs" / "calc"
    older = _checkpoint(run_dir, starter_dir, tokenizer, 2)
    newest = _checkpoint(run_dir, starter_dir, tokenizer, 10)
    (run_dir / "checkpoints" / "step-000011.tmp-x").mkdir()  # an unfinished save is skipped
    assert model_folder(older) == older / "model"
    assert model_folder(run_dir) == newest / "model"
    assert model_source(str(run_dir), "tokenizer") == str(newest / "model")
    env = {**os.environ, "TETHER_ADMIN_KEY": "ckpt-admin-key"}
    with serving(older, tmp_path / "t.sqlite", "--log-level", "warning", env=env) as s:
        admin = {"Authorization": "Bearer ckpt-admin-key"}
        opened = httpx.post(
            f"{s.base}/admin/rollouts", json={"task": {"q": 1}, "rollout_id": "r1"}, headers=admin
        ).json()
        client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["token"], max_retries=0)
        reply = client.chat.completions.create(
            model="policy", max_tokens=4, messages=[{"role": "user", "content": "2 + 2?"}]
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_a_run_folder_without_a_checkpoint_and_a_folder_without_weights_are_one_line(
    starter_dir: Path, tmp_path: Path
) -> None:
    """A config.json without weights was a 57-line traceback from ``from_pretrained``."""
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy2(starter_dir / "config.json", bare / "config.json")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    for model, needle in [
        (bare, f"error: {bare} has config.json but no weights (model.safetensors, "),
        (tmp_path / "run", f"error: run folder {tmp_path / 'run'} has no checkpoint yet"),
    ]:
        r = subprocess.run(
            [*TETHER, "serve", "--model", str(model), "--store", str(tmp_path / "t.sqlite")],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"},
        )
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert len(lines) == 1 and lines[0].startswith(needle), r.stderr
