"""SGLangServer (tether/engine/_sglang.py) against the SGLang fake (tests/fake_sglang.py).

The fake is a real HTTP server in its own process, reached through a real
``httpx.AsyncClient``; it generates with tether's embedded engine, so greedy ids and
logprobs must equal what a TransformersEngine gives in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.fake_backend import launch_fake
from tests.fake_sglang import KNOWN, GenerateReq
from tether.engine import (
    Constraint,
    EngineFailed,
    SamplingParams,
    UnsupportedParams,
    json_schema_format,
)
from tether.engine._protocol import GenerateResult
from tether.engine._remote import RemoteEngine
from tether.engine._server_api import GroupJoin
from tether.engine._sglang import SGLangServer
from tether.engine._sglang_wire import request_bodies
from tether.engine._stream import TokenDelta
from tether.engine._transformers import TransformersEngine
from tether.engine._weight_transports import BroadcastGroup, save_full, tensor_metas

LONG = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True)
FLAGS = ("--enable-deterministic-inference", "--enable-lora", "--weight-version", "0")


@pytest.fixture(scope="module")
def url(starter_dir: Path) -> Iterator[str]:
    with launch_fake("tests.fake_sglang", starter_dir, *FLAGS) as base:
        yield base


@pytest.fixture
def fresh_url(starter_dir: Path) -> Iterator[str]:
    """A fake of its own (the test changes its weights)."""
    with launch_fake("tests.fake_sglang", starter_dir, *FLAGS) as base:
        yield base


@pytest.fixture
async def client() -> Any:
    async with httpx.AsyncClient(timeout=120) as c:
        yield c


@pytest.fixture
async def resumed(client: Any, url: str) -> AsyncIterator[None]:
    """For a test that pauses the module's fake: resumed afterwards, also when the test
    fails (a paused fake holds every later test's calls until their timeout)."""
    yield
    await api.resume(client, url)


@pytest.fixture(scope="module")
def prompt(tokenizer: Any) -> list[int]:
    msgs = [{"role": "user", "content": "What is 12 + 30?"}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


api = SGLangServer()


async def gen(
    client: Any, url: str, prompt: list[int], rid: str = "r", **kw: Any
) -> GenerateResult:
    params = SamplingParams(**{"max_tokens": 12, **kw})
    return await api.generate(client, url, prompt, params, request_id=rid, adapter=None)


async def test_info(client: Any, url: str) -> None:
    info = await api.info(client, url)
    assert (info.max_positions, info.weight_version, info.ranks) == (2048, 0, 1)
    assert info.model


@pytest.mark.slow
async def test_info_refuses_an_incremental_stream(starter_dir: Path, client: Any) -> None:
    with launch_fake("tests.fake_sglang", starter_dir, "--incremental-streaming-output") as base:
        with pytest.raises(EngineFailed, match="without --incremental-streaming-output"):
            await api.info(client, base)
        params = SamplingParams(max_tokens=6, temperature=1.0)
        with pytest.raises(EngineFailed, match="earlier events"):  # what info() prevents
            _ = [
                x
                async for x in api.stream(
                    client, base, [1, 2, 3], params, request_id="i", adapter=None
                )
            ]


async def test_greedy_equals_the_embedded_engine(
    client: Any, url: str, starter_dir: Path, prompt: list[int]
) -> None:
    result = await gen(client, url, prompt, temperature=0, max_tokens=16)
    engine = TransformersEngine.from_pretrained(str(starter_dir), seed=0)
    try:
        ref = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16))
    finally:
        await engine.close()
    got, want = result.completions[0], ref.completions[0]
    assert got.token_ids == want.token_ids
    assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) <= 1e-5
    assert got.finish_reason == want.finish_reason
    assert result.policy_version == 0


async def test_n_completions_with_top_logprobs(client: Any, url: str, prompt: list[int]) -> None:
    result = await gen(client, url, prompt, n=3, temperature=1.0, seed=5, top_logprobs=2)
    assert len(result.completions) == 3
    for c in result.completions:
        assert len(c.token_ids) == len(c.logprobs) == 12 and c.finish_reason == "length"
        assert c.top_logprobs is not None and all(len(t) == 2 for t in c.top_logprobs)
    assert len({tuple(c.token_ids) for c in result.completions}) > 1  # seeds 5, 6, 7


async def test_seed_reproducible(client: Any, url: str, prompt: list[int]) -> None:
    a = await gen(client, url, prompt, "a", temperature=1.0, seed=11)
    b = await gen(client, url, prompt, "b", temperature=1.0, seed=11)
    c = await gen(client, url, prompt, "c", temperature=1.0, seed=12)
    assert a.completions[0].token_ids == b.completions[0].token_ids
    assert a.completions[0].token_ids != c.completions[0].token_ids


async def test_stop_token_is_included_with_its_logprob(
    client: Any, url: str, prompt: list[int]
) -> None:
    free = (await gen(client, url, prompt, temperature=1.0, seed=3)).completions[0]
    k = next(
        i for i in range(2, len(free.token_ids)) if free.token_ids[i] not in free.token_ids[:i]
    )
    stop = free.token_ids[k]
    c = (
        await gen(client, url, prompt, temperature=1.0, seed=3, stop_token_ids=(stop,))
    ).completions[0]
    assert c.finish_reason == "stop"
    assert c.token_ids == free.token_ids[: k + 1] and c.token_ids[-1] == stop
    assert c.logprobs == pytest.approx(free.logprobs[: k + 1], abs=1e-6)


async def test_stream_deltas_equal_the_result(client: Any, url: str, prompt: list[int]) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=9, n=2, top_logprobs=1)
    items = [x async for x in api.stream(client, url, prompt, params, request_id="s", adapter=None)]
    result = items[-1]
    assert isinstance(result, GenerateResult)
    deltas = [d for d in items[:-1] if isinstance(d, TokenDelta)]
    assert len(deltas) == len(items) - 1 == 20
    for i, c in enumerate(result.completions):
        mine = [d for d in deltas if d.index == i]
        assert [d.token_id for d in mine] == c.token_ids
        assert [d.logprob for d in mine] == c.logprobs
        assert [d.finish_reason for d in mine] == [None] * 9 + ["length"]
        assert [d.top_logprobs for d in mine] == c.top_logprobs
    plain = await gen(client, url, prompt, "p", max_tokens=10, temperature=1.0, seed=9, n=2)
    assert [c.token_ids for c in plain.completions] == [c.token_ids for c in result.completions]


async def test_abort_mid_stream_keeps_partial_tokens(
    client: Any, url: str, prompt: list[int]
) -> None:
    params = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True, n=2)
    stream = api.stream(client, url, prompt, params, request_id="long", adapter=None)
    seen: list[TokenDelta] = []
    result = None
    async for item in stream:
        if isinstance(item, GenerateResult):
            result = item
        else:
            seen.append(item)
            if len(seen) == 3:
                await api.abort(client, url, "long")  # both samples: rids long#0, long#1
    assert result is not None
    for i, c in enumerate(result.completions):
        assert c.finish_reason == "abort" and len(c.token_ids) < 1000
        assert c.token_ids == [d.token_id for d in seen if d.index == i]
        assert len(c.logprobs) == len(c.token_ids)
    assert sum(len(c.token_ids) for c in result.completions) >= 3


async def test_closing_the_stream_aborts_the_request(
    client: Any, url: str, prompt: list[int]
) -> None:
    params = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True)
    stream = api.stream(client, url, prompt, params, request_id="left", adapter=None)
    got = [await anext(stream), await anext(stream)]
    assert all(isinstance(d, TokenDelta) for d in got)
    await stream.aclose()
    for _ in range(50):  # flush_cache is refused (400) while the request runs
        await asyncio.sleep(0.1)
        with contextlib.suppress(EngineFailed):
            await api.flush_cache(client, url)
            return
    raise AssertionError("the request still runs after its stream was closed")


async def test_abort_a_plain_generate(client: Any, url: str, prompt: list[int]) -> None:
    params = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True)
    call = asyncio.ensure_future(
        api.generate(client, url, prompt, params, request_id="plain", adapter=None)
    )
    await asyncio.sleep(0.5)
    await api.abort(client, url, "plain")
    c = (await call).completions[0]  # its tokens so far (none on a busy machine)
    assert c.finish_reason == "abort" and len(c.logprobs) == len(c.token_ids) < 1000


async def test_json_constraint_output_parses(
    client: Any, url: str, prompt: list[int], tokenizer: Any
) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constraint = Constraint.of(json_schema_format(schema), "json_schema:ok")
    result = await gen(
        client, url, prompt, max_tokens=40, temperature=1.0, seed=1, constraint=constraint
    )
    c = result.completions[0]
    assert c.finish_reason == "stop"
    text = tokenizer.decode(c.token_ids[:-1])  # the end-of-turn token closes the grammar
    assert isinstance(json.loads(text)["ok"], bool)


async def running(
    client: Any, url: str, prompt: list[int], rid: str, params: SamplingParams = LONG
) -> tuple[asyncio.Future[GenerateResult], list[TokenDelta]]:
    """A streamed call in the background, returned once its first token has come."""
    seen: list[TokenDelta] = []

    async def consume() -> GenerateResult:
        async for item in api.stream(client, url, prompt, params, request_id=rid, adapter=None):
            if isinstance(item, GenerateResult):
                return item
            seen.append(item)
        raise AssertionError("no result")

    task = asyncio.ensure_future(consume())
    while not seen and not task.done():
        await asyncio.sleep(0.01)
    return task, seen


@pytest.mark.usefixtures("resumed")
async def test_pause_keep_holds_and_continues(client: Any, url: str, prompt: list[int]) -> None:
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=4, ignore_eos=True)
    task, seen = await running(client, url, prompt, "kept", params)
    await api.pause(client, url, "keep")
    await asyncio.sleep(0.3)  # tokens already on the wire arrive
    held = len(seen)
    late = asyncio.ensure_future(gen(client, url, prompt, "late", max_tokens=2, ignore_eos=True))
    await asyncio.sleep(0.5)
    assert len(seen) == held < 60 and not late.done()  # frozen; a new call is held
    await api.resume(client, url)
    result = await task
    assert result.completions[0].finish_reason == "length"
    assert result.completions[0].token_ids == [d.token_id for d in seen]
    assert len(seen) == 60
    assert (await late).completions[0].finish_reason == "length"


@pytest.mark.usefixtures("resumed")
async def test_pause_abort_ends_calls_and_wait_waits(
    client: Any, url: str, prompt: list[int]
) -> None:
    task, seen = await running(client, url, prompt, "doomed")
    await api.pause(client, url, "abort")
    c = (await task).completions[0]
    assert c.finish_reason == "abort" and c.token_ids == [d.token_id for d in seen]
    await api.flush_cache(client, url)
    await api.resume(client, url)
    short = asyncio.ensure_future(
        gen(client, url, prompt, "short", max_tokens=30, ignore_eos=True)  # not the model's luck
    )
    await asyncio.sleep(0.05)
    await api.pause(client, url, "wait")
    assert short.done()
    c = (await short).completions[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 30
    await api.resume(client, url)


async def test_flush_cache_refused_while_running(client: Any, url: str, prompt: list[int]) -> None:
    task, _ = await running(client, url, prompt, "busy")
    with pytest.raises(EngineFailed, match="400"):
        await api.flush_cache(client, url)
    await api.abort(client, url, "busy")
    assert (await task).completions[0].finish_reason == "abort"


async def test_server_errors_carry_the_message(client: Any, url: str, prompt: list[int]) -> None:
    params = SamplingParams(max_tokens=4000)
    with pytest.raises(EngineFailed, match="maximum context length of 2048"):
        await api.generate(client, url, prompt, params, request_id="big", adapter=None)
    with pytest.raises(EngineFailed, match="not loaded: nope"):
        await api.generate(client, url, prompt, SamplingParams(), request_id="x", adapter="nope")


def test_the_adapter_sends_only_fields_sglang_knows(prompt: list[int]) -> None:
    constraint = Constraint.of({"type": "const_string", "value": "hi"})
    params = SamplingParams(stop=("x",), stop_token_ids=(3,), seed=1, top_logprobs=2, n=2,
                            constraint=constraint)  # fmt: skip
    for body in request_bodies(prompt, params, ["a#0", "a#1"], "adapter", random.Random(0)):
        assert set(body) <= set(GenerateReq.model_fields)
        assert set(body["sampling_params"]) <= KNOWN


def test_params_sglang_cannot_serve_are_refused() -> None:
    SGLangServer().check_params(SamplingParams(top_p=0.5, stop_token_ids=(3,)))  # fine
    with pytest.raises(UnsupportedParams, match="ignores stop_token_ids") as err:
        SGLangServer().check_params(SamplingParams(ignore_eos=True, stop_token_ids=(3,)))
    assert err.value.param == "ignore_eos"


async def test_unknown_fields(client: Any, url: str) -> None:
    body = {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 2},
        "return_logprobs": True,
    }
    resp = await client.post(f"{url}/generate", json=body)  # unknown top-level keys: ignored
    assert resp.status_code == 200 and "output_token_logprobs" not in resp.json()["meta_info"]
    resp = await client.post(f"{url}/pause_generation", json={"mode": "later"})
    assert resp.status_code == 400 and resp.json()["code"] == 400
    async with httpx.AsyncClient(timeout=60) as own:  # the server drops the connection
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_token": 2}}
        resp = await own.post(f"{url}/generate", json=body)
    assert resp.status_code == 500  # SGLang's SamplingParams(**d) raises TypeError


async def test_fake_parallel_sampling_answers_a_list(client: Any, url: str) -> None:
    """SGLang's own n > 1 (which the adapter does not use): one answer per sample, each
    with a fresh rid, every one with the request's sampling_seed."""
    sp = {"max_new_tokens": 5, "n": 2, "temperature": 1.0, "sampling_seed": 3}
    body = {"input_ids": [1, 2, 3], "sampling_params": sp, "rid": "mine", "return_logprob": True}
    out = (await client.post(f"{url}/generate", json=body)).json()
    assert isinstance(out, list) and len(out) == 2
    assert len({o["meta_info"]["id"] for o in out} | {"mine"}) == 3
    assert out[0]["output_ids"] == out[1]["output_ids"]  # one seed: the same sample twice
    assert out[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


async def test_unreachable_server_is_one_line_naming_it(prompt: list[int]) -> None:
    engine = RemoteEngine(SGLangServer(), ["http://127.0.0.1:9"], timeout_s=5)
    try:
        with pytest.raises(EngineFailed, match=r"127\.0\.0\.1:9") as err:
            await engine.generate(prompt, SamplingParams(max_tokens=2))
        assert "\n" not in str(err.value)
    finally:
        await engine.close()


def _changed(model_dir: Path) -> dict[str, torch.Tensor]:
    from tether.models import load_model

    model = load_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
async def test_update_from_disk(
    client: Any, fresh_url: str, starter_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    before = await gen(client, fresh_url, prompt, temperature=0)
    folder = save_full(_changed(starter_dir), tmp_path / "v5", starter_dir)
    await api.pause(client, fresh_url, "wait")
    await api.update_from_disk(client, fresh_url, str(folder), 5)
    await api.flush_cache(client, fresh_url)
    await api.resume(client, fresh_url)
    assert await api.weight_version(client, fresh_url) == 5
    after = await gen(client, fresh_url, prompt, temperature=0)
    assert after.policy_version == 5
    assert after.completions[0].logprobs != before.completions[0].logprobs


def _adapters(model_dir: Path, folder: Path, seeds: tuple[int, ...]) -> list[str]:
    """peft LoRA adapters of the starter (B not zero, so each changes the outputs)."""
    from peft import LoraConfig, get_peft_model

    from tether.models import load_model

    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        cfg = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(load_model(model_dir), cfg).save_pretrained(str(folder / f"lora{seed}"))
        out.append(str(folder / f"lora{seed}"))
    return out


@pytest.mark.slow
async def test_lora_adapter_loads_and_reloads(
    client: Any, fresh_url: str, starter_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    base = await gen(client, fresh_url, prompt, temperature=0)
    folders = _adapters(starter_dir, tmp_path, (1, 2, 3))
    outs = []
    for version, folder in zip((3, 4, 5), folders, strict=True):
        await api.load_lora(client, fresh_url, "tether", folder, version)
        assert await api.weight_version(client, fresh_url) == version
        p = SamplingParams(temperature=0, max_tokens=12)
        outs.append(
            await api.generate(
                client, fresh_url, prompt, p, request_id=f"l{version}", adapter="tether"
            )
        )
    assert [o.policy_version for o in outs] == [3, 4, 5]
    logprobs = [base.completions[0].logprobs] + [o.completions[0].logprobs for o in outs]
    assert len({tuple(lp) for lp in logprobs}) == 4  # the base and each adapter differ
    gone = await client.post(f"{fresh_url}/unload_lora_adapter", json={"lora_name": "tether-v3"})
    assert gone.status_code == 400  # unloaded at the push of v5 (no call used it)


@pytest.mark.slow
async def test_lora_push_keeps_a_running_call_on_its_adapter(
    client: Any, fresh_url: str, starter_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    one, two = _adapters(starter_dir, tmp_path, (1, 2))
    await api.load_lora(client, fresh_url, "tether", one, 1)
    p = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)
    kept = api.stream(client, fresh_url, prompt, p, request_id="k", adapter="tether")
    assert isinstance(await anext(kept), TokenDelta)
    await api.pause(client, fresh_url, "keep")
    await api.load_lora(client, fresh_url, "tether", two, 2)
    await api.flush_cache(client, fresh_url)
    await api.resume(client, fresh_url)
    items = [x async for x in kept]
    assert isinstance(items[-1], GenerateResult) and items[-1].policy_version == 1
    await api.load_lora(client, fresh_url, "tether", one, 3)  # v1 unused now: unloaded
    gone = await client.post(f"{fresh_url}/unload_lora_adapter", json={"lora_name": "tether-v1"})
    assert gone.status_code == 400


@pytest.mark.slow
async def test_distributed_update_over_gloo(
    client: Any, fresh_url: str, starter_dir: Path, prompt: list[int]
) -> None:
    before = await gen(client, fresh_url, prompt, temperature=0)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    name = "tether-test"
    group = BroadcastGroup(
        "127.0.0.1", port, 2, backend="gloo", group_name=name, prefix=api.group_prefix(name)
    )
    await asyncio.gather(
        asyncio.to_thread(group.join),
        api.init_nccl(client, fresh_url, GroupJoin("127.0.0.1", port, 1, 2, "gloo", "tether-test")),
    )  # fmt: skip
    state = _changed(starter_dir)
    await asyncio.gather(
        asyncio.to_thread(group.broadcast, state),
        api.update_from_nccl(client, fresh_url, tensor_metas(state), group_name="tether-test", version=7),
    )  # fmt: skip
    group.close()
    assert await api.weight_version(client, fresh_url) == 7
    after = await gen(client, fresh_url, prompt, temperature=0)
    assert after.policy_version == 7
    assert after.completions[0].logprobs != before.completions[0].logprobs


@pytest.mark.slow
async def test_remote_engine_pushes_to_the_fake(
    fresh_url: str, starter_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    """RemoteEngine with this adapter: a disk push, then a broadcast over gloo."""
    engine = RemoteEngine(SGLangServer(), [fresh_url], transport="disk", weights_dir=tmp_path,
                          model_dir=starter_dir, pause_mode="keep")  # fmt: skip
    try:
        assert await engine.update_weights(_changed(starter_dir)) == 1
        result = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=4))
        assert result.policy_version == 1
    finally:
        await engine.close()
    engine = RemoteEngine(SGLangServer(), [fresh_url], transport="nccl",
                          nccl=("127.0.0.1", 0, "gloo"), pause_mode="abort")  # fmt: skip
    try:
        assert await engine.update_weights(_changed(starter_dir), version=2) == 2
        result = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=4))
        assert result.policy_version == 2
    finally:
        await engine.close()
