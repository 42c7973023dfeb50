"""What an update learns from under each credit option (``tether/run/_learn.py``):
``trajectory`` stays exactly the update tether made before; ``turn`` and
``rollout.filter_groups`` change which advantages and groups it trains."""

from __future__ import annotations

import asyncio
import collections
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dashboard_stores import KEY, get_all, update_row
from tests.helpers import GroupFates, small_run
from tether.dashboard import Catalog, create_server_app
from tether.errors import UserError
from tether.records import Call, GroupFate, RolloutStatus, Split, Task, UpdateRecord
from tether.run import (
    EvalConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    TrainerConfig,
    TrainingRun,
)
from tether.run._async import AsyncPolicy, AsyncRollouts, Group
from tether.run._collect import Collected, RolloutOutcome
from tether.run._filter_groups import collect_with_signal
from tether.run._learn import Learning, learn_metrics
from tether.run._tasks import load_tasks, tasks_for_step
from tether.store import Store
from tether.tracking import export_attempts, step_samples
from tether.trainer import PolicyTrainer
from tether.trainer.algorithms import aggregate, compute_advantages, ppo_clip_loss
from tether.trainer.samples import build_samples, collate

# --------------------------------------------------------------------------- the update's input


def _outcome(rid: str, group: int, reward: float, calls: list[Call], turns: dict | None = None):
    return RolloutOutcome(
        rid, group, RolloutStatus.SUCCEEDED, reward, calls, turn_rewards=turns or {}
    )


def _groups(seed: int = 0) -> list[list[RolloutOutcome]]:
    """Three groups of three multi-call rollouts: merged calls, forks, a flat group."""
    rng = random.Random(seed)
    groups = []
    for g in range(3):
        group = []
        for i in range(3):
            rid, prompt, calls = f"g{g}-{i}", [1, 2, 3 + g], []
            for seq in range(rng.randint(1, 3)):
                completion = [rng.randint(10, 99) for _ in range(rng.randint(1, 4))]
                if seq == 2:  # a sub-agent's call: its own prompt, a new segment
                    prompt = [7, 7, seq]
                calls.append(
                    Call(rid, seq, list(prompt), completion, [-rng.random()] * len(completion), 0)
                )
                prompt = prompt + completion + [5]  # the tool result
            reward = 1.0 if g == 2 else float(rng.random() < 0.5) + i * 0.1
            turns = {0: rng.choice([0.0, 0.5])} if g == 1 else {}
            group.append(_outcome(rid, g, reward, calls, turns))
        groups.append(group)
    return groups


def test_trajectory_credit_is_the_update_tether_always_made() -> None:
    """The new path (learn_metrics with credit=trajectory, intermediate rewards present and
    ignored) gives the very samples, advantages and batch tensors of the old code path."""
    groups = _groups()
    kept = [g for g in groups if all(o.usable for o in g)]
    rewards = torch.tensor([[o.reward for o in g] for g in kept], dtype=torch.float64)
    before = compute_advantages(rewards, "grpo")  # what _learn.py did, line for line
    old, _ = build_samples([o.calls for g in kept for o in g], before.advantages.flatten().tolist())
    metrics, new, _ = learn_metrics(groups, Learning("grpo", "trajectory"))
    assert new == old and all(s.token_advantages is None for s in new)
    assert metrics["zero_variance_groups"] == before.zero_variance_groups == 1
    for key, value in collate(old).items():
        assert torch.equal(collate(new)[key], value), key
    # and so the loss: the same per-token loss and aggregate, to the bit
    losses = []
    for samples in (old, new):
        batch = collate(samples)
        logprobs = batch["old_logprobs"] + 0.01 * batch["loss_mask"]  # a moved policy
        per_token, _ = ppo_clip_loss(
            logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"]
        )
        rollout = batch["rollout_index"]
        losses.append(
            aggregate(per_token, batch["loss_mask"], "rollout_mean", rollout_index=rollout)
        )
    assert torch.equal(losses[0], losses[1]) and losses[0].item() != 0
    assert learn_metrics(groups, "grpo")[:2] == (metrics, new)  # the estimator's name alone


def test_turn_credit_drops_rollouts_with_an_unusable_intermediate_reward() -> None:
    groups = _groups()
    groups[0][1].turn_rewards = {0: float("nan")}
    traj, _, _ = learn_metrics(groups, Learning("grpo", "trajectory"))
    turn, samples, _ = learn_metrics(groups, Learning("grpo", "turn"))
    assert traj["groups_dropped"] == 0 and turn["groups_dropped"] == 1
    assert {s.rollout_index for s in samples} <= set(range(6)) and samples
    assert all(s.token_advantages is not None for s in samples)


def test_filter_groups_trains_the_first_groups_with_signal() -> None:
    groups = _groups()  # group 2: every reward 1.0, no signal
    m, samples, fates = learn_metrics(groups, Learning("grpo", signal_only=1))
    assert (m["groups_no_signal"], m["groups_surplus"], m["groups_kept"]) == (1.0, 1.0, 1.0)
    assert {s.rollout_index for s in samples} == {0, 1, 2}  # group 0's rollouts only
    assert m["zero_variance_groups"] == 0.0
    # each group's fate, as the update records it; the kept group's advantages trained
    kinds = [GroupFate.KEPT, GroupFate.SURPLUS, GroupFate.NO_SIGNAL]
    assert [(u.group, u.fate) for u in fates] == list(enumerate(kinds))
    assert fates[0].rollouts == ("g0-0", "g0-1", "g0-2") and fates[2].advantages is None
    assert sorted({s.advantage for s in samples}) == sorted(set(fates[0].advantages or ()))


# --------------------------------------------------------------------------- filter_groups


def _scripted_collect(signal: list[bool], asked: list[tuple[int, int]]):
    """A stand-in for collect_groups: group g carries signal when ``signal[g]``."""

    async def collect(tasks: list[Task], first_group: int) -> Collected:
        asked.append((len(tasks), first_group))
        outcomes = []
        for g in range(first_group, first_group + len(tasks)):
            for i, reward in enumerate([0.0, 1.0] if signal[g] else [1.0, 1.0]):
                calls = [Call(f"g{g}-{i}", 0, [1, g], [3, 4], [-0.5, -0.5], 0)]
                outcomes.append(_outcome(f"g{g}-{i}", g, reward, calls))
        return Collected(outcomes, 0.0, 2 * len(outcomes))

    return collect


def _tasks(k: int) -> list[Task]:
    return [Task(id=f"t{i}", data={}, split=Split.TRAIN) for i in range(k)]


async def test_filter_groups_samples_more_in_proportion_to_the_signal_seen() -> None:
    """Batch 4, one group with signal: the next round asks for the 3 missing ÷ 1/4, within
    the budget of 3 × 4 groups; the update then trains the first 4 groups with signal."""
    signal = [False, True, False, False] + [True, False] * 4
    asked: list[tuple[int, int]] = []
    how = Learning("grpo", signal_only=4)
    groups, m = await collect_with_signal(
        _scripted_collect(signal, asked), _tasks(4), lambda r, k: _tasks(k), how, 3
    )
    assert asked == [(4, 0), (8, 4)]  # ceil(3 × 4 / 1) = 12, capped at 12 − 4
    assert len(groups) == 12 and [g[0].group for g in groups] == list(range(12))
    assert m == {
        "groups_sampled": 12.0,
        "groups_extra": 8.0,
        "rollouts_extra": 16.0,
        "filter_rounds": 1.0,
        "completion_tokens": 48.0,
    }
    learned, samples, _ = learn_metrics(groups, how)
    assert (learned["groups_kept"], learned["groups_no_signal"]) == (4.0, 7.0)
    assert learned["groups_surplus"] == 1.0  # 5 with signal, 4 trained
    assert sorted({s.input_ids[1] for s in samples}) == [1, 4, 6, 8]  # their groups


async def test_filter_groups_stops_at_the_budget_and_when_the_batch_is_full() -> None:
    asked: list[tuple[int, int]] = []
    how = Learning("grpo", signal_only=2)
    none = _scripted_collect([False] * 10, asked)
    groups, m = await collect_with_signal(none, _tasks(2), lambda r, k: _tasks(k), how, 2)
    assert asked == [(2, 0), (2, 2)] and m["groups_sampled"] == 4.0  # one batch more, no signal
    assert learn_metrics(groups, how)[1] == []  # nothing to learn from: no update
    asked.clear()
    full = _scripted_collect([True] * 4, asked)
    _, m = await collect_with_signal(full, _tasks(2), lambda r, k: _tasks(k), how, 3)
    assert asked == [(2, 0)] and m["groups_extra"] == 0.0 and m["filter_rounds"] == 0.0


def test_filter_and_credit_settings_are_checked() -> None:
    TrainConfig(rollout=RolloutConfig(filter_groups=True), run=RunConfig(mode="async"))
    with pytest.raises(UserError, match=r"rollout\.max_oversample \(0\) must be >= 1"):
        RolloutConfig(max_oversample=0)
    with pytest.raises(UserError, match=r"trainer\.gamma \(1\.5\) must be in \[0, 1\]"):
        TrainerConfig(gamma=1.5)
    with pytest.raises(UserError, match=r"trainer\.credit \('step'\) must be"):
        TrainerConfig(credit="step")  # type: ignore[arg-type]


_graded: collections.Counter[str] = collections.Counter()
_flat: set[str] = set()  # the tasks whose rewards are all equal


def some_tasks_teach(task: dict, answer: str | None) -> dict:
    """Rewards 0, 1, 0, ... per task (signal), but always 0.5 for the tasks in ``_flat``;
    every grade gives the first call an intermediate reward of 0.25."""
    n = _graded[task["id"]]
    _graded[task["id"]] += 1
    return {"reward": 0.5 if task["id"] in _flat else float(n % 2), "turn_rewards": {"0": 0.25}}


def test_a_turn_credit_run_with_filter_groups(
    starter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sync updates of the starter model with trainer.credit=turn and
    rollout.filter_groups: the groups without signal are replaced, the update trains only
    groups with signal, the grader's intermediate rewards are stored as the grader's, and
    `tether export --samples` rebuilds exactly the samples each update trained on."""
    trained: list[list[Any]] = []
    update = PolicyTrainer.update

    def spy(self: PolicyTrainer, samples: list[Any]) -> dict[str, float]:
        trained.append(list(samples))
        return update(self, samples)

    monkeypatch.setattr(PolicyTrainer, "update", spy)
    cfg = small_run(
        tmp_path,
        "credit",
        "tests.test_async:short_calc_agent",
        train_size=20,
        concurrency=16,
        rollout=RolloutConfig(
            n=2,
            batch_groups=2,
            grader="tests.test_run_credit:some_tasks_teach",
            filter_groups=True,
            max_oversample=4,
        ),
        trainer=TrainerConfig(steps=2, lr=1e-3, credit="turn", gamma=0.9),
        eval=EvalConfig(enabled=False),
    )

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    train, _ = load_tasks(cfg.tasks)
    _flat.update(t.id for t in tasks_for_step(train, 1, 2, cfg.tasks.seed))  # step 1's batch
    run = asyncio.run(go())
    with Store(tmp_path / "credit" / "traces.sqlite") as store:
        rollouts = store.list_rollouts(run_id=run.run_record.id)
        stored = {m.name: m.value for m in store.metrics(run.run_record.id) if m.step == 1}
        rewards = [w for r in rollouts for w in store.rewards(r.id) if w.call_seq is not None]
        rebuilt = [step_samples(store, step).samples for step in (1, 2)]
        rows = [row for row in export_attempts(store) if row["kind"] == "train"]
        updates = store.updates(run.run_record.id)
    assert rebuilt == trained and all(s.token_advantages for b in trained for s in b)
    # Each update's record: every group sampled, kept or dropped and why, as the run did.
    by_id = {r.id: r for r in rollouts}
    assert [(u.step, u.version) for u in updates] == [(1, 1), (2, 2)]
    for u, report in zip(updates, run.history, strict=True):
        m = report.metrics
        assert u.credit["credit"] == "turn" and u.credit["signal_only"] == 2
        assert [g.group for g in u.groups] == list(range(int(m["groups_sampled"])))
        for fate, name in [("kept", "groups_kept"), ("no_signal", "groups_no_signal")]:
            assert sum(g.fate.value == fate for g in u.groups) == m[name], (u.step, fate)
        for g in u.groups:
            assert {by_id[i].place.group for i in g.rollouts} == {g.group}  # type: ignore[union-attr]
            finals = {by_id[i].reward for i in g.rollouts}
            assert (len(finals) == 1) == (g.fate.value == "no_signal")  # the flat tasks
            assert (g.advantages is not None) == (g.fate.value == "kept")
    shows_updates(tmp_path, "credit", run.run_record.id, updates)
    credited = [row for row in rows if row["calls"][0]["advantage"] is not None]
    assert len(credited) == 2 * sum(r.metrics["groups_kept"] for r in run.history)
    assert all(row["advantage"] is None for row in rows)  # per call with turn credit
    extra = 0
    for report in run.history:
        m = report.metrics
        sampled = int(m["groups_sampled"])
        assert 2 <= sampled <= 8 and m["rollouts_extra"] == 2 * (sampled - 2)
        assert m["groups_kept"] + m["groups_no_signal"] + m["groups_surplus"] == sampled
        assert m["rollouts"] == 2 * sampled and m["zero_variance_groups"] == 0
        extra += int(m["groups_extra"])
    assert run.history[0].metrics["groups_no_signal"] >= 2 and extra >= 2  # step 1's batch
    assert len(rollouts) == sum(2 * r.metrics["groups_sampled"] for r in run.history)
    assert run.engine.policy_version == 2  # both updates trained
    assert stored["groups_kept"] == run.history[0].metrics["groups_kept"]  # in the store
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "credit" / "tensorboard"))
    events.Reload()
    for name in ("groups_kept", "groups_no_signal", "rollouts_extra"):  # and in TensorBoard
        got = [e.value for e in events.Scalars(f"train/{name}")]
        assert got == [r.metrics[name] for r in run.history], name
    assert rewards and {(w.call_seq, w.value, w.source.value) for w in rewards} == {
        (0, 0.25, "grader")
    }


# --------------------------------------------------------------------------- segments


async def reset_and_sub_agent(task: dict[str, Any], client: Any) -> str:
    """A call, a sub-agent's call with its own system prompt, then the main agent resets its
    context to a summary: three calls, none extending another, so three segments."""
    from tether.starter.calc import SYSTEM_PROMPT

    def user(text: str, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]

    async def ask(messages: list[dict[str, str]]) -> str:
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        return r.choices[0].message.content or ""

    first = await ask(user(task["question"]))
    checked = await ask(user(f"check: {first[:40]}", system="You check answers."))
    return await ask(user(f"Summary so far: {checked[:40]}"))


def test_a_run_whose_agent_resets_its_context_and_calls_a_sub_agent(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Every rollout is cut into three segments, each trained as its own sample with the
    rollout's advantage, the loss weighing each rollout once (rollout_mean); the step
    says how many rollouts forked."""
    cfg = small_run(
        tmp_path,
        "segments",
        "tests.test_run_credit:reset_and_sub_agent",
        train_size=8,
        concurrency=8,
        rollout=RolloutConfig(n=2, batch_groups=2, grader="tests.helpers:alternating_grader"),
        trainer=TrainerConfig(steps=1, lr=1e-3, aggregation="rollout_mean"),
        eval=EvalConfig(enabled=False),
    )

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    run = asyncio.run(go())
    m = run.history[0].metrics
    assert (m["rollouts_forked"], m["rollouts_one_sample"], m["merge_fraction"]) == (4, 0, 0)
    assert run.engine.policy_version == 1 and math.isfinite(m["loss"])
    with Store(tmp_path / "segments" / "traces.sqlite") as store:
        samples = step_samples(store, 1).samples
    assert [s.call_seqs for s in samples] == [[0], [1], [2]] * 4


# --------------------------------------------------------------------------- async filter


def _ready(rewards: list[list[float]]) -> collections.deque[Group]:
    return collections.deque(
        Group(i, f"g{i}", [_rewarded(r, i) for r in group]) for i, group in enumerate(rewards)
    )


def _rewarded(reward: float, group: int = 0) -> RolloutOutcome:
    return RolloutOutcome("r", group, RolloutStatus.SUCCEEDED, reward)


def test_async_filter_drops_flat_ready_groups_within_the_budget() -> None:
    """Async rollout.filter_groups: finished groups without signal leave the ready queue
    (in the order seen) until the update's budget of max_flat is spent; groups with signal
    keep their order; the step resets the budget."""
    scheduler = AsyncRollouts.__new__(AsyncRollouts)  # the queue logic only, no gateway

    def has_signal(outcomes: list[RolloutOutcome]) -> bool:
        return len({o.reward for o in outcomes}) > 1

    scheduler.policy = AsyncPolicy(1, 1, 0, "reweight", signal=has_signal, max_flat=2)
    scheduler._flat_this_step = 0
    scheduler.counts, scheduler.watch = collections.Counter(), (fates := GroupFates())
    scheduler._dropped = []
    scheduler.ready = _ready([[1, 1], [0, 1], [0.5, 0.5], [0, 0], [1, 0]])
    scheduler._drop_flat()
    assert [g.index for g in scheduler.ready] == [1, 3, 4]  # the third flat one: no budget
    assert [g.index for g in fates.dropped_no_signal] == [0, 2]
    assert scheduler._flat_this_step == 2 == scheduler.counts["dropped_no_signal"]
    assert [(u.group, u.fate) for u in scheduler._dropped] == [  # for the update's record
        (0, GroupFate.NO_SIGNAL), (2, GroupFate.NO_SIGNAL),
    ]  # fmt: skip


def test_an_async_run_with_filter_groups_trains_only_groups_with_signal(
    starter_dir: Path, tmp_path: Path
) -> None:
    """Two async updates of the starter model with rollout.filter_groups, where the first
    three groups' tasks always get the same reward: they are dropped as they finish (at
    least one of them before step 2's batch can form, since only 4 groups run at once),
    every trained group has signal, and the step's metrics count the drops."""
    cfg = small_run(
        tmp_path,
        "async-filter",
        "tests.test_async:short_calc_agent",
        train_size=40,
        concurrency=16,
        rollout=RolloutConfig(
            n=2, batch_groups=2, grader="tests.test_run_credit:some_tasks_teach",
            filter_groups=True, max_oversample=3,
        ),
        trainer=TrainerConfig(steps=2, lr=1e-3),
        run=RunConfig(mode="async", max_groups_in_flight=4),
        eval=EvalConfig(enabled=False),
    )  # fmt: skip
    train, _ = load_tasks(cfg.tasks)
    first = [tasks_for_step(train, i + 1, 1, cfg.tasks.seed)[0].id for i in range(3)]
    _flat.update(first)

    fates = GroupFates()

    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            run._async_rollouts().watch = fates
            await run.train()
        return run

    run = asyncio.run(go())
    assert run.engine.policy_version == 2
    assert fates.dropped_no_signal, "no group without signal was dropped"
    for g in fates.dropped_no_signal:
        assert len({o.reward for o in g.outcomes}) == 1
    for batch in fates.trained:
        assert all(len({o.reward for o in g.outcomes}) > 1 for g in batch)
    dropped = sum(r.metrics["groups_extra"] for r in run.history)
    assert dropped == len(fates.dropped_no_signal)
    assert sum(r.metrics["rollouts_extra"] for r in run.history) == 2 * dropped
    assert all(r.metrics["groups_kept"] == 2 for r in run.history)
    # Each update's record says which groups it trained and which were dropped before it.
    with Store(tmp_path / "async-filter" / "traces.sqlite") as store:
        updates = store.updates(run.run_record.id)
        place = {r.id: r.place for r in store.list_rollouts(run_id=run.run_record.id)}
    assert [(u.step, u.version) for u in updates] == [(1, 1), (2, 2)]
    for u, batch in zip(updates, fates.trained, strict=True):
        kept = [g.group for g in u.groups if g.fate is GroupFate.KEPT]
        assert kept == sorted(g.index for g in batch)
        assert all(len(g.advantages or ()) == 2 for g in u.groups if g.fate is GroupFate.KEPT)
    flat = [g for u in updates for g in u.groups if g.fate is GroupFate.NO_SIGNAL]
    assert sorted(g.group for g in flat) == sorted(g.index for g in fates.dropped_no_signal)
    for g in (g for u in updates for g in u.groups):
        assert all(place[i].group == g.group for i in g.rollouts)  # type: ignore[union-attr]
    shows_updates(tmp_path, "async-filter", run.run_record.id, updates)


def shows_updates(runs: Path, name: str, run_id: str, updates: list[UpdateRecord]) -> None:
    """The dashboard's run page shows each update's trained groups and its dropped ones,
    each with why, as recorded."""
    app = create_server_app(Catalog(runs_dir=runs), KEY)
    (page,) = get_all(app, [f"/ui/s/{name}/run/{run_id}"])
    for u in updates:
        kept, dropped = update_row(page.text, u.step)
        assert kept == " · ".join(f"g{g.group}" for g in u.kept())
        gone = [g for g in u.groups if g.fate is not GroupFate.KEPT]
        shown = dropped.split("; ") if dropped else []
        assert [x.split(":")[0] for x in shown] == [f"g{g.group}" for g in gone]
        for text, g in zip(shown, gone, strict=True):
            assert _WHY[g.fate] in text, (text, g.fate)


#: A word of why the dashboard says a group was dropped.
_WHY = {
    GroupFate.NO_SIGNAL: "no signal",
    GroupFate.UNUSABLE: "no usable reward",
    GroupFate.SURPLUS: "batch was full",
    GroupFate.LAG: "too old",
}
