"""The vLLM adapter (``tether/engine/_vllm.py``) against a vLLM server: the contract suite.

By default the server is the fake (``tests/fake_vllm.py``): its own process on a loopback
port, serving tether's embedded engine on the starter model, so its tokens and logprobs
equal an embedded :class:`TransformersEngine` in this process, sampled ones included.
``make test-vllm`` (``TETHER_REAL_SERVERS=1``) runs the same cases against a real vLLM
0.32 (the CPU build, fp32). A real server samples with its own generator, so there a
sampled completion is checked against the trainer's forward pass of its tokens (each
logprob ``log_softmax(logits / T)`` within 1e-5), and a greedy one against the embedded
engine's tokens too. What a real server cannot do here is skipped with the reason:
NCCL (the CPU build has no NCCL; the fake's gloo group stands in). What the fake alone
does is marked so: vLLM ignores an unknown field, the fake refuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.fake_backend import launch_fake
from tests.fake_vllm import COMPLETION_FIELDS
from tests.remote_servers import REAL, fake_server, real_server, server_args
from tether.engine import Constraint, EngineFailed, SamplingParams, UnsupportedParams
from tether.engine._constraint import json_schema_format
from tether.engine._protocol import GenerateResult
from tether.engine._server_api import GroupJoin, ServerCall, TensorMeta
from tether.engine._stream import TokenDelta
from tether.engine._transformers import TransformersEngine
from tether.engine._vllm import VLLMServer, completion_body
from tether.engine._weight_transports import save_full

DEV_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
PROMPT = "<|im_start|>user\nwhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"


fake_only = pytest.mark.skipif(REAL, reason="what the fake alone does (see the docstring)")
no_nccl = pytest.mark.skipif(REAL, reason="vLLM's CPU build has no NCCL to push weights over")


@pytest.fixture(scope="module")
def vllm_url(starter_dir: Path) -> Iterator[str]:
    """A vLLM server as tether needs it: dev mode, processed logprobs, no chunked prefill,
    LoRA, and (the fake) an NCCL weight-transfer backend."""
    with fake_server("vllm", starter_dir, "lora" if REAL else "nccl") as url:
        yield url


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=60) as c:
        yield c


@pytest.fixture
async def resumed(vllm_url: str, client: httpx.AsyncClient) -> AsyncIterator[None]:
    """For a test that pauses the module's fake: resumed afterwards, also when the test
    fails (a paused fake holds every later test's calls until their timeout)."""
    yield
    await VLLMServer().resume(client, vllm_url)


@pytest.fixture
async def ref(starter_dir: Path) -> AsyncIterator[TransformersEngine]:
    """The embedded engine on the same model: what the fake must answer."""
    engine = TransformersEngine.from_pretrained(str(starter_dir), seed=0)
    yield engine
    await engine.close()


@pytest.fixture
def prompt(tokenizer: Any) -> list[int]:
    return tokenizer.encode(PROMPT)


async def gen(client: httpx.AsyncClient, url: str, prompt: list[int], **kw: Any) -> GenerateResult:
    adapter = kw.pop("adapter", None)
    server = VLLMServer()
    return await server.generate(
        client, url, prompt, SamplingParams(**kw), request_id=f"t-{id(kw)}", adapter=adapter
    )


def assert_same(got: GenerateResult, want: GenerateResult) -> None:
    assert len(got.completions) == len(want.completions)
    for g, w in zip(got.completions, want.completions, strict=True):
        assert g.token_ids == w.token_ids
        assert g.finish_reason == w.finish_reason
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) <= 1e-5


def forward_logprobs(
    model: Any, prompt: list[int], ids: list[int], temperature: float
) -> list[float]:
    """``log_softmax(logits / T)`` of each of ``ids`` after ``prompt`` (T = 1 when greedy):
    what the trainer recomputes for a recorded call."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / (temperature or 1.0), -1)
    return lp[torch.arange(len(ids)), torch.tensor(ids)].tolist()


async def assert_served(
    got: GenerateResult, ref: TransformersEngine, prompt: list[int], params: SamplingParams
) -> None:
    """The fake: equal to the embedded engine. A real server: its logprobs are the forward
    pass's for its own tokens, and a greedy completion's tokens the embedded engine's."""
    want = await ref.generate(prompt, params)
    if not REAL or params.temperature == 0:
        assert_same(got, want)
        return
    assert len(got.completions) == params.n
    for c in got.completions:
        assert c.token_ids and len(c.logprobs) == len(c.token_ids)
        fwd = forward_logprobs(ref.model, prompt, c.token_ids, params.temperature)
        assert max(abs(a - b) for a, b in zip(c.logprobs, fwd, strict=True)) <= 1e-5


# -- generation ------------------------------------------------------------------------


async def test_info_reports_the_model_its_length_and_version(vllm_url, client) -> None:
    info = await VLLMServer().info(client, vllm_url)
    assert info.max_positions == 2048 and info.weight_version == 0 and info.ranks == 1


async def test_greedy_and_seeded_generations_equal_the_embedded_engine(
    vllm_url, client, ref, prompt
) -> None:
    cases: list[dict[str, Any]] = [{"temperature": 0.0}, {"temperature": 0.7, "seed": 3}]
    for kw in [*cases, {"seed": 5, "n": 3}]:
        params = SamplingParams(max_tokens=16, **kw)
        got = await gen(client, vllm_url, prompt, max_tokens=16, **kw)
        assert got.policy_version == -1  # vLLM's answer names no version: the engine's
        await assert_served(got, ref, prompt, params)


async def test_top_logprobs_are_the_k_most_likely(vllm_url, client, ref, prompt) -> None:
    got = await gen(client, vllm_url, prompt, temperature=0.0, max_tokens=6, top_logprobs=3)
    want = await ref.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, top_logprobs=3))
    tops, ref_tops = got.completions[0].top_logprobs, want.completions[0].top_logprobs
    assert tops is not None and ref_tops is not None
    for g, w in zip(tops, ref_tops, strict=True):
        assert list(g) == list(w)
        assert all(abs(g[t] - w[t]) <= 1e-5 for t in g)


async def test_a_stop_token_ends_the_completion_and_is_included(
    vllm_url, client, ref, prompt
) -> None:
    free = await gen(client, vllm_url, prompt, temperature=0.0, max_tokens=12, ignore_eos=True)
    stop = free.completions[0].token_ids[4]
    first = free.completions[0].token_ids.index(stop)
    got = await gen(client, vllm_url, prompt, temperature=0.0, max_tokens=12, stop_token_ids=[stop])
    c = got.completions[0]
    assert c.token_ids == free.completions[0].token_ids[: first + 1]
    assert c.finish_reason == "stop" and len(c.logprobs) == len(c.token_ids)
    assert c.logprobs[-1] == pytest.approx(free.completions[0].logprobs[first], abs=1e-5)


async def test_a_seed_reproduces_its_samples(vllm_url, client, prompt) -> None:
    a = await gen(client, vllm_url, prompt, seed=11, max_tokens=16, n=2)
    b = await gen(client, vllm_url, prompt, seed=11, max_tokens=16, n=2)
    c = await gen(client, vllm_url, prompt, seed=12, max_tokens=16, n=2)
    ids = lambda r: [x.token_ids for x in r.completions]  # noqa: E731
    assert ids(a) == ids(b) != ids(c)


async def test_streamed_deltas_equal_the_final_result(vllm_url, client, ref, prompt) -> None:
    params = SamplingParams(seed=2, n=2, max_tokens=20, top_logprobs=2)
    stream = VLLMServer().stream(client, vllm_url, prompt, params, request_id="s1", adapter=None)
    items = [item async for item in stream]
    result = items[-1]
    assert isinstance(result, GenerateResult)
    deltas = [d for d in items[:-1] if isinstance(d, TokenDelta)]
    for i, c in enumerate(result.completions):
        mine = [d for d in deltas if d.index == i]
        assert [d.token_id for d in mine] == c.token_ids
        assert [d.logprob for d in mine] == c.logprobs
        assert mine[-1].finish_reason == c.finish_reason and mine[0].finish_reason is None
    await assert_served(result, ref, prompt, params)


async def test_an_abort_mid_stream_ends_with_the_partial_tokens(vllm_url, client, prompt) -> None:
    server = VLLMServer()
    params = SamplingParams(seed=1, max_tokens=1500, ignore_eos=True)
    stream = server.stream(client, vllm_url, prompt, params, request_id="ab1", adapter=None)
    seen = 0
    async for item in stream:
        if isinstance(item, TokenDelta):
            seen += 1
            if seen == 3:
                await server.abort(client, vllm_url, "ab1")
        else:
            c = item.completions[0]
            assert c.finish_reason == "abort"
            assert seen <= len(c.token_ids) < 1500 and len(c.logprobs) == len(c.token_ids)
    await server.abort(client, vllm_url, "no-such-request")  # unknown ids are no error


@pytest.mark.usefixtures("resumed")
async def test_closing_a_stream_stops_the_generation_on_the_server(
    vllm_url, client, prompt
) -> None:
    server = VLLMServer()
    params = SamplingParams(seed=1, max_tokens=2000, ignore_eos=True)
    stream = server.stream(client, vllm_url, prompt, params, request_id="cl1", adapter=None)
    async for item in stream:
        assert isinstance(item, TokenDelta)
        break
    await stream.aclose()
    # nothing left in flight: a draining pause returns at once, not after 2000 tokens
    await asyncio.wait_for(server.pause(client, vllm_url, "wait"), 3)
    await server.resume(client, vllm_url)


async def test_a_json_schema_constraint_gives_json_that_parses(
    vllm_url, client, tokenizer, prompt
) -> None:
    props = {"ok": {"type": "boolean"}, "op": {"enum": ["add", "sub"]}}
    schema = {"type": "object", "properties": props, "required": ["ok", "op"]}
    constraint = Constraint.of(json_schema_format(schema), "json")
    got = await gen(client, vllm_url, prompt, seed=4, max_tokens=60, constraint=constraint)
    c = got.completions[0]
    assert c.finish_reason == "stop"
    text = tokenizer.decode(c.token_ids[:-1])  # the end-of-turn token closes the grammar
    assert set(json.loads(text)) == {"ok", "op"}


async def test_top_p_below_one_is_refused_before_sending(prompt) -> None:
    with pytest.raises(UnsupportedParams, match="top_p") as info:
        completion_body(ServerCall(prompt, SamplingParams(top_p=0.9), "x", None), stream=False)
    assert info.value.param == "top_p"  # the gateway's 400 names the field


async def test_every_field_sent_is_a_vllm_completion_field(prompt) -> None:
    params = SamplingParams(seed=1, stop=("\n",), stop_token_ids=(3,), top_logprobs=2,
                            constraint=Constraint.of({"type": "const_string", "value": "x"}))  # fmt: skip
    for stream in (False, True):
        body = completion_body(ServerCall(prompt, params, "x", "a"), stream=stream)
        assert set(body) <= COMPLETION_FIELDS


@fake_only
async def test_a_misspelt_field_is_refused_by_the_fake(vllm_url, client, prompt) -> None:
    body = completion_body(ServerCall(prompt, SamplingParams(), "x", None), stream=False)
    body["max_token"] = body.pop("max_tokens")
    resp = await client.post(f"{vllm_url}/v1/completions", json=body)
    assert resp.status_code == 400
    assert "max_token" in resp.json()["error"]["message"]


async def test_an_unreachable_server_is_a_transport_error(client) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await VLLMServer().info(client, f"http://127.0.0.1:{port}")


# -- pause and resume ------------------------------------------------------------------


async def generating(
    client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int
) -> asyncio.Task[GenerateResult]:
    """A streamed call, once its first token has arrived (the server is generating it)."""
    first = asyncio.Event()
    params = SamplingParams(seed=1, max_tokens=max_tokens, ignore_eos=True)

    async def run() -> GenerateResult:
        stream = VLLMServer().stream(client, url, prompt, params, request_id=f"g{id(first)}",
                                     adapter=None)  # fmt: skip
        async for item in stream:
            if not first.is_set():
                first.set()
                await asyncio.sleep(0)  # the test acts now, not after a backlog of tokens
            if isinstance(item, GenerateResult):
                return item
        raise AssertionError("the stream ended without a result")

    task = asyncio.create_task(run())
    await asyncio.wait_for(first.wait(), 60)
    return task


@pytest.mark.usefixtures("resumed")
async def test_pause_wait_drains_then_holds_new_calls(vllm_url, client, prompt) -> None:
    server = VLLMServer()
    running = await generating(client, vllm_url, prompt, 60)
    await server.pause(client, vllm_url, "wait")
    c = (await asyncio.wait_for(running, 10)).completions[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 60
    assert (await client.get(f"{vllm_url}/is_paused")).json() == {"is_paused": True}
    held = asyncio.create_task(gen(client, vllm_url, prompt, seed=1, max_tokens=5))
    await asyncio.sleep(0.5)
    assert not held.done()
    await server.resume(client, vllm_url)
    assert len((await held).completions[0].token_ids) <= 5


#: A call of this many tokens takes seconds even on a fast server (the starter model).
LONG = 2000
#: Tries for a pause to land on a call still running on the server: a client that gets
#: little CPU (a loaded CI machine) may read the first token only after the server has
#: generated all of them. A try where the call ended first is not counted; a pause that
#: lands must always do what its mode says.
TRIES = 4


def ran_out(result: GenerateResult) -> bool:
    """The call ended on the server before the pause came: all its tokens."""
    c = result.completions[0]
    return c.finish_reason == "length" and len(c.token_ids) == LONG


@pytest.mark.usefixtures("resumed")
async def test_pause_abort_ends_calls_with_their_partial_tokens(vllm_url, client, prompt) -> None:
    server = VLLMServer()
    for _ in range(TRIES):
        running = await generating(client, vllm_url, prompt, LONG)
        await server.pause(client, vllm_url, "abort")
        result = await asyncio.wait_for(running, 30)
        await server.resume(client, vllm_url)
        if not ran_out(result):
            break
    else:
        pytest.fail(f"in {TRIES} tries the abort never ended a running call")
    c = result.completions[0]
    assert c.finish_reason == "abort" and 0 < len(c.token_ids) < LONG
    assert len(c.logprobs) == len(c.token_ids)


@pytest.mark.usefixtures("resumed")
async def test_pause_keep_parks_calls_and_continues_them(vllm_url, client, prompt) -> None:
    server = VLLMServer()
    for _ in range(TRIES):
        running = await generating(client, vllm_url, prompt, LONG)
        await server.pause(client, vllm_url, "keep")
        await server.flush_cache(client, vllm_url)
        await asyncio.sleep(0.3)
        parked = not running.done()
        if parked or not ran_out(running.result()):
            break
        await server.resume(client, vllm_url)
    else:
        pytest.fail(f"in {TRIES} tries the pause never found the call running")
    assert parked  # a kept call neither ends nor aborts while the server is paused
    await server.resume(client, vllm_url)
    c = (await asyncio.wait_for(running, 60)).completions[0]
    assert c.finish_reason == "length" and len(c.token_ids) == len(c.logprobs) == LONG


# -- weights (these change the module's server: they run last) ---------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _changed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in state.items()}


@pytest.mark.usefixtures("resumed")
@no_nccl
async def test_nccl_update_over_gloo_loads_the_broadcast_weights(
    vllm_url, client, ref, prompt
) -> None:
    server = VLLMServer()
    new = _changed(ref.model.state_dict(), 0)
    port = _free_port()
    trainer: dict[str, Any] = {}

    def join() -> None:  # the trainer: rank 0, its own store and group, no global group
        store = torch.distributed.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
            "127.0.0.1", port, 2, is_master=True, timeout=datetime.timedelta(seconds=60)
        )
        trainer["pg"] = torch.distributed.ProcessGroupGloo(
            store, 0, 2, datetime.timedelta(seconds=60)
        )  # pyright: ignore[reportPrivateImportUsage]

    def broadcast() -> None:
        for t in new.values():
            trainer["pg"].broadcast(t.contiguous(), 0).wait()

    await asyncio.gather(
        asyncio.to_thread(join),
        server.init_nccl(client, vllm_url, GroupJoin("127.0.0.1", port, 1, 2, "gloo", "")),
    )  # fmt: skip
    metas = [
        TensorMeta(k, str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in new.items()
    ]
    before = await gen(client, vllm_url, prompt, temperature=0.0, max_tokens=12)
    await server.pause(client, vllm_url, "wait")
    await asyncio.gather(
        asyncio.to_thread(broadcast),
        server.update_from_nccl(client, vllm_url, metas, group_name="", version=1),
    )
    await server.flush_cache(client, vllm_url)
    await server.resume(client, vllm_url)
    assert await server.weight_version(client, vllm_url) == 1
    after = await gen(client, vllm_url, prompt, temperature=0.0, max_tokens=12)
    await ref.update_weights(new)
    assert_same(after, await ref.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12)))
    assert after.completions[0].logprobs != before.completions[0].logprobs


async def test_a_lora_adapter_is_served_by_name_with_its_version(
    vllm_url, client, starter_dir, prompt, tmp_path
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(starter_dir)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(model, cfg).save_pretrained(tmp_path / "adapter")
    server = VLLMServer()
    await server.load_lora(client, vllm_url, "tether-policy", str(tmp_path / "adapter"), 2)
    assert await server.weight_version(client, vllm_url) == 2
    models = (await client.get(f"{vllm_url}/v1/models")).json()["data"]
    assert {"tether-policy"} == {m["id"] for m in models if m.get("parent")}
    got = await gen(
        client, vllm_url, prompt, temperature=0.0, max_tokens=8, adapter="tether-policy"
    )
    assert len(got.completions[0].token_ids) >= 1
    await server.load_lora(client, vllm_url, "tether-policy", str(tmp_path / "adapter"), 3)
    assert await server.weight_version(client, vllm_url) == 3  # in place, under one name
    with pytest.raises(EngineFailed, match="does not exist"):
        await gen(client, vllm_url, prompt, temperature=0.0, max_tokens=4, adapter="nope")


# -- a server in the wrong mode, with the disk backend ------------------------------------


@pytest.fixture(scope="module")
def raw_url(starter_dir: Path) -> Iterator[str]:
    """vLLM's default logprobs mode (raw), otherwise as tether needs it."""
    with vllm_with(starter_dir, "--logprobs-mode", "raw_logprobs") as url:
        yield url


@contextlib.contextmanager
def vllm_with(starter_dir: Path, *extra: str, dev: bool = True) -> Iterator[str]:
    """The fake (or with ``TETHER_REAL_SERVERS=1`` the real) vLLM server with the flags
    tether needs, then ``extra`` (a later flag wins); ``dev``: the dev-mode routes on."""
    args = [*server_args("vllm", "lora"), *extra]
    if REAL:
        env = DEV_ENV if dev else {k: "0" for k in DEV_ENV}
        with real_server("vllm", starter_dir, args=args, env=env) as url:
            yield url
        return
    with launch_fake("tests.fake_vllm", starter_dir, *args, env=DEV_ENV if dev else {}) as url:
        yield url


@pytest.mark.slow
async def test_raw_logprobs_mode_is_refused_naming_the_flag(raw_url, client) -> None:
    with pytest.raises(EngineFailed, match="--logprobs-mode processed_logprobs"):
        await VLLMServer().info(client, raw_url)


@pytest.mark.slow
async def test_disk_update_loads_the_folder_and_reports_its_version(
    raw_url, client, ref, prompt, tmp_path, starter_dir
) -> None:
    new = _changed(ref.model.state_dict(), 1)
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # the starter ties them
    save_full(new, tmp_path / "v3", starter_dir)  # as tether writes a push
    server = VLLMServer()
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    await server.pause(client, raw_url, "wait")
    try:
        await server.update_from_disk(client, raw_url, str(tmp_path / "v3"), 3)
        await server.update_from_disk(client, raw_url, str(tmp_path / "v3"), 4)  # again
    finally:
        await server.resume(client, raw_url)
    assert await server.weight_version(client, raw_url) == 4
    await ref.update_weights(new)
    got = await gen(client, raw_url, prompt, temperature=0.0, max_tokens=12)
    assert_same(got, await ref.generate(prompt, greedy))


@pytest.mark.slow
async def test_chunked_prefill_on_the_cpu_is_refused_naming_the_flag(starter_dir, client) -> None:
    with (
        vllm_with(starter_dir, "--enable-chunked-prefill") as url,
        pytest.raises(EngineFailed, match="restart it with --no-enable-chunked-prefill"),
    ):
        await VLLMServer().info(client, url)


@pytest.mark.slow
async def test_dev_routes_are_absent_without_dev_mode(starter_dir, client) -> None:
    with (
        vllm_with(starter_dir, dev=False) as url,
        pytest.raises(EngineFailed, match="VLLM_SERVER_DEV_MODE=1"),
    ):
        await VLLMServer().info(client, url)
