"""``rollout.grader: judge``: a judge model scores each group's rollouts against each other
(tether/run/_judge.py), tested against a scripted fake judge (tests/scripted_judge.py), a
real HTTP server, and against tether's own record mode."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.helpers import small_run
from tether.configio import load_config
from tether.errors import UserError
from tether.records import RolloutStatus
from tether.run import (
    EvalConfig,
    JudgeConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    TrainerConfig,
    TrainingRun,
)
from tether.run._grading import Candidate, is_success
from tether.run._judge import Judge, JudgeFailed, open_grader, parse_scores, response_schema
from tether.run._paths import resolve_file_paths
from tether.store import Store
from tether.trainer.errors import GraderFailing

from .scripted_judge import ScriptedJudge, candidates, scoring

TASK = {"question": "2 + 3", "grader": {"answer": 5}}


def _judge(base_url: str, **kw: Any) -> Judge:
    return Judge(JudgeConfig(base_url=base_url, model="scripted-judge", retries=0, **kw))


def by_length(task: dict, answer: str) -> float:
    """A score that differs between answers: longer is better, capped at 1."""
    return min(len(answer) / 40, 1.0)


# --------------------------------------------------------------------------- the answer


def test_a_well_formed_answer_parses_to_scores() -> None:
    text = json.dumps(
        {"1": {"explanation": "right", "score": 1}, "2": {"explanation": "x", "score": 0.25}}
    )
    scores = parse_scores(text, 2)
    assert {k: s.score for k, s in scores.items()} == {"1": 1.0, "2": 0.25}
    fenced = f"```json\n{text}\n```"  # a judge that wraps its JSON in a code fence
    assert parse_scores(fenced, 2) == scores


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("I think candidate 1 is best.", "not JSON"),
        ("[0.5, 0.5]", "a JSON list, not an object"),
        ('{"1": {"explanation": "a", "score": 0.5}}', "no score for candidate 2"),
        (
            '{"1": {"explanation": "a", "score": 0.5}, "2": {"explanation": "b", "score": 1},'
            ' "3": {"explanation": "c", "score": 0}}',
            "unknown candidate 3",
        ),
        (
            '{"1": {"explanation": "a", "score": 1.5}, "2": {"explanation": "b", "score": 0}}',
            "1's score",
        ),
        (
            '{"1": {"explanation": "a", "score": true}, "2": {"explanation": "b", "score": 0}}',
            "1's score",
        ),
        (
            '{"1": {"explanation": "a", "score": "0.5"}, "2": {"explanation": "b", "score": 0}}',
            "1's score",
        ),
        ('{"1": {"score": 0.5}, "2": {"explanation": "b", "score": 0}}', "explanation"),
    ],
)
def test_an_unusable_answer_is_refused_with_one_line(text: str, said: str) -> None:
    with pytest.raises(JudgeFailed, match=said) as e:
        parse_scores(text, 2)
    assert "\n" not in str(e.value)


def _answer(*verdicts: tuple[str, Any]) -> str:
    return json.dumps(
        {str(k): {"explanation": e, "score": v} for k, (e, v) in enumerate(verdicts, 1)}
    )


def test_a_long_explanation_is_cut_and_marked_but_a_bad_score_still_fails() -> None:
    scores = parse_scores(_answer(("x" * 650, 1), ("short", 0)), 2)
    assert scores["1"].explanation == "x" * 400 + "… [250 more characters cut]"
    assert scores["1"].score == 1.0 and scores["2"].explanation == "short"
    assert parse_scores(_answer(("x" * 400, 1), ("", 0)), 2)["1"].explanation == "x" * 400
    with pytest.raises(JudgeFailed, match="1's score"):
        parse_scores(_answer(("x" * 650, 1.5), ("ok", 0)), 2)
    schema = response_schema(2)["properties"]["1"]["properties"]["explanation"]
    assert schema["maxLength"] == 400  # constrained servers still get the bound


def test_a_talkative_judge_still_grades_its_group() -> None:
    talk = _answer(("right, because " * 60, 1), ("wrong", 0))
    with ScriptedJudge(talk) as fake:
        grades = asyncio.run(
            _judge(fake.base_url).grade_group(TASK, [Candidate("5"), Candidate("6")])
        )
    assert [g.grade.reward for g in grades] == [1.0, 0.0] and all(g.fault is None for g in grades)
    assert grades[0].detail["explanations"]["1"].endswith("more characters cut]")
    assert grades[0].detail["raw"] == talk  # the judge's whole answer is kept


def test_the_schema_requires_every_candidate_and_bounds_the_score() -> None:
    schema = response_schema(3)
    assert schema["required"] == ["1", "2", "3"] and schema["additionalProperties"] is False
    score = schema["properties"]["2"]["properties"]["score"]
    assert (score["minimum"], score["maximum"]) == (0, 1)


def test_the_prompt_holds_the_task_the_candidates_and_the_rubric() -> None:
    judge = Judge(JudgeConfig(base_url="http://x/v1", model="m", rubric="Prefer exact sums."))
    system, user = judge.messages(TASK, [Candidate("5"), Candidate(None)])
    assert "Prefer exact sums." in system["content"] and '"1" to "2"' in system["content"]
    task, found = candidates({"messages": [system, user]})
    assert task == TASK and found == {"1": "5", "2": "(no final answer)"}


# --------------------------------------------------------------------------- the config


def test_grader_judge_without_an_endpoint_or_model_is_one_line() -> None:
    with pytest.raises(UserError, match=r"needs rollout\.judge\.base_url; set it, e\.g\."):
        RolloutConfig(grader="judge")
    with pytest.raises(UserError, match=r"needs rollout\.judge\.model"):
        RolloutConfig(grader="judge", judge=JudgeConfig(base_url="http://x/v1"))
    with pytest.raises(UserError, match="both set: keep one"):
        JudgeConfig(rubric="a", rubric_file="r.txt")
    with pytest.raises(UserError, match=r"rollout\.judge\.retries \(-1\) must be >= 0"):
        JudgeConfig(retries=-1)


def test_a_judge_counts_success_from_half_a_point_unless_told() -> None:
    judge = JudgeConfig(base_url="http://x/v1", model="m")
    assert RolloutConfig(grader="judge", judge=judge).success_threshold == 0.5
    told = RolloutConfig(grader="judge", judge=judge, success_threshold=0.8)
    assert told.success_threshold == 0.8
    assert RolloutConfig().success_threshold is None  # other graders: reward > 0
    # what a run sees: the config loaded from YAML with overrides
    cfg = load_config(TrainConfig, None, ["rollout.grader=judge", "rollout.judge.base_url=http://x/v1",
                             "rollout.judge.model=m"])  # fmt: skip
    assert cfg.rollout.success_threshold == 0.5
    assert not is_success(0.3, None, cfg.rollout.success_threshold)


def test_the_rubric_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "rubric.txt").write_text("Be strict.\n")
    data = resolve_file_paths({"rollout": {"judge": {"rubric_file": "rubric.txt"}}}, tmp_path)
    judge = Judge(JudgeConfig(**data["rollout"]["judge"]))
    assert judge.rubric == "Be strict."
    with pytest.raises(UserError, match=r"rubric_file .* cannot be read"):
        Judge(JudgeConfig(rubric_file=str(tmp_path / "missing.txt")))


def test_an_unreachable_judge_or_a_missing_key_stops_the_start(monkeypatch) -> None:
    from tests.helpers import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    rollout = RolloutConfig(grader="judge", judge=JudgeConfig(base_url=url, model="m"))
    with pytest.raises(UserError, match=r"rollout\.judge\.base_url .* is unreachable"):
        asyncio.run(open_grader(rollout))
    monkeypatch.delenv("TETHER_TEST_JUDGE_KEY", raising=False)
    rollout.judge.api_key_env = "TETHER_TEST_JUDGE_KEY"
    with pytest.raises(UserError, match="names TETHER_TEST_JUDGE_KEY, which is not set: export"):
        asyncio.run(open_grader(rollout))


# --------------------------------------------------------------------------- one group


def test_scores_become_rewards_and_the_call_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("TETHER_TEST_JUDGE_KEY", "sk-judge-secret")
    with ScriptedJudge(scoring(by_length)) as fake:
        judge = _judge(fake.base_url, api_key_env="TETHER_TEST_JUDGE_KEY", conversation=False)
        asyncio.run(judge.check())
        answers = ["5", "the sum is 5", "two plus three makes five, which is 5 in digits!"]
        grades = asyncio.run(judge.grade_group(TASK, [Candidate(a) for a in answers]))
    (body,) = fake.requests
    assert fake.keys[-1] == "Bearer sk-judge-secret"
    assert body["model"] == "scripted-judge" and body["temperature"] == 0
    assert body["response_format"]["json_schema"]["schema"] == response_schema(3)
    rewards = [g.grade.reward for g in grades]
    assert rewards == [by_length(TASK, a) for a in answers] and rewards == sorted(rewards)
    assert all(g.fault is None for g in grades)
    detail = grades[1].detail
    assert detail["candidate"] == "2" and detail["model"] == "scripted-judge"
    assert detail["messages"] == body["messages"] and json.loads(detail["raw"])["2"]["score"]
    assert detail["scores"] == {"1": rewards[0], "2": rewards[1], "3": rewards[2]}
    assert "sk-judge-secret" not in json.dumps(detail)


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("Candidate 2 is the best, I would give it 0.9.", "not JSON"),
        ('{"1": {"explanation": "ok", "score": 0.5}}', "no score for candidate 2"),
        (503, "answered HTTP 503 after 0 retries: "),
        (400, "answered HTTP 400: "),
    ],
)
def test_a_failed_judgement_fails_every_rollout_of_the_group_with_its_text(
    script: Any, said: str
) -> None:
    with ScriptedJudge(script) as fake:
        grades = asyncio.run(
            _judge(fake.base_url).grade_group(TASK, [Candidate("5"), Candidate("6")])
        )
    for g in grades:
        assert g.grade.reward is None and g.fault is not None and g.fault.by == "judge"
        assert said in g.fault.summary and g.fault.line.startswith("the judge failed: ")
        if isinstance(script, str):
            assert script in g.fault.detail and g.detail["raw"] == script
    assert [g.detail["candidate"] for g in grades] == ["1", "2"]


def test_the_conversation_is_shown_when_asked() -> None:
    from tether.records import Call

    call = Call("r", 0, [1], [2], [-0.1], 0, request={"messages": [{"role": "user", "content": "2 + 3?"}]},
                response={"content": "5"})  # fmt: skip
    with ScriptedJudge(scoring(by_length)) as fake:
        asyncio.run(
            _judge(fake.base_url, conversation=True).grade_group(
                TASK, [Candidate("5", (call,)), Candidate("6")]
            )
        )
    _, found = candidates(fake.requests[0])
    assert (
        found["1"].startswith('conversation: [{"role": "user", "content": "2 + 3?"}')
        and found["2"] == "6"
    )


# --------------------------------------------------------------------------- a training run


def _config(tmp_path: Path, base_url: str, mode: Literal["sync", "async"] = "sync") -> TrainConfig:
    return small_run(
        tmp_path,
        "judged",
        "tests.test_async:short_calc_agent",
        train_size=20,
        concurrency=16,
        rollout=RolloutConfig(
            n=2,
            batch_groups=2,
            grader="judge",
            judge=JudgeConfig(base_url=base_url, model="scripted-judge", retries=0),
        ),
        trainer=TrainerConfig(steps=1, lr=1e-3),
        run=RunConfig(mode=mode, collapse_patience=0),
        eval=EvalConfig(enabled=False),
    )


def _train(cfg: TrainConfig, starter_dir: Path) -> TrainingRun:
    async def go() -> TrainingRun:
        async with TrainingRun(cfg, model_path=starter_dir) as run:
            await run.train()
        return run

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_trains_on_the_judges_scores_and_a_garbage_group_is_dropped(
    starter_dir: Path, tmp_path: Path, mode: Literal["sync", "async"]
) -> None:
    """Step 1 has two groups: the judge answers the first request with garbage (that
    group's rollouts: failed grades, the group dropped, not reward 0) and scores the other."""
    score = scoring(by_length)
    judge = ScriptedJudge(lambda body: "no JSON here" if len(judge.requests) == 1 else score(body))
    with judge:
        run = _train(_config(tmp_path, judge.base_url, mode=mode), starter_dir)
    m = run.history[0].metrics
    assert m["groups_dropped"] == 1 and len(judge.requests) >= 2
    with Store(tmp_path / "judged" / "traces.sqlite") as store:
        # async mode: groups still running when training ended are cancelled, never judged
        rollouts = store.list_rollouts(run_id=run.run_record.id, status=RolloutStatus.SUCCEEDED)
        attempts = {r.id: store.attempts(r.id)[-1] for r in rollouts}
    failed = [r for r in rollouts if attempts[r.id].grader_error]
    scored = [r for r in rollouts if r.reward is not None]
    assert len(failed) == 2 and all(r.reward is None for r in failed)
    assert len(scored) + len(failed) == len(rollouts) >= 4
    for r in failed:
        a = attempts[r.id]
        assert "the judge failed: the judge's answer is not JSON" in (r.error or "")
        assert "no JSON here" in (a.grader_error or "") and a.grade_detail["raw"] == "no JSON here"
    for r in scored:
        d = attempts[r.id].grade_detail
        assert d["scores"][d["candidate"]] == r.reward and math.isfinite(r.reward)
        assert by_length({}, r.final_answer or "(no final answer)") == r.reward
        assert d["messages"][1]["content"].startswith("<task>")  # filled back in when read
    # the judge's prompt is stored once per judged group, with its first candidate
    db = sqlite3.connect(tmp_path / "judged" / "traces.sqlite")
    stored = [json.loads(t) for (t,) in db.execute("SELECT grade_detail FROM attempts")
              if t is not None]  # fmt: skip
    db.close()
    holders = [d for d in stored if "messages" in d]
    assert all(d["candidate"] == "1" for d in holders) and len(holders) >= 2
    if mode == "sync":
        assert len(holders) == len(judge.requests)
    else:  # a group judged while the run ended is cancelled before its grades are stored
        assert len(holders) <= len(judge.requests)
    assert all("prompt_from" in d for d in stored if "messages" not in d)


def test_rollouts_show_prints_the_judgement(starter_dir: Path, tmp_path: Path) -> None:
    with ScriptedJudge(scoring(by_length)) as fake:
        run = _train(_config(tmp_path, fake.base_url), starter_dir)
    path = tmp_path / "judged" / "traces.sqlite"
    with Store(path) as store:
        rid = store.list_rollouts(run_id=run.run_record.id)[1].id  # its prompt: the first's
    root = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        [sys.executable, "-m", "tether.cli", "rollouts", "show", rid, "--store", str(path)],
        capture_output=True, text=True, timeout=120, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"},
    )  # fmt: skip
    text = shown.stdout
    assert shown.returncode == 0, shown.stderr
    assert "judge scripted-judge: candidate 2, score" in text and "the group: 1=" in text
    assert "judge's answer:" in text and "judge's prompt (system):" in text
    assert '<candidate id="2">' in text


def test_a_judge_failing_on_every_rollout_stops_the_run(starter_dir: Path, tmp_path: Path) -> None:
    with ScriptedJudge("nope") as fake, pytest.raises(GraderFailing) as e:
        _train(_config(tmp_path, fake.base_url), starter_dir)
    line = str(e.value)
    assert line.startswith("the judge failed: the judge's answer is not JSON") and "\n" not in line
    assert "on every rollout of step 1; check the judge (tether rollouts show" in line


# --------------------------------------------------------------------------- tether as the judge


def test_tethers_own_record_mode_serves_the_judge(
    model: Any, tokenizer: Any, tmp_path: Path
) -> None:
    """The judge is the starter model behind a tether gateway's record mode: the request is
    recorded there, and the grammar-constrained answer parses into scores in [0, 1]."""
    pytest.importorskip("xgrammar")
    from tether.engine import TransformersEngine

    from .helpers import LiveGateway

    key = "judge-record-key-0123456789"
    live = LiveGateway(TransformersEngine(model, tokenizer, max_batch_size=4), tokenizer,
                       tmp_path / "judge.sqlite", record_keys=(key,))  # fmt: skip
    try:
        judge = Judge(
            JudgeConfig(base_url=f"{live.server.url}/v1", model="starter", max_tokens=1024)
        )
        judge.config.api_key_env = "TETHER_TEST_RECORD_KEY"
        with pytest.MonkeyPatch.context() as m:
            m.setenv("TETHER_TEST_RECORD_KEY", key)
            asyncio.run(judge.check())
            grades = asyncio.run(judge.grade_group(TASK, [Candidate("5"), Candidate("7")]))
        recorded = live.store.list_rollouts()
        assert recorded, [g.fault for g in grades]
        calls = live.store.calls(recorded[-1].id)
        assert calls and calls[-1].constraint == "json_schema:scores"
        assert (
            calls[-1].request["messages"][0]["content"]
            == grades[0].detail["messages"][0]["content"]
        )
        for g in grades:
            assert g.fault is None, g.fault
            assert 0 <= g.grade.reward <= 1
    finally:
        live.stop()


@pytest.mark.slow
def test_tether_train_with_the_calc_config_and_a_judge(starter_dir: Path, tmp_path: Path) -> None:
    """``tether train examples/calc/config.yaml rollout.grader=judge ...``: one step and the
    evals, every rollout graded by the scripted judge through the CLI."""
    root = Path(__file__).resolve().parents[1]
    with ScriptedJudge(scoring(by_length)) as fake:
        done = subprocess.run(
            [sys.executable, "-m", "tether.cli", "train", str(root / "examples/calc/config.yaml"),
             f"dir={tmp_path}", f"model.path={starter_dir}", "tasks.train_size=10",
             "tasks.val_size=2", "agent.mode=inprocess", "agent.entry=tether.starter.calc:agent",
             "rollout.n=2", "rollout.batch_groups=1", "rollout.grader=judge",
             f"rollout.judge.base_url={fake.base_url}", "rollout.judge.model=scripted-judge",
             "rollout.success_threshold=0.5", "eval.tasks=1", "eval.samples=2",
             "eval.greedy=false", "gateway.default_max_tokens=16", "trainer.steps=1",
             "run.collapse_patience=0"],
            capture_output=True, text=True, timeout=300, cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"},
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(fake.requests) == 3  # the eval before, step 1's group, the eval after
    with Store(tmp_path / "calc" / "traces.sqlite") as store:
        rollouts = store.list_rollouts()
        details = [store.attempts(r.id)[-1].grade_detail for r in rollouts]
    assert len(rollouts) == 6 and all(d and d["model"] == "scripted-judge" for d in details)
    assert all(
        r.reward == d["scores"][d["candidate"]] for r, d in zip(rollouts, details, strict=True)
    )
