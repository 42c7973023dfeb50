"""Claude Code (``claude -p``), the Claude Agent SDK or any Anthropic client against a rollout.

A gateway on 127.0.0.1 over a scripted model (the starter tokenizer without a context
limit: Claude Code's system prompt and tools are ~36k tokens with it, beyond the
starter model's 2,048), one rollout, the client started with only
``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` (the rollout's) and non-essential
traffic disabled; then what the store holds: each call's token counts and whether
call k+1's prompt extends call k's prompt + completion. docs/anthropic.md shows a run.

    npm i @anthropic-ai/claude-code        # its native binary: node_modules/.bin/claude
    python examples/frameworks/claude_code/check.py -- claude -p "Run echo tether-ok" \\
        --model policy --allowedTools Bash
    pip install claude-agent-sdk           # bundles the CLI
    python examples/frameworks/claude_code/check.py --say "2 + 2 = 4" -- python quickstart.py

``--say`` gives the model's turns in order (Hermes ``<tool_call>`` blocks for tool
calls); the default is one Bash call, then a sentence.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import tempfile
import time
from pathlib import Path

from tether.engine.testing import ScriptedEngine
from tether.gateway import BackgroundServer, Gateway, GatewayConfig, create_app
from tether.models import load_tokenizer
from tether.starter import build_starter
from tether.store import Store

BASH_CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo tether-ok", '
    '"description": "Print a word"}}\n</tool_call>'
)


def client_env(base_url: str, token: str, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),  # a fresh Claude Code config, no login
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": token,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Claude Code's tool search sends tools with defer_loading, which tether refuses
        # (it falls back by itself after a few 400s; this skips them)
        "ENABLE_TOOL_SEARCH": "false",
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }


def report(store: Store, rollout_id: str) -> None:
    calls = store.calls(rollout_id)
    for c in calls:
        tools = len(c.request.get("tools") or [])
        print(
            f"call {c.seq}: api={c.request.get('api')} prompt_ids={len(c.prompt_ids)} "
            f"completion_ids={len(c.completion_ids)} logprobs={len(c.logprobs)} "
            f"finish={c.finish_reason} tools={tools} model={c.request['anthropic']['model']}"
        )
        print(f"  response: {c.response}")
    for a, b in itertools.pairwise(calls):
        n = len(a.prompt_ids) + len(a.completion_ids)
        extends = b.prompt_ids[:n] == a.prompt_ids + a.completion_ids
        print(f"call {b.seq}'s prompt extends call {a.seq}'s prompt + completion: {extends}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--say", action="append", help="a model turn (repeat, in order)")
    ap.add_argument("command", nargs="+", help="the client to run, after --")
    args = ap.parse_args()
    tokenizer = load_tokenizer(build_starter(warm=False))
    tokenizer.model_max_length = 10**6  # a model whose context holds Claude Code's prompt
    turns = args.say or [BASH_CALL, "The command printed tether-ok."]
    tmp = Path(tempfile.mkdtemp(prefix="tether-claude-"))
    store = Store(tmp / "traces.sqlite")
    engine = ScriptedEngine(turns, tokenizer=tokenizer)
    gw = Gateway(engine, tokenizer, store, GatewayConfig(admin_key=os.urandom(16).hex()))
    server = BackgroundServer(create_app(gw)).start()
    try:
        gw.config.public_url = server.url
        opened = gw.open_rollout({}, rollout_id="r-claude")
        (tmp / "home").mkdir()
        env = client_env(opened.anthropic_base_url, opened.token, tmp / "home")
        print("$", " ".join(args.command))
        t0 = time.monotonic()
        out = subprocess.run(args.command, env=env, cwd=tmp, capture_output=True, text=True)
        print(f"exit {out.returncode} after {time.monotonic() - t0:.1f} s")
        print(f"stdout: {out.stdout.strip()[-2000:]}")
        if out.stderr.strip():
            print(f"stderr: {out.stderr.strip()[-2000:]}")
        report(store, "r-claude")
    finally:
        server.stop()
        store.close()


if __name__ == "__main__":
    main()
