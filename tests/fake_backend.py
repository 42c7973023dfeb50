"""What the fake inference servers share (``tests/fake_vllm.py``, ``tests/fake_sglang.py``).

These are FAKES for tests: no CUDA, no paged attention, no real scheduler. A
:class:`FakeBackend` holds tether's own embedded :class:`TransformersEngine` on a model
folder (the starter model in tests), so a fake server generates real tokens with real
logprobs (fp32: what the embedded engine gives for the same prompt, seed and params).
Around it the backend keeps what a real server keeps for RL:

* a weight version: an int label the caller sets with each push (servers treat it as a
  label, not a counter);
* pause modes: ``wait`` (new requests held, returns when nothing is in flight),
  ``keep`` (new requests held; in-flight ones frozen with their tokens so far and
  continued after resume, on the weights loaded then), ``abort`` (in-flight requests end
  at once with their partial tokens, ``finish_reason`` ``"abort"``; new ones held);
* abort of one request by id (partial tokens, ``"abort"``), also when its client leaves;
* weights: full safetensors from a folder; a peft LoRA adapter folder merged into the
  base weights (one adapter active at a time); tensors broadcast from rank 0 over a gloo
  group that the trainer made with ``TCPStore`` + ``ProcessGroupGloo`` (no global
  ``init_process_group`` on either side);
* a prefix-cache flush (the embedded engine's prefix cache).

What it does not do: a keep-mode continuation restarts the row's stop-string check and
grammar at the continuation (tests freeze plain requests); the continuation's seed is
derived from the request's. :func:`launch_fake` starts a fake server module as a real
process on a free loopback port and stops it on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.distributed as dist

from tether.engine import SamplingParams
from tether.engine._protocol import Completion, GenerateResult
from tether.engine._stream import TokenDelta
from tether.engine._transformers import TransformersEngine

__all__ = ["FakeBackend", "FakeError", "Job", "launch_fake", "serve_app"]

REPO = Path(__file__).resolve().parent.parent


class FakeError(Exception):
    """A request the fake refuses (the server turns it into its own error shape)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[dict[int, float]] = field(default_factory=list)
    finish: str | None = None


@dataclass(eq=False)
class Job:
    """One generate request: its rows fill as tokens arrive; ``events`` carries each
    :class:`TokenDelta`, then the :class:`GenerateResult` (or an exception)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    rows: list[_Row]
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    segment: asyncio.Task[None] | None = None
    aborted: bool = False
    done: bool = False

    def unfinished(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r.finish is None]


class FakeBackend:
    """A model served like a real server serves it; see the module docstring."""

    def __init__(self, model_dir: str | Path, *, seed: int = 0):
        self.model_dir = str(model_dir)
        self.engine = TransformersEngine.from_pretrained(
            self.model_dir, seed=seed, stream_interval_s=0.0
        )
        self.tokenizer = self.engine.tokenizer
        self._base = {k: v.detach().clone() for k, v in self.engine.model.state_dict().items()}
        self.version = 0
        self.adapters: dict[str, str] = {}  # name -> folder, the last loaded is active
        self.active_adapter: str | None = None
        self.pause_mode: str | None = None
        self.jobs: dict[str, Job] = {}
        self.flushes = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._active = 0  # jobs generating now (not held by a pause)
        self._idle = asyncio.Event()
        self._idle.set()
        self._group: Any = None  # the gloo group of the weight broadcast

    @property
    def max_positions(self) -> int | None:
        return self.engine.max_positions

    # -- generation --------------------------------------------------------------------

    def start(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> Job:
        """Queue a request (held while paused); read it with :meth:`events`."""
        if request_id in self.jobs:
            raise FakeError(f"request id {request_id!r} is already running")
        job = Job(request_id, list(prompt_ids), params, [_Row() for _ in range(params.n)])
        self.jobs[request_id] = job
        job.task = asyncio.create_task(self._run(job))
        return job

    async def events(self, job: Job) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        """The job's deltas then its result; leaving early aborts it (a client that left)."""
        try:
            while True:
                item = await job.events.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, GenerateResult):
                    return
        finally:
            if not job.done:
                self.abort(job.request_id)

    async def _run(self, job: Job) -> None:
        try:
            while job.unfinished() and not job.aborted:
                await self._resumed.wait()
                if job.aborted:
                    break
                job.segment = asyncio.create_task(self._segment(job))
                self._active += 1
                self._idle.clear()
                try:
                    await job.segment
                except asyncio.CancelledError:
                    pass  # aborted, or frozen by a keep-mode pause: the loop decides
                finally:
                    job.segment = None
                    self._active -= 1
                    if not self._active:
                        self._idle.set()
        except asyncio.CancelledError:
            job.aborted = True  # aborted while held by a pause
        except Exception as exc:  # the engine failed: the server answers 500
            job.done = True
            self.jobs.pop(job.request_id, None)
            job.events.put_nowait(exc)
            return
        job.done = True
        self.jobs.pop(job.request_id, None)
        for row in job.rows:
            row.finish = row.finish or "abort"
        comps = [
            Completion(r.tokens, r.logprobs, r.finish or "abort", r.top or None) for r in job.rows
        ]
        if not job.params.top_logprobs:
            for c in comps:
                c.top_logprobs = None
        job.events.put_nowait(GenerateResult(comps, self.version, {"engine": "fake"}))

    async def _segment(self, job: Job) -> None:
        """Generate the job's unfinished rows: all at once when none has begun (what the
        embedded engine does with these params), else each from where it stopped."""
        todo = job.unfinished()
        if all(not job.rows[i].tokens for i in todo) and len(todo) == len(job.rows):
            await self._stream(job, list(range(len(job.rows))), job.prompt_ids, job.params)
            return
        parts = []
        for i in todo:
            row, p = job.rows[i], job.params
            seed = None if p.seed is None else p.seed + 7919 * (i + 1) + len(row.tokens)
            params = replace(p, n=1, max_tokens=p.max_tokens - len(row.tokens), seed=seed)
            parts.append(self._stream(job, [i], job.prompt_ids + row.tokens, params))
        await asyncio.gather(*parts)

    async def _stream(
        self, job: Job, rows: list[int], prompt: list[int], params: SamplingParams
    ) -> None:
        stream = self.engine.generate_stream(prompt, params)
        try:
            async for item in stream:
                if not isinstance(item, TokenDelta):
                    continue
                i = rows[item.index]
                row = job.rows[i]
                row.tokens.append(item.token_id)
                row.logprobs.append(item.logprob)
                if item.top_logprobs is not None:
                    row.top.append(item.top_logprobs)
                row.finish = item.finish_reason
                job.events.put_nowait(replace(item, index=i))
        finally:
            await stream.aclose()

    def abort(self, request_id: str) -> bool:
        """End a request with its tokens so far (``"abort"``); False for an unknown id."""
        job = self.jobs.get(request_id)
        if job is None or job.done:
            return False
        job.aborted = True
        target = job.segment if job.segment is not None else job.task
        if target is not None:
            target.cancel()
        return True

    # -- pause / resume ----------------------------------------------------------------

    async def pause(self, mode: str) -> None:
        """Hold new requests; ``wait``: until nothing runs; ``keep``: freeze what runs;
        ``abort``: end what runs (partial tokens)."""
        if mode not in ("wait", "keep", "abort"):
            raise FakeError(f"unknown pause mode {mode!r}: wait, keep or abort")
        self.pause_mode = mode
        self._resumed.clear()
        if mode == "abort":
            for request_id in list(self.jobs):
                self.abort(request_id)
        elif mode == "keep":
            for job in list(self.jobs.values()):
                if job.segment is not None:
                    job.segment.cancel()
        await self._idle.wait()

    async def resume(self) -> None:
        self.pause_mode = None
        self._resumed.set()

    @property
    def paused(self) -> bool:
        return self.pause_mode is not None

    async def flush_cache(self) -> None:
        """Drop the embedded engine's prefix cache (in its worker thread, between steps)."""
        worker = self.engine._scheduler
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        clear = lambda _: worker.prefix.clear() if worker.prefix is not None else None  # noqa: E731
        worker.inbox.put((clear, None, fut, loop))
        await fut
        self.flushes += 1

    # -- weights -----------------------------------------------------------------------

    async def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """New base weights (any subset of the model's); the adapter in use is dropped."""
        await self.engine.update_weights(state_dict, version=version)
        for k, v in state_dict.items():
            self._base[k] = v.detach().clone().to(self._base[k].dtype)
        self.active_adapter = None
        self.version = version

    async def load_from_disk(self, folder: str | Path, version: int) -> None:
        """Full weights from the ``*.safetensors`` files of ``folder``."""
        from safetensors.torch import load_file

        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise FakeError(f"no *.safetensors files in {folder}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        unknown = sorted(set(state) - set(self._base))
        if unknown:
            raise FakeError(f"weights in {folder} the model lacks: {unknown[:3]}")
        await self.load_weights(state, version)

    @property
    def ties_embeddings(self) -> bool:
        return bool(getattr(self.engine.model.config, "tie_word_embeddings", False))

    def has_head(self, folder: str | Path) -> bool:
        """Whether ``folder``'s safetensors files hold ``lm_head.weight``."""
        from safetensors import safe_open

        for f in Path(folder).glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as reader:
                if "lm_head.weight" in reader.keys():  # noqa: SIM118 (not a dict)
                    return True
        return False

    async def load_adapter(self, name: str, folder: str | Path, version: int | None) -> None:
        """Merge the peft adapter in ``folder`` into the base weights and serve them as
        ``name`` (the one active adapter)."""
        folder = Path(folder)
        if not (folder / "adapter_config.json").is_file():
            raise FakeError(f"no adapter_config.json in {folder}", 400)
        merged = await asyncio.to_thread(self._merged, folder)
        await self.engine.update_weights(
            merged, version=self.version if version is None else version
        )
        self.adapters[name] = str(folder)
        self.active_adapter = name
        if version is not None:
            self.version = version

    def _merged(self, folder: Path) -> dict[str, torch.Tensor]:
        from peft import PeftModel

        model = copy.deepcopy(self.engine.model)
        model.load_state_dict(self._base)
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
        return {k: v.detach().clone() for k, v in merged.state_dict().items()}

    async def join_group(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        prefix: str | None = None,
    ) -> None:
        """Join the trainer's broadcast group as ``rank``; returns once the group is made
        (the trainer, rank 0, hosts the ``TCPStore`` and joins concurrently). ``prefix``:
        the group is built on ``PrefixStore(prefix, store)`` (a group name), else on the
        store itself."""

        def join() -> Any:
            store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
                master_address,
                master_port,
                world_size,
                is_master=False,
                timeout=datetime.timedelta(seconds=60),
            )
            if prefix is not None:
                store = dist.PrefixStore(prefix, store)  # pyright: ignore[reportPrivateImportUsage]
            return dist.ProcessGroupGloo(store, rank, world_size, datetime.timedelta(seconds=60))

        self._group = await asyncio.to_thread(join)

    async def receive(self, metas: Sequence[tuple[str, str, Sequence[int]]], version: int) -> None:
        """Receive ``(name, dtype, shape)`` tensors broadcast from rank 0 in this order and
        load them as the new base weights."""
        group = self._group
        if group is None:
            raise FakeError("the weight broadcast group is not initialised", 400)
        for name, _, _ in metas:
            if name not in self._base:
                raise FakeError(f"unknown parameter {name!r}")

        def recv() -> dict[str, torch.Tensor]:
            out = {}
            for name, dtype, shape in metas:
                t = torch.empty(tuple(shape), dtype=getattr(torch, dtype))
                group.broadcast(t, 0).wait()
                out[name] = t
            return out

        await self.load_weights(await asyncio.to_thread(recv), version)


# -- launching a fake server as its own process -----------------------------------------


@contextlib.contextmanager
def launch_fake(
    module: str,
    model_dir: str | Path,
    *args: str,
    health: str = "/health",
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Run ``python -m <module> --model DIR --port 0 --port-file F [args]`` from the repo
    root; yield its base URL once ``health`` answers 200; stop it (SIGTERM, then SIGKILL)
    on exit. ``env`` is added to this process's environment."""
    with tempfile.TemporaryDirectory(prefix="fake-server-") as tmp:
        port_file = Path(tmp) / "port"
        cmd = [sys.executable, "-m", module, "--model", str(model_dir), "--port", "0"]
        cmd += ["--port-file", str(port_file), *args]
        env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}
        log = open(Path(tmp) / "log", "w+b")  # noqa: SIM115  closed below
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield _wait_ready(proc, port_file, health, timeout, log)
        finally:
            _stop(proc)
            log.close()


def _wait_ready(
    proc: subprocess.Popen[bytes], port_file: Path, health: str, timeout: float, log: Any
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"fake server exited with {proc.returncode}:\n{tail}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            url = f"http://127.0.0.1:{int(text)}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + health, timeout=2).status_code == 200:
                    return url
        time.sleep(0.1)
    raise TimeoutError(f"fake server not ready within {timeout} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def serve_app(app: Any, port: int, port_file: str | None, host: str = "127.0.0.1") -> None:
    """Serve ``app`` with uvicorn on ``host:port`` (0: a free port); the port goes to
    ``port_file`` (written atomically) or to stdout. Returns when the server stops."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    if port_file is None:
        print(bound, flush=True)
    else:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(bound))
        tmp.replace(port_file)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    server.run(sockets=[sock])
