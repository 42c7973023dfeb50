"""What an engine can do is declared on the :class:`~tether.engine.Engine` protocol.

Every engine reads the same names (``max_positions``, ``supports_constraints``,
``adapters``, ``weight_push``, ``check_params``, ``generate_stream``); an engine
that declares none of them gets the protocol's defaults, and no caller in tether
probes an engine with ``getattr``/``hasattr`` (docs STYLE rule 14).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import tiny_qwen2
from tether.engine import (
    AdapterPush,
    Completion,
    Engine,
    GenerateResult,
    Outage,
    RemoteEngine,
    RoleAdaptersPush,
    SamplingParams,
    TokenDelta,
    TransformersEngine,
    UnsupportedParams,
    WeightPush,
    server_api,
)
from tether.engine._remote_push import AdapterLoadPush, BroadcastPush, DiskPush
from tether.engine._server_api import Transport
from tether.engine.testing import FaultyEngine, NullEngine

ROOT = Path(__file__).resolve().parent.parent
PROBE = re.compile(r"\b(?:getattr|hasattr)\(.*engine", re.IGNORECASE)


def test_no_code_in_tether_probes_an_engine_for_a_capability() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "tether").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PROBE.search(line)
    ]
    assert not found, "declare it on tether.engine.Engine and read it plainly:\n" + "\n".join(found)
    assert PROBE.search('supported = getattr(engine, "supports_constraints", False)')


class Minimal(Engine):
    """An engine that implements only the calls: every capability is the default."""

    def __init__(self) -> None:
        self.version = 0

    @property
    def policy_version(self) -> int:
        return self.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        ids = [len(prompt_ids) + i for i in range(params.max_tokens)]
        return GenerateResult([Completion(ids, [-1.0] * len(ids), "length")], self.version)

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def update_weights(
        self, state_dict: dict[str, Any], *, version: int | None = None
    ) -> int:
        self.version = self.version + 1 if version is None else version
        return self.version

    async def outage(self) -> Outage | None:
        return None

    async def close(self) -> None:
        pass


async def test_an_engine_that_declares_nothing_gets_the_protocols_defaults() -> None:
    engine = Minimal()
    assert isinstance(engine, Engine)
    assert engine.max_positions is None and not engine.supports_constraints
    assert engine.adapters == frozenset() and type(engine.weight_push) is WeightPush
    assert engine.check_params(SamplingParams(top_p=0.5)) is None  # everything is served
    params = SamplingParams(max_tokens=3)
    items = [x async for x in engine.generate_stream([1, 2], params)]
    result = items[-1]
    assert isinstance(result, GenerateResult)
    assert result.completions[0].token_ids == [2, 3, 4]
    assert [d.token_id for d in items[:-1] if isinstance(d, TokenDelta)] == [2, 3, 4]
    assert isinstance(items[-2], TokenDelta) and items[-2].finish_reason == "length"


def test_the_fakes_declare_the_defaults_and_a_wrapper_its_inners_length() -> None:
    class Positioned(NullEngine):
        max_positions = 300

    fake = NullEngine()
    assert fake.max_positions is None and not fake.supports_constraints
    assert fake.adapters == frozenset() and type(fake.weight_push) is WeightPush
    assert FaultyEngine(Positioned(), fault=None).max_positions == 300
    assert FaultyEngine(fault=None).max_positions is None


async def test_the_embedded_engine_declares_grammar_and_its_length() -> None:
    engine = TransformersEngine(tiny_qwen2(64).eval())
    try:
        assert engine.supports_constraints and engine.max_positions
        assert engine.max_positions == engine.model.config.max_position_embeddings
        assert engine.adapters == frozenset()  # a plain model: the full weights
        assert type(engine.weight_push) is WeightPush and engine.weight_push.engine is engine
        engine.check_params(SamplingParams(top_p=0.5))  # the embedded engine serves any top_p
    finally:
        await engine.close()


@pytest.mark.parametrize(
    ("transport", "push", "takes"),
    [
        ("lora", AdapterLoadPush, "adapter"),
        ("disk", DiskPush, "full"),
        ("nccl", BroadcastPush, "full"),
    ],
)
async def test_a_remote_engine_provides_the_push_of_its_transport(
    transport: Transport, push: type[WeightPush], takes: str, tmp_path: Path
) -> None:
    engine = RemoteEngine(
        server_api("vllm"), ["http://127.0.0.1:9"], transport=transport, weights_dir=tmp_path,
        nccl=("127.0.0.1", 0, "gloo"),
    )  # fmt: skip
    try:
        assert type(engine.weight_push) is push and engine.weight_push is engine.weight_push
        assert engine.weight_push.engine is engine and engine.adapters == frozenset()
        assert engine.weight_push.weights(FakeWeights()) == {takes: 1}  # the adapter on lora only
        assert isinstance(engine.weight_push, AdapterPush) == (transport == "lora")
        assert engine.supports_constraints and engine.max_positions is None  # not connected
        with pytest.raises(UnsupportedParams, match="top_p"):
            engine.check_params(SamplingParams(top_p=0.5))  # vLLM's logprobs: exact at 1 only
    finally:
        await engine.close()


class FakeWeights:
    """A fake trainer: each form of its weights names itself."""

    def state_dict(self) -> dict[str, Any]:
        return {"full": 1}

    def adapter_state_dict(self) -> dict[str, Any]:
        return {"adapter": 1}

    def adapters_state_dict(self) -> dict[str, dict[str, Any]]:
        return {"default": {"adapter": 1}}


async def test_each_weight_push_sends_its_form_of_the_weights_and_returns_the_version() -> None:
    engine = NullEngine()
    trainer = FakeWeights()
    assert await WeightPush(engine).push(trainer) == 1
    assert await AdapterPush(engine).push(trainer) == 2
    assert await RoleAdaptersPush(engine).push(trainer, version=7) == 7  # a resumed run's
    assert engine.weights == [{"full": 1}, {"adapter": 1}, {"default": {"adapter": 1}}]
    assert await engine.weight_push.push(trainer) == 8 == engine.policy_version
