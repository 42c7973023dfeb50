"""Roles in a run's config and in what an update trains: ``roles`` loads and checks,
the gateway serves exactly the configured roles, frozen roles' samples are not
trained and a role's weight scales its advantages."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import small_run
from tether.configio import load_config
from tether.errors import UserError
from tether.records import Call, RolloutStatus
from tether.run import EvalConfig, RolloutConfig, TrainingRun
from tether.run._collect import RolloutOutcome
from tether.run._learn import Learning, learn_metrics
from tether.run.config import LoraConfig, RoleConfig, TrainConfig, TrainerConfig
from tether.store import Store
from tether.tracking import step_samples

LORA = ["trainer.lora.r=4"]


def _load(tmp_path: Path, yaml: str, overrides: list[str] = ()) -> TrainConfig:  # type: ignore[assignment]
    path = tmp_path / "c.yaml"
    path.write_text(yaml)
    return load_config(TrainConfig, path, list(overrides))


def test_roles_load_and_the_gateway_serves_exactly_them(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        "roles:\n  solver: {adapter: true, weight: 2}\n  critic: {train: false}\n  helper: {}\n",
        LORA,
    )
    assert cfg.roles == {
        "solver": RoleConfig(train=True, adapter=True, weight=2.0),
        "critic": RoleConfig(train=False),
        "helper": RoleConfig(),
    }
    assert cfg.gateway.roles == ("solver", "critic", "helper")
    assert cfg.gateway.role_adapters == {"solver": "solver", "critic": "base"}  # helper: policy
    assert TrainConfig().roles == {} and TrainConfig().gateway.roles is None


@pytest.mark.parametrize(
    ("yaml", "overrides", "words"),
    [
        ("roles:\n  critic: {train: false}\n", [], "own adapters and frozen roles need a LoRA trainer"),
        ("roles:\n  solver: {adapter: true}\n", [], "set trainer.lora"),
        ("roles:\n  critic: {train: false, adapter: true}\n", LORA, "roles.critic: a frozen role"),
        ("roles:\n  a b: {}\n", [], "roles: invalid role name 'a b'"),
        ("roles:\n  s: {weight: -1}\n", [], r"roles.s.weight \(-1.0\) must be a finite number >= 0"),
        ("roles:\n  s: {trian: true}\n", [], "unknown config key 'roles.s.trian'"),
        ("roles:\n  base: {adapter: true}\n", LORA, "cannot be named 'base'"),
        ("roles:\n  s: {adapter: true}\n", [*LORA, "engine.kind=vllm", "engine.urls=[http://h:1]",
                                             "engine.transport=lora"], "embedded engine only"),
    ],
)  # fmt: skip
def test_bad_roles_are_refused_with_the_fix(
    tmp_path: Path, yaml: str, overrides: list[str], words: str
) -> None:
    with pytest.raises(UserError, match=words):
        _load(tmp_path, yaml, overrides)


def _outcome(rid: str, group: int, reward: float, roles: list[str]) -> RolloutOutcome:
    calls = [
        Call(rid, k, [1, 2, 10 + k], [3, 4], [-0.5, -0.5], 0, role=role)
        for k, role in enumerate(roles)
    ]
    return RolloutOutcome(rid, group, RolloutStatus.SUCCEEDED, reward, calls)


def test_frozen_roles_are_not_trained_and_weights_scale_advantages() -> None:
    groups = [
        [_outcome("a", 0, 1.0, ["solver", "critic"]), _outcome("b", 0, 0.0, ["solver", "critic"])]
    ]
    how = Learning("dr_grpo", role_weights={"solver": 2.0, "critic": 0.0})
    m, samples, _ = learn_metrics(groups, how)
    assert [(s.role, s.advantage) for s in samples] == [("solver", 1.0), ("solver", -1.0)]
    assert m["samples_frozen"] == 2.0
    _, both, _ = learn_metrics(groups, Learning("dr_grpo"))  # no roles configured: all trained
    assert [(s.role, s.advantage) for s in both] == [
        ("solver", 0.5), ("critic", 0.5), ("solver", -0.5), ("critic", -0.5),
    ]  # fmt: skip
    only_frozen = Learning("dr_grpo", role_weights={"solver": 0.0, "critic": 0.0})
    assert learn_metrics(groups, only_frozen)[1] == []  # nothing left: no update


def test_a_shared_policy_role_loads_and_the_gateway_serves_it(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "roles:\n  solver: {weight: 2}\n  helper: {}\n")
    assert cfg.roles == {"solver": RoleConfig(weight=2.0), "helper": RoleConfig()}
    assert cfg.gateway.roles == ("solver", "helper")


def test_learning_reads_the_roles_of_the_config() -> None:
    roles = {"solver": RoleConfig(weight=0.5), "critic": RoleConfig(train=False)}
    cfg = TrainConfig(roles=roles, trainer=TrainerConfig(lora=LoraConfig()))
    assert Learning.of(cfg).role_weights == {"solver": 0.5, "critic": 0.0}


# --------------------------------------------------------------------------- a run with two roles


def role_client(client: Any, role: str) -> Any:
    """The in-process agent's client for one role: its base URL's role form."""
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    return client.with_options(base_url=f"{base}/roles/{role}/v1")


async def solver_and_critic(task: dict[str, Any], client: Any) -> str:
    """The solver answers, the critic (another agent, its own prompt) checks the answer."""
    from tether.starter.calc import SYSTEM_PROMPT

    solver, critic = role_client(client, "solver"), role_client(client, "critic")
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": task["question"]}]  # fmt: skip
    r = await solver.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    answer = r.choices[0].message.content or ""
    check = [{"role": "system", "content": "You check answers."},
             {"role": "user", "content": f"{task['question']} -> {answer[:40]}"}]  # fmt: skip
    await critic.chat.completions.create(model="policy", messages=check, max_tokens=4)
    return answer


async def plan_solve_check(task: dict[str, Any], client: Any) -> str:
    """A planner on the plain URL (the shared policy), then the solver and the critic."""
    hint = [{"role": "user", "content": f"Plan: {task['question']}"}]
    await client.chat.completions.create(model="policy", messages=hint, max_tokens=4)
    return await solver_and_critic(task, client)


def test_a_run_with_two_roles_records_them_and_trains_each_against_its_own(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Two roles on the shared policy through the real gateway: every call records its
    role, each role is its own sample, and the critic's advantages carry its weight
    (what ``tether export --samples`` rebuilds is what the update trained)."""
    cfg = small_run(
        tmp_path,
        "roles",
        "tests.test_run_roles:solver_and_critic",
        train_size=8,
        concurrency=8,
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=1, lr=1e-3, advantage="dr_grpo"),
        eval=EvalConfig(enabled=False),
        roles={"solver": RoleConfig(), "critic": RoleConfig(weight=0.5)},
    )

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    run = asyncio.run(go())
    m = run.history[0].metrics
    assert run.engine.policy_version == 1 and math.isfinite(m["loss"])
    assert m["samples_frozen"] == 0
    with Store(tmp_path / "roles" / "traces.sqlite") as store:
        rollouts = store.list_rollouts()
        roles = [[c.role for c in store.calls(r.id)] for r in rollouts]
        samples = step_samples(store, 1).samples
    assert len(rollouts) == 4 and roles == [["solver", "critic"]] * 4
    assert [s.role for s in samples] == ["solver", "critic"] * 4
    for solver, critic in zip(samples[::2], samples[1::2], strict=True):
        assert critic.advantage == pytest.approx(0.5 * solver.advantage)  # both roles in every
        # rollout: the same comparison, the critic's scaled by its weight


def test_a_run_with_an_own_adapter_role_and_a_frozen_role(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Issue 24 item 3, end to end through the real gateway: ``solver`` trains its own LoRA
    adapter, ``critic`` is frozen (served by the base weights), a planner's calls without
    a role train the shared policy (peft's default adapter). After two updates the
    critic's greedy logprobs are those of before, the solver's and the policy's adapters
    (and what the engine serves for them) moved, the base weights did not, and every
    call recorded its role."""
    from tether.engine import SamplingParams
    from tether.models import load_model

    cfg = small_run(
        tmp_path,
        "adapters",
        "tests.test_run_roles:plan_solve_check",
        train_size=8,
        concurrency=8,
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=2, lr=5e-3, advantage="dr_grpo", lora=LoraConfig(r=4, alpha=8)),
        eval=EvalConfig(enabled=False),
        roles={"solver": RoleConfig(adapter=True), "critic": RoleConfig(train=False)},
    )
    prompt = list(range(40, 72))

    async def probe(run: TrainingRun, role: str | None) -> list[float]:
        adapter = cfg.gateway.role_adapters.get(role or "")  # what the gateway gives the engine
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, adapter=adapter)
        return (await run.engine.generate(prompt, params)).completions[0].logprobs

    async def go() -> tuple[TrainingRun, dict[str, Any]]:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            before = {r: await probe(run, r) for r in ("critic", "solver", None)}
            weights = run.trainer.adapters_state_dict()
            await run.train()
            after = {r: await probe(run, r) for r in ("critic", "solver", None)}
        return run, {"before": before, "after": after, "weights": weights}

    run, seen = asyncio.run(go())
    assert cfg.gateway.role_adapters == {"solver": "solver", "critic": "base"}
    assert run.engine.policy_version == 2
    assert [h.metrics["samples_frozen"] for h in run.history] == [4.0, 4.0]
    # each call was served by the adapter that the trainer recomputes it with
    assert all(h.metrics["logprob_gap"] < 1e-4 for h in run.history)
    critic_gap = max(
        abs(a - b) for a, b in zip(seen["before"]["critic"], seen["after"]["critic"], strict=True)
    )
    assert critic_gap < 1e-6  # frozen: served by the unchanged base weights
    for role in ("solver", None):  # the engine serves the updates
        assert seen["before"][role] != seen["after"][role], role
    now, start = run.trainer.adapters_state_dict(), seen["weights"]
    for name in ("solver", "default"):
        assert any(not torch.equal(now[name][k], v) for k, v in start[name].items()), name
    base = load_model(starter_dir).state_dict()
    model: Any = run.trainer.model
    for k, v in model.get_base_model().state_dict().items():
        if "lora_" not in k:
            assert torch.equal(v, base[k.replace(".base_layer", "")]), k
    with Store(tmp_path / "adapters" / "traces.sqlite") as store:
        roles = [[c.role for c in store.calls(r.id)] for r in store.list_rollouts()]
    assert roles == [[None, "solver", "critic"]] * 8

    # --resume: every adapter and the policy version come back; the engine serves them
    more = dataclasses.replace(cfg, resume=True, trainer=dataclasses.replace(cfg.trainer, steps=3))

    async def resumed() -> tuple[TrainingRun, dict[Any, list[float]]]:
        async with TrainingRun(more, model_path=starter_dir) as run:
            back = {r: await probe(run, r) for r in ("critic", "solver", None)}
            assert run.trainer.adapters_state_dict().keys() == now.keys()
            for name, weights in run.trainer.adapters_state_dict().items():
                assert all(torch.equal(weights[k], v) for k, v in now[name].items()), name
            await run.train()
        return run, back

    again, back = asyncio.run(resumed())
    for role in ("critic", "solver", None):
        gap = max(abs(a - b) for a, b in zip(back[role], seen["after"][role], strict=True))
        assert gap < 1e-6, role
    assert again.engine.policy_version == 3 and again.history[-1].metrics["samples_frozen"] == 4
