"""examples/search/warmup.py: the search agent's runs it trains on, and a tiny real run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.test_tasks_units import EXAMPLES, load, read_jsonl

warmup = load("search", "warmup")
doc_search = load("search", "doc_search")


def test_clean_runs_search_and_read_the_worlds_own_articles() -> None:
    rng = random.Random(0)
    index, _, questions = warmup.world(7)
    two_hop = next(q for q in questions if len(q["docs"]) == 2)
    messages = warmup.transcript(7, two_hop, False, rng)
    calls = [m for m in messages if m.get("tool_calls")]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(calls) == len(results) == 2
    queries = [c["tool_calls"][0]["function"]["arguments"]["query"] for c in calls]
    assert queries[0] == two_hop["question"]
    assert results == [doc_search.search(q, index=index) for q in queries]  # the real tool
    assert results[1].startswith(f"[{two_hop['docs'][1]}]")  # the hop found its article
    assert two_hop["answers"][0] in results[1]
    assert messages[-1] == {"role": "assistant", "content": f"The answer is {two_hop['answers'][0]}."}  # fmt: skip


def test_guesses_answer_at_once_and_wrongly_with_an_answer_of_the_same_form() -> None:
    rng = random.Random(0)
    _, _, questions = warmup.world(3)
    for q in questions:
        messages = warmup.transcript(3, q, True, rng)
        assert [m["role"] for m in messages] == ["system", "user", "assistant"]
        guess = messages[-1]["content"].removeprefix("The answer is ").removesuffix(".")
        assert guess not in q["answers"]
        same_form = {o["answers"][0] for o in questions if warmup.form(o["question"]) == warmup.form(q["question"])}  # fmt: skip
        assert guess in same_form or (len(same_form) == 1 and guess.isdigit())


def test_the_guess_share_is_what_is_asked_and_every_clean_run_holds_its_answer() -> None:
    rng = random.Random(1)
    runs = [next(r) for r in [warmup.runs(rng, 0.6)] for _ in range(400)]
    guesses = sum(len(m) == 3 for m in runs)
    assert 0.5 < guesses / len(runs) < 0.7
    for m in runs:
        if len(m) > 3:
            answer = m[-1]["content"].removeprefix("The answer is ").removesuffix(".")
            assert answer in " ".join(x["content"] for x in m if x["role"] == "tool")


def test_the_tasks_world_is_seed_0_and_never_trained_on(monkeypatch: pytest.MonkeyPatch) -> None:
    make_tasks = load("search", "make_tasks")
    assert make_tasks.build_world(0).docs == read_jsonl(EXAMPLES / "search" / "docs.jsonl")
    seen: list[int] = []
    real = warmup.world
    monkeypatch.setattr(warmup, "world", lambda seed: (seen.append(seed), real(seed))[1])
    runs = warmup.runs(random.Random(2), 0.6)
    for _ in range(300):
        next(runs)
    assert len(set(seen)) > 100 and min(seen) >= 1 and max(seen) <= warmup.WORLDS


def test_the_rendering_is_the_agents(tokenizer: Any) -> None:
    """The agent sends its tool call back as the OpenAI SDK dumps it (arguments a JSON
    string); the warm-up writes a dict: both render to the same tokens."""
    messages = warmup.transcript(5, warmup.world(5)[2][0], False, random.Random(0))
    as_sent = json.loads(json.dumps(messages))
    for m in as_sent:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    render = [
        tokenizer.apply_chat_template(m, tools=[doc_search.SEARCH_TOOL], tokenize=False)
        for m in (messages, as_sent)
    ]
    assert render[0] == render[1]


@pytest.mark.slow
def test_a_short_warm_up_writes_a_loadable_model(starter_dir: Path, tmp_path: Path) -> None:
    from tether.models import load_model, load_tokenizer

    out = tmp_path / "search-starter"
    args = ["--base", str(starter_dir), "--out", str(out), "--batch", "2"]
    warmup.main([*args, "--read-steps", "3", "--habit-steps", "2"])
    stats = json.loads((out / "search_warmup.json").read_text())
    assert (stats["read"]["steps"], stats["habit"]["steps"]) == (3, 2)
    assert (stats["read"]["guess_share"], stats["habit"]["guess_share"]) == (0, warmup.GUESS_SHARE)
    before, after = load_model(starter_dir), load_model(out)
    assert load_tokenizer(out).get_vocab() == load_tokenizer(starter_dir).get_vocab()
    changed = [
        n for n, p in after.named_parameters() if not p.equal(dict(before.named_parameters())[n])
    ]
    assert changed  # it trained
