"""A short real run with GiGPO's grouping (``trainer.credit: turn``,
``trainer.turn_grouping: state``): each update trains the advantages the trainer's
``assign_credit`` gives the stored rollouts (and they are the loop reference's), its
metrics are theirs, and ``tether export``, ``tether export --samples`` and the dashboard
show the same advantages."""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_stores import KEY, get_all, group_advantages, rollout_advantage
from tests.helpers import small_run
from tests.test_credit_state import ref_state_credit
from tether.dashboard import Catalog, create_server_app
from tether.records import Rollout
from tether.run import RolloutConfig, TrainerConfig, TrainingRun
from tether.store import Store
from tether.tracking import export_attempts, step_samples
from tether.trainer import Credit, PolicyTrainer, RolloutRewards, assign_credit, build_samples

GAMMA, WEIGHT = 0.9, 0.5
_asked: collections.Counter[str] = collections.Counter()
_graded: collections.Counter[str] = collections.Counter()


async def recurring_states(task: dict[str, Any], client: Any) -> str:
    """States that recur within a group, at different turn indices: the question; every
    second rollout of a task then a check (a detour); then one follow-up for all, a new
    conversation whatever was answered before, so some rollouts reach it at their second
    call and the others at their third."""
    from tether.starter.calc import SYSTEM_PROMPT

    async def ask(text: str) -> str:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        return r.choices[0].message.content or ""

    question = task["question"]
    _asked[question] += 1
    detour = _asked[question] % 2 == 0  # counted before the first await: rollouts run at once
    await ask(question)
    if detour:
        await ask(f"Check the arithmetic of: {question}")
    return await ask(f"Say only the number: {question}")


def rewards_and_a_first_call_reward(task: dict, answer: str | None) -> dict:
    """Final rewards 0, 1, 0, 1, ... per task, and intermediate rewards on the first call
    that differ from the final ones."""
    n = _graded[task["id"]]
    _graded[task["id"]] += 1
    return {"reward": float(n % 2), "turn_rewards": {"0": 0.25 * (n % 3)}}


@dataclass
class StateRun:
    root: Path  # the runs folder: the store is root/state/traces.sqlite
    run: TrainingRun
    trained: list[list[Any]]  # what PolicyTrainer.update was given, per update


@pytest.fixture(scope="module")
def state_run(starter_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> StateRun:
    """Two sync updates of the starter model, 2 groups of 4 rollouts each."""
    root = tmp_path_factory.mktemp("state-run")
    trained: list[list[Any]] = []
    update = PolicyTrainer.update

    def spy(self: PolicyTrainer, samples: list[Any]) -> dict[str, float]:
        trained.append(list(samples))
        return update(self, samples)

    cfg = small_run(
        root,
        "state",
        "tests.test_run_credit_state:recurring_states",
        concurrency=8,
        rollout=RolloutConfig(
            n=4,
            batch_groups=2,
            grader="tests.test_run_credit_state:rewards_and_a_first_call_reward",
        ),
        trainer=TrainerConfig(
            steps=2, lr=1e-3, credit="turn", gamma=GAMMA, turn_grouping="state", state_weight=WEIGHT
        ),
    )

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PolicyTrainer, "update", spy)
        run = asyncio.run(go())
    return StateRun(root, run, trained)


def _store(s: StateRun) -> Store:
    return Store(s.root / "state" / "traces.sqlite")


Update = tuple[list[list[Rollout]], list[list[RolloutRewards]], Credit]


def _update(store: Store, run_id: str, step: int) -> Update:
    """Update ``step``'s groups as stored (``{run}-s{step}-g{k}``, rollouts ``{group}-{i}``),
    what credit needs of them, and the trainer's credit of them under the run's settings."""
    prefix = f"{run_id}-s{step}-g"
    groups: dict[int, list[Rollout]] = collections.defaultdict(list)
    for r in store.list_rollouts(run_id=run_id):
        if r.group_id and r.group_id.startswith(prefix):
            groups[int(r.group_id[len(prefix) :])].append(r)
    ordered = [sorted(groups[g], key=lambda r: int(r.id.rsplit("-", 1)[1])) for g in sorted(groups)]
    rewards = [[_rewards(store, r) for r in g] for g in ordered]
    return ordered, rewards, assign_credit(rewards, "grpo", "turn", GAMMA, "state", WEIGHT)


def _rewards(store: Store, r: Rollout) -> RolloutRewards:
    assert r.reward is not None
    return RolloutRewards.of(
        r.reward, store.calls(r.id, attempt=r.attempt), store.rewards(r.id), r.attempt
    )


def test_a_state_grouped_run_trains_the_trainers_advantages(state_run: StateRun) -> None:
    """Both updates train; each trained exactly the samples of the state-grouped credit of
    its stored rollouts (not the turn-index one), which is the loop reference's; the step's
    zero-variance groups and mean advantage are that credit's; a state recurs at two turn
    indices within a group, so the comparison across indices was made."""
    run = state_run.run
    assert run.engine.policy_version == 2 and len(state_run.trained) == 2
    across: list[bool] = []
    with _store(state_run) as store:
        for report, trained in zip(run.history, state_run.trained, strict=True):
            m = report.metrics
            assert m["groups_dropped"] == 0 and math.isfinite(m["loss"])
            groups, rewards, credit = _update(store, run.run_record.id, report.step)
            ref = ref_state_credit(rewards, "grpo", GAMMA, WEIGHT)
            for got, want in zip(credit.advantages, ref, strict=True):
                assert isinstance(got, dict) and got == pytest.approx(want, abs=1e-9)
            calls = [store.calls(r.id, attempt=r.attempt) for g in groups for r in g]
            assert build_samples(calls, credit.advantages)[0] == trained
            index = assign_credit(rewards, "grpo", "turn", GAMMA).advantages
            assert build_samples(calls, index)[0] != trained
            assert m["zero_variance_groups"] == credit.zero_variance_groups
            tokens = [a for s in trained for a in s.completion_advantages()]
            assert m["adv_mean"] == pytest.approx(sum(tokens) / len(tokens))
            for group in rewards:
                seqs: dict[Any, set[int]] = collections.defaultdict(set)
                for r in group:
                    for seq in range(r.num_turns):
                        seqs[r.prompt_of(seq)].add(seq)
                across.append(any(len(s) > 1 for s in seqs.values()))
    assert any(across), "no state was reached at two turn indices"


def test_export_and_the_dashboard_show_what_the_state_grouped_updates_trained(
    state_run: StateRun,
) -> None:
    """``tether export --samples`` rebuilds each update's samples; ``tether export`` and the
    dashboard's rollouts and rollout pages show each trained rollout's per-call advantages
    as the update's credit gave them."""
    run_id = state_run.run.run_record.id
    expected: dict[str, float | dict[int, float]] = {}
    with _store(state_run) as store:
        for step, trained in enumerate(state_run.trained, start=1):
            assert step_samples(store, step).samples == trained
            groups, _, credit = _update(store, run_id, step)
            flat = [r.id for g in groups for r in g]
            expected.update(zip(flat, credit.advantages, strict=True))
        rows = {row["rollout_id"]: row for row in export_attempts(store) if row["kind"] == "train"}
    assert rows.keys() == expected.keys()
    for rid, adv in expected.items():
        assert {c["seq"]: c["advantage"] for c in rows[rid]["calls"]} == adv
    app = create_server_app(Catalog(runs_dir=state_run.root), KEY)
    table, *pages = get_all(
        app, [f"/ui/s/state/run/{run_id}/rollouts"] + [f"/ui/s/state/rollout/{r}" for r in expected]
    )
    table_shows = group_advantages(table.text)
    assert table_shows.keys() == expected.keys()
    for (rid, adv), page in zip(expected.items(), pages, strict=True):  # 3 significant digits
        assert table_shows[rid] == pytest.approx(adv, rel=1e-2, abs=1e-9), rid
        assert rollout_advantage(page.text) == pytest.approx(adv, rel=1e-2, abs=1e-9), rid
