"""A prompt beyond the model's context: a 400 ``context_length_exceeded`` before the engine.

The limit is the smallest of the tokenizer's ``model_max_length`` (transformers' "unset"
1e30 ignored), the model's ``max_position_embeddings`` (``Engine.max_positions``) and
``gateway.max_context``; tested with a real tiny model folder, as a user would serve one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tether.engine import TransformersEngine
from tether.engine.testing import NullEngine
from tether.errors import UserError
from tether.gateway import Gateway, GatewayConfig, create_app
from tether.models import load_tokenizer
from tether.records import RolloutStatus
from tether.store import Store

from .conftest import ADMIN_KEY
from .helpers import tiny_qwen2

POSITIONS = 2048
RECORD_KEY = "rec-key-0123"


@pytest.fixture(scope="module")
def model_dir(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder as many Hub models ship: the tokenizer's model_max_length unset."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    tiny_qwen2(len(tokenizer), max_position_embeddings=POSITIONS).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = int(1e30)  # transformers' VERY_LARGE_INTEGER
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
async def served(model_dir: Path, tmp_path: Path):
    tok = load_tokenizer(model_dir)
    assert tok.model_max_length > 1e29
    engine = TransformersEngine.from_pretrained(str(model_dir), tokenizer=tok, seed=0)
    store = Store(tmp_path / "traces.sqlite")
    cfg = GatewayConfig(admin_key=ADMIN_KEY, record_keys=(RECORD_KEY,))
    gw = Gateway(engine, tok, store, cfg)
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        yield gw, http
    await engine.close()
    store.close()


def _client(http: httpx.AsyncClient, base_url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, http_client=http, max_retries=0)


def _long_prompt(tok: Any, tokens: int) -> list[dict[str, str]]:
    text = " ".join(str(i) for i in range(tokens))
    assert len(tok.encode(text, add_special_tokens=False)) > tokens
    return [{"role": "user", "content": text}]


async def test_a_prompt_beyond_the_models_positions_is_a_400_in_both_modes(
    served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gw, http = served
    assert gw.calls.max_context == POSITIONS
    long = _long_prompt(gw.tokenizer, 4000)
    opened = gw.open_rollout({}, rollout_id="r-long")
    agent = _client(http, "http://gw/rollouts/r-long/v1", opened.token)
    recorder = _client(http, "http://gw/v1", RECORD_KEY)
    with caplog.at_level(logging.WARNING):
        for client in (agent, recorder):
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="policy", messages=long, max_tokens=4)
            err = info.value
            assert err.code == "context_length_exceeded" and err.param == "messages"
            assert f"{POSITIONS}" in err.message and "tokens" in err.message
            prompt_tokens = int(err.message.split("(")[1].split()[0])
            assert prompt_tokens > POSITIONS
            with pytest.raises(openai.BadRequestError) as streamed:
                await client.chat.completions.create(
                    model="policy", messages=long, max_tokens=4, stream=True
                )
            assert streamed.value.code == "context_length_exceeded"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert gw.calls.engine_calls == 0
    ok = await agent.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert ok.choices[0].finish_reason in ("stop", "length")  # the rollout still serves
    assert gw.store.get_rollout("r-long").status is RolloutStatus.RUNNING


async def test_prompt_plus_max_tokens_names_max_tokens(served: Any) -> None:
    gw, http = served
    opened = gw.open_rollout({}, rollout_id="r-sum")
    messages = _long_prompt(gw.tokenizer, 600)  # 1,702 tokens: the default 512 do not fit
    agent = _client(http, "http://gw/rollouts/r-sum/v1", opened.token)
    with pytest.raises(openai.BadRequestError) as info:
        await agent.chat.completions.create(model="policy", messages=messages, max_tokens=400)
    assert info.value.code == "context_length_exceeded"
    assert "max_tokens (400)" in info.value.message and f"{POSITIONS}" in info.value.message
    # without max_tokens the default is cut to what the context leaves (as vLLM does)
    ok = await agent.chat.completions.create(model="policy", messages=messages)
    assert 1536 < ok.usage.prompt_tokens < POSITIONS
    assert ok.usage.prompt_tokens + ok.usage.completion_tokens <= POSITIONS


def test_the_limit_is_the_smallest_known_one(make_gateway: Any, tokenizer: Any) -> None:
    class Positioned(NullEngine):
        max_positions = 300

    assert make_gateway(NullEngine()).calls.max_context == tokenizer.model_max_length
    assert make_gateway(Positioned()).calls.max_context == 300
    assert make_gateway(Positioned(), max_context=200).calls.max_context == 200
    assert make_gateway(Positioned(), max_context=5000).calls.max_context == 300
    with pytest.raises(UserError, match="max_context"):
        GatewayConfig(max_context=0)
