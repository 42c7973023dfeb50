"""Agents on the Messages API: the calc example trained one GRPO step by ``tether train``,
Claude Code in print mode and the Claude Agent SDK's quick start (both slow, and skipped
where they are not installed), each against a rollout with only ``ANTHROPIC_BASE_URL`` /
``ANTHROPIC_API_KEY``, each call recorded token-exactly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.chat import render_prompt
from tether.engine.testing import ScriptedEngine
from tether.models import load_tokenizer
from tether.store import Store

from .helpers import LiveGateway

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_anthropic_example_trains_one_step(starter_dir: Path, tmp_path: Path) -> None:
    """``tether train examples/frameworks/anthropic/config.yaml``: the anthropic-SDK agent
    (ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY from the runner) in warm worker processes;
    one GRPO update."""
    overrides = [
        f"dir={tmp_path}",
        f"model.path={starter_dir}",
        "tasks.train_size=4",
        "tasks.val_size=1",
        "agent.concurrency=2",
        "rollout.n=2",
        "rollout.batch_groups=1",
        "rollout.grader=tests.helpers:alternating_grader",  # rewards 0, 1: an update happens
        "trainer.steps=1",
        "eval.tasks=1",
        "eval.samples=1",
        "eval.greedy=false",
        "checkpoint.every=0",
    ]
    config = ROOT / "examples/frameworks/anthropic/config.yaml"
    out = subprocess.run(
        [sys.executable, "-m", "tether.cli", "train", str(config), *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert " v1 " in out.stdout and "no update happened" not in out.stdout, out.stdout[-2000:]
    # every call of every rollout went through /v1/messages and was recorded token-exactly
    store = Store(tmp_path / "calc-anthropic" / "traces.sqlite")
    try:
        calls = [c for r in store.list_rollouts() for c in store.calls(r.id)]
    finally:
        store.close()
    assert len(calls) >= 4 and {c.request["api"] for c in calls} == {"messages"}
    tokenizer = load_tokenizer(starter_dir)
    for c in calls:
        assert c.prompt_ids == render_prompt(tokenizer, c.request["messages"], c.request["tools"])
        assert len(c.completion_ids) == len(c.logprobs) > 0


# --- Claude Code in print mode -----------------------------------------------------------------

BASH_CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo tether-ok", '
    '"description": "Print a word"}}\n</tool_call>'
)


def claude_env(live: LiveGateway, rid: str, home: Path) -> dict[str, str]:
    """What Claude Code needs to run against rollout ``rid``: its URL and token, no more."""
    opened = live.gw.open_rollout({}, rollout_id=rid)
    home.mkdir()
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(sys.path),  # the Agent SDK's quick start imports it
        "HOME": str(home),  # a fresh config: no login
        "ANTHROPIC_BASE_URL": opened.anthropic_base_url,
        "ANTHROPIC_API_KEY": opened.token,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ENABLE_TOOL_SEARCH": "false",  # its tools with defer_loading are refused (docs)
    }


def long_context(starter_dir: Path) -> Any:
    """The starter tokenizer without a context limit: Claude Code's system prompt and tools
    are ~36k tokens with it, beyond the starter model's 2,048 (docs/anthropic.md)."""
    tok = load_tokenizer(starter_dir)
    tok.model_max_length = 10**6
    return tok


@pytest.mark.slow
def test_claude_code_print_mode(starter_dir: Path, tmp_path: Path) -> None:
    """``claude -p`` (npm ``@anthropic-ai/claude-code``; its path in TETHER_CLAUDE_CODE or
    ``claude`` on PATH) against a rollout: its Bash tool_use, run by Claude Code, and
    the tool_result sent back; both calls recorded token-exactly and merged."""
    claude = os.environ.get("TETHER_CLAUDE_CODE") or shutil.which("claude")
    if not claude:
        pytest.skip("Claude Code is not installed (npm i @anthropic-ai/claude-code)")
    tok = long_context(starter_dir)
    engine = ScriptedEngine([BASH_CALL, "It printed tether-ok."], tokenizer=tok)
    live = LiveGateway(engine, tok, tmp_path / "cc.db")
    try:
        env = claude_env(live, "r-cc", tmp_path / "home")
        prompt = "Run `echo tether-ok` with the Bash tool."
        cmd = [claude, "-p", prompt, "--model", "policy", "--allowedTools", "Bash"]
        out = subprocess.run(
            cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.strip() == "It printed tether-ok."
        first, second = live.store.calls("r-cc")
    finally:
        live.stop()
    assert (
        first.finish_reason == "tool_calls"
        and first.response["tool_calls"][0]["function"]["name"] == "Bash"
    )
    assert len(first.prompt_ids) > 10_000 and len(first.completion_ids) == len(first.logprobs)
    n = len(first.prompt_ids) + len(first.completion_ids)
    assert second.prompt_ids[:n] == first.prompt_ids + first.completion_ids
    assert "<tool_response>\ntether-ok\n</tool_response>" in tok.decode(second.prompt_ids[n:])


QUICKSTART = """
import anyio
from claude_agent_sdk import query


async def main():
    async for message in query(prompt="What is 2 + 2?"):
        print(message)


anyio.run(main)
"""


@pytest.mark.slow
def test_claude_agent_sdk_quick_start(starter_dir: Path, tmp_path: Path) -> None:
    """The Claude Agent SDK's quick start as written (``pip install claude-agent-sdk``: it
    bundles Claude Code), pointed at a rollout by ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY."""
    pytest.importorskip("claude_agent_sdk")
    tok = long_context(starter_dir)
    live = LiveGateway(ScriptedEngine(["2 + 2 = 4"], tokenizer=tok), tok, tmp_path / "sdk.db")
    try:
        env = claude_env(live, "r-sdk", tmp_path / "home")
        (tmp_path / "quickstart.py").write_text(QUICKSTART)
        cmd = [sys.executable, "quickstart.py"]
        out = subprocess.run(
            cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        (call,) = live.store.calls("r-sdk")
    finally:
        live.stop()
    assert out.returncode == 0 and "ResultMessage(subtype='success'" in out.stdout, out.stderr
    assert "result='2 + 2 = 4'" in out.stdout
    assert call.request["api"] == "messages" and call.request["anthropic"]["stream"] is True
    assert len(call.prompt_ids) > 10_000 and len(call.completion_ids) == len(call.logprobs) > 0
