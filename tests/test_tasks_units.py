"""The example tasks wordmath, search and coding: their data, tools and graders.

The agents' runs through the gateway and the 1-step training runs are in
``test_tasks.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(task: str, name: str) -> ModuleType:
    """Import examples/<task>/<name>.py by path, its folder on sys.path (as a runner does)."""
    folder = str(EXAMPLES / task)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    key = f"_example_{task}_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES / task / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before running it: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[key]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ wordmath


def test_wordmath_tasks_are_the_generators_and_correct() -> None:
    gen = load("wordmath", "make_tasks")
    tasks = read_jsonl(EXAMPLES / "wordmath" / "tasks.jsonl")
    assert tasks == gen.make_tasks(seed=0)  # the committed file is what the script writes
    assert gen.make_tasks(seed=1) != tasks
    train = [t for t in tasks if t["split"] == "train"]
    val = [t for t in tasks if t["split"] == "val"]
    assert len(train) >= 60 and len(val) >= 20
    assert not {t["question"] for t in train} & {t["question"] for t in val}
    assert len({t["id"] for t in tasks}) == len(tasks)
    for t in tasks:
        assert gen.evaluate(t["solution"]) == t["answer"] and t["answer"] >= 0


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("The answer is 38.", 1.0),
        ("He gets $38 back.", 1.0),
        ("50 - 12 = 38", 1.0),
        ("The answer is 38.0", 1.0),
        ("38 or maybe 39", 0.0),
        ("thirty-eight", 0.0),
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_wordmath_grader(answer: str | None, expected: float) -> None:
    assert load("wordmath", "grader").grade({"answer": 38}, answer) == expected


def test_wordmath_grader_reads_thousands() -> None:
    assert load("wordmath", "grader").grade({"answer": 1250}, "The answer is 1,250.") == 1.0


def test_wordmath_calculator_tool() -> None:
    agent = load("wordmath", "agent")
    assert agent.run_tool("calculator", '{"expression": "50 - 4 * 3"}') == "38"
    assert agent.run_tool("calculator", '{"expression": "__import__(\'os\')"}').startswith("error")
    assert agent.run_tool("calculator", "not json").startswith("error: bad arguments")
    assert agent.run_tool("search", "{}").startswith("error: unknown tool")


# -------------------------------------------------------------------- search


def test_search_data_is_the_generators_and_answers_are_in_the_docs() -> None:
    gen = load("search", "make_tasks")
    docs, tasks = gen.make_data(seed=0)
    assert docs == read_jsonl(EXAMPLES / "search" / "docs.jsonl")
    assert tasks == read_jsonl(EXAMPLES / "search" / "tasks.jsonl")
    assert 40 <= len(docs) <= 80 and len({d["id"] for d in docs}) == len(docs)
    by_id = {d["id"]: d for d in docs}
    for t in tasks:
        text = " ".join(by_id[d]["text"] for d in t["docs"])
        assert t["answers"][0] in text, t
    splits = [t["split"] for t in tasks]
    assert splits.count("train") >= 60 and splits.count("val") >= 20


def test_search_tool_finds_each_questions_document() -> None:
    """The real BM25 index ranks the document that holds the answer first (the agent
    reads only the best article), and a two-hop question's second document first for
    its title."""
    tool = load("search", "doc_search")
    index = tool.load_index()
    tasks = read_jsonl(EXAMPLES / "search" / "tasks.jsonl")
    titles = {d["id"]: d["title"] for d in index.docs}
    for t in tasks:
        queries = [t["question"], *(titles[d] for d in t["docs"][1:])]
        for query, doc in zip(queries, t["docs"], strict=True):
            (found,) = [d["id"] for d, _ in index.search(query)]
            assert found == doc, (query, found)
    text = tool.search("Who founded the town of Lumzar?", k=2)
    assert text.splitlines()[0].startswith("[town-00] Lumzar: ") and len(text.splitlines()) == 2
    assert tool.search("qwxz zzyq").startswith("no article matches")
    assert tool.search("  ").startswith("error") and tool.search("x" * 500).startswith("error")
    agent = load("search", "agent")
    assert agent.run_tool("search", '{"query": "Lumzar"}').startswith("[town-00]")
    assert agent.run_tool("search", '{"q": 1}').startswith("error: bad arguments")
    assert agent.run_tool("calculator", "{}").startswith("error: unknown tool")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("The answer is the Lantern Festival.", 1.0),
        ("lantern festival", 1.0),
        ("The answer is: LANTERN FESTIVAL", 1.0),
        ("It is the Lantern Festival, held in May.", 0.0),
        ("The answer is Bell Festival.", 0.0),
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_search_grader(answer: str | None, expected: float) -> None:
    task = {"answers": ["Lantern Festival"]}
    assert load("search", "grader").grade(task, answer) == expected


def test_search_grader_accepts_listed_forms() -> None:
    grade = load("search", "grader").grade
    task = {"answers": ["1328 meters", "1328 m", "1328"]}
    assert grade(task, "The answer is 1328 m.") == 1.0
    assert grade(task, "The answer is 1,328.") == 1.0  # punctuation is dropped
    assert grade(task, "The answer is 1329.") == 0.0


# -------------------------------------------------------------------- coding


def coding_tasks() -> dict[str, dict[str, Any]]:
    return {t["repo"]: t for t in read_jsonl(EXAMPLES / "coding" / "tasks.jsonl")}


def fix_of(repo: str) -> str:
    return (EXAMPLES / "coding" / "repos" / repo / "solution" / f"{repo}.py").read_text()


def test_coding_tasks_are_the_generators() -> None:
    tasks = read_jsonl(EXAMPLES / "coding" / "tasks.jsonl")
    assert tasks == load("coding", "make_tasks").make_tasks()
    assert len(tasks) >= 4 and {t["split"] for t in tasks} == {"train", "val"}
    for t in tasks:
        assert f"{t['repo']}.py" in t["files"] and f"tests/test_{t['repo']}.py" in t["files"]
        assert not any(p.startswith(("hidden", "solution")) for p in t["files"])


@pytest.mark.parametrize("repo", sorted(coding_tasks()))
def test_coding_reference_fix_passes_every_hidden_test(repo: str) -> None:
    grade = load("coding", "grader").grade
    fixed = grade(coding_tasks()[repo], json.dumps({"files": {f"{repo}.py": fix_of(repo)}}))
    assert fixed == {"reward": 1.0, "success": True}


def test_coding_grader_partial_credit_and_ignores_test_edits() -> None:
    grader = load("coding", "grader")
    task = coding_tasks()["roman"]
    unchanged = grader.grade(task, json.dumps({"files": {}}))
    assert 0.0 < unchanged["reward"] < 1.0  # the bug fails some hidden tests, not all
    assert unchanged["success"] is False  # a partial reward is not a fix
    cheat = {
        "tests_hidden/test_roman_hidden.py": "def test_ok():\n    pass\n",
        "conftest.py": "import pytest\n",
        "tests/test_roman.py": "",
        "pytest.py": "raise SystemExit(0)\n",  # would shadow pytest: new files never count
        "sitecustomize.py": "import os\n",
        "../roman.py": fix_of("roman"),
        "/tmp/roman.py": fix_of("roman"),
    }
    assert grader.grade(task, json.dumps({"files": cheat})) == unchanged
    assert grader.grade(task, "I fixed it") == {"reward": 0.0, "success": False}
    assert grader.grade(task, None) == {"reward": 0.0, "success": False}


def test_coding_grader_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    grader = load("coding", "grader")
    monkeypatch.setattr(grader, "GRADE_TIMEOUT_S", 2.0)
    hang = "import time\nwhile True:\n    time.sleep(0.05)\n"
    hung = grader.grade(coding_tasks()["roman"], json.dumps({"files": {"roman.py": hang}}))
    assert hung == {"reward": 0.0, "success": False}


def test_coding_workspace_tools_stay_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = load("coding", "coding_workspace")
    monkeypatch.setenv("OPENAI_API_KEY", "secret-rollout-token")
    task = coding_tasks()["roman"]
    with tools.Workspace(task["files"]) as ws:
        outside = tmp_path / "outside.txt"
        outside.write_text("secret")
        (ws.root / "link").symlink_to(tmp_path)
        refused = ["../x.py", "/etc/passwd", str(outside), "a/../../x", "a\\b", "link/outside.txt"]
        for bad in refused:
            assert ws.read_file(bad).startswith("error: "), bad
            assert ws.write_file(bad, "x").startswith("error: "), bad
        assert not (tmp_path / "x.py").exists() and outside.read_text() == "secret"
        assert ws.read_file("roman.py") == task["files"]["roman.py"]
        assert ws.read_file("nope.py").startswith("error: no text file")
        assert "1 of 2 tests passed" in ws.run_tests()
        assert ws.write_file("roman.py", fix_of("roman")).startswith("wrote ")
        assert ws.write_file("tests/test_env.py", ENV_TEST).startswith("wrote ")
        assert "3 of 3 tests passed" in ws.run_tests()  # no API key reaches the tests
        assert set(ws.changed_files()) == {"roman.py", "tests/test_env.py"}
        root = ws.root
    assert not root.exists()


ENV_TEST = "import os\n\n\ndef test_env():\n    assert 'OPENAI_API_KEY' not in os.environ\n"


def test_coding_agent_tools() -> None:
    agent = load("coding", "agent")
    with load("coding", "coding_workspace").Workspace({"a.py": "x = 1\n"}) as ws:
        assert agent.run_tool(ws, "read_file", '{"path": "a.py"}') == "x = 1\n"
        assert agent.run_tool(ws, "write_file", '{"path": "b.py", "content": "y"}').startswith(
            "wrote"
        )
        assert agent.run_tool(ws, "read_file", '{"path": "../a.py"}').startswith("error")
        assert agent.run_tool(ws, "write_file", '{"path": "b.py"}').startswith("error: bad")
        assert agent.run_tool(ws, "shell", "{}").startswith("error: unknown tool")
        assert ws.changed_files() == {"b.py": "y"}
    assert [t["function"]["name"] for t in agent.TOOLS] == ["read_file", "write_file", "run_tests"]
