"""A call's role is shown wherever its calls are: ``tether rollouts show``, ``tether
export`` and the dashboard's rollout page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_stores import KEY, get_all
from tether.cli._views import print_rollout
from tether.dashboard import Catalog, create_server_app
from tether.records import AttemptEnd, Call, Rollout
from tether.store import Store
from tether.tracking import export_attempts


def _store(path: Path) -> None:
    with Store(path) as s:
        s.create_run({}, "b-1")
        s.create_rollout(Rollout(id="b-1-s1-g0-0", run_id="b-1", group_id="b-1-s1-g0"))
        a = s.start_attempt("b-1-s1-g0-0")
        for role in ("solver", "critic", None):
            s.record_call(Call("b-1-s1-g0-0", -1, [1, 2], [3], [-0.5], 0, attempt=a, role=role))
        s.finish_rollout(AttemptEnd("b-1-s1-g0-0", a, "succeeded"), reward=1.0)


def test_rollouts_show_names_each_calls_role(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _store(tmp_path / "t.db")
    with Store(tmp_path / "t.db") as s:
        print_rollout(s, "b-1-s1-g0-0", tokens=False)
    out = capsys.readouterr().out
    assert "call 0  role solver  policy v0" in out and "call 1  role critic  policy v0" in out
    assert "call 2  policy v0" in out  # no role: nothing said


def test_export_rows_carry_each_calls_role(tmp_path: Path) -> None:
    _store(tmp_path / "t.db")
    with Store(tmp_path / "t.db") as s:
        (row,) = list(export_attempts(s))
    assert [c["role"] for c in row["calls"]] == ["solver", "critic", None]


def test_the_dashboards_rollout_page_shows_each_calls_role(tmp_path: Path) -> None:
    _store(tmp_path / "b" / "traces.sqlite")
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    (page,) = get_all(app, ["/ui/s/b/rollout/b-1-s1-g0-0"])
    assert page.text.count('class="role"') == 2
    assert "role solver" in page.text and "role critic" in page.text


def test_eval_of_a_roles_checkpoint_serves_every_adapter_of_it(
    starter_dir: Path, tmp_path: Path
) -> None:
    """``tether eval --checkpoint`` of a run with an own-adapter role: its ``model/`` is the
    shared policy only, so the run's trainer and engine get every adapter of the
    checkpoint on the base model (``_load_adapters``)."""
    import asyncio

    import torch

    from tether.cli._train_run import _load_adapters
    from tether.engine import SamplingParams
    from tether.models import load_model, load_tokenizer
    from tether.run import EvalConfig, TasksConfig, TrainConfig, TrainingRun
    from tether.run.config import LoraConfig, RoleConfig, TrainerConfig
    from tether.trainer import PolicyTrainer
    from tether.trainer.checkpoint import save_checkpoint

    cfg = TrainConfig(
        name="ev", dir=str(tmp_path), tasks=TasksConfig(source="calc", train_size=4, val_size=2),
        trainer=TrainerConfig(lora=LoraConfig(r=4, alpha=8)), eval=EvalConfig(enabled=False),
        roles={"solver": RoleConfig(adapter=True), "critic": RoleConfig(train=False)},
    )  # fmt: skip
    trained = PolicyTrainer(load_model(starter_dir), cfg.trainer, adapters=("solver",))
    with torch.no_grad():
        for name, p in trained.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    ckpt = save_checkpoint(
        tmp_path / "ck", 3, trainer=trained, tokenizer=load_tokenizer(starter_dir),
        base_model_dir=starter_dir, config={}, keep=1,
    )  # fmt: skip
    prompt = list(range(40, 60))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, adapter="solver")

    async def go() -> tuple[list[float], Any, dict, int]:
        async with TrainingRun(cfg, model_path=starter_dir, command="eval") as run:
            before = (await run.engine.generate(prompt, params)).completions[0].logprobs
            await _load_adapters(run, ckpt)
            after = await run.engine.generate(prompt, params)
            weights = run.trainer.adapters_state_dict()
            return before, after.completions[0], weights, run.engine.policy_version

    before, after, weights, version = asyncio.run(go())
    want = trained.adapters_state_dict()
    assert all(torch.equal(weights[a][k], v) for a in want for k, v in want[a].items())
    assert version == 1 and after.logprobs != before
    served = trained.serving_model(load_model(starter_dir))
    served.set_adapter("solver")
    with torch.no_grad():
        logits = served(input_ids=torch.tensor([prompt + after.token_ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    ref = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(after.token_ids)]
    assert max(abs(a - b) for a, b in zip(ref, after.logprobs, strict=True)) < 1e-5
