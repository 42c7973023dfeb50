"""What a remote engine needs from one inference server: the :class:`ServerAPI` contract.

:class:`~tether.engine.RemoteEngine` (``_remote.py``) owns everything the servers share:
the HTTP client, the replicas (a rollout sticks to one, health checks, a dead replica
left out), the admission gate, errors, and the order of a weight push (pause every
replica, push, check the version each reports, flush caches, resume them all). A
:class:`ServerAPI` speaks one server's routes for one replica: ``_vllm.py`` (vLLM's
OpenAI server) and ``_sglang.py`` (SGLang's native server).

Every method takes the shared ``httpx.AsyncClient`` and the replica's base URL (no
trailing slash). A method raises :class:`~tether.engine.EngineFailed` with the server's
own message for an error answer (:func:`tether.engine._remote_http.check` does it for a
response) and lets ``httpx`` transport errors through: the base maps those to "cannot
reach ... at URL" and :class:`~tether.engine.EngineTimeout`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx

from tether.engine._protocol import GenerateResult, SamplingParams, UnsupportedParams
from tether.engine._stream import TokenDelta

__all__ = [
    "GroupJoin",
    "PauseMode",
    "ServerAPI",
    "ServerCall",
    "ServerInfo",
    "TensorMeta",
    "Transport",
    "refuse_role_adapter",
]

#: How a weight push treats calls in flight: ``wait`` lets them finish first (sync
#: training), ``keep`` parks them on the server and continues them on the new weights
#: (async training; their later tokens come from the new version), ``abort`` ends them
#: with their partial tokens (``finish_reason`` ``"abort"``).
PauseMode = Literal["wait", "keep", "abort"]

#: How new weights reach the server (``engine.transport``).
Transport = Literal["lora", "disk", "nccl"]


@dataclass(frozen=True)
class ServerInfo:
    """What :meth:`ServerAPI.info` learns of a replica at start-up."""

    model: str  # the served model's name (what a request's ``model`` field names)
    max_positions: int | None  # the server's max model length, None if it does not say
    weight_version: int  # the version the server reports now (0 for fresh weights)
    ranks: int = 1  # the processes the replica adds to a weight-broadcast group (its TP × PP)


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of an NCCL weight push, in the order it is broadcast."""

    name: str  # the parameter's name as in the model's state dict (transformers names)
    dtype: str  # "float32", "bfloat16", ... (torch dtype without "torch.")
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ServerCall:
    """One generation call to one replica, as :meth:`ServerAPI.generate` hands it on."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    request_id: str  # tether's id of the call (what :meth:`ServerAPI.abort` names)
    adapter: str | None  # the LoRA adapter to serve from (transport lora); None: base weights


@dataclass(frozen=True)
class GroupJoin:
    """Where one replica joins a weight-broadcast group (the trainer is rank 0)."""

    master_address: str
    master_port: int
    rank_offset: int  # the replica's first rank
    world_size: int
    backend: str  # the broadcast backend ("nccl", "gloo")
    group_name: str


def refuse_role_adapter(params: SamplingParams) -> None:
    """UnsupportedParams for a role's own adapter, which only the embedded engine serves
    (the run config refuses it first)."""
    if params.adapter is not None:
        raise UnsupportedParams("per-role adapters need the embedded engine", param="model")


class ServerAPI(ABC):
    """One kind of inference server, one replica per call (see the module docstring).

    An adapter subclasses it and implements every abstract method; :meth:`generate` and
    :meth:`stream` hand it the call as one :class:`ServerCall`."""

    #: "vllm" or "sglang", as ``engine.kind`` names it.
    name: str
    #: The server's name in messages: "cannot reach the vLLM server at ...".
    shown: str
    #: The transports this server supports.
    transports: tuple[Transport, ...]
    #: The broadcast backends (``engine.nccl_backend``) whose group tether's trainer side
    #: can build with this server (vLLM's NCCL group is its own: gloo only, for tests).
    group_backends: tuple[str, ...]

    @abstractmethod
    def check_params(self, params: SamplingParams) -> None:
        """Raise :class:`~tether.engine.UnsupportedParams` for parameters this server
        cannot serve with exact logprobs (vLLM: top_p < 1); the gateway answers 400."""
        ...

    @abstractmethod
    async def info(self, client: httpx.AsyncClient, url: str) -> ServerInfo:
        """Check the replica at start-up: it answers, serves a model, and runs in the
        mode tether needs (vLLM: unprocessed logprobs). Raises EngineFailed naming the
        flag to fix otherwise."""
        ...

    async def generate(
        self,
        client: httpx.AsyncClient,
        url: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str,
        adapter: str | None,
    ) -> GenerateResult:
        """Sample ``params.n`` completions (token ids in; ids and the sampled tokens'
        unprocessed logprobs out). ``adapter`` names the LoRA adapter to serve from (the
        ``lora`` transport), None for the base weights. ``policy_version`` is the weight
        version the server reports for this answer, or -1 when the server does not say
        (the engine then records its own version, exact while no push overlaps a call). A
        constraint goes as the server's structured-output request (xgrammar structural tag).
        With :meth:`stream`, the one place the call's arguments become a :class:`ServerCall`."""
        return await self._generate(
            client, url, ServerCall(prompt_ids, params, request_id, adapter)
        )

    def stream(
        self,
        client: httpx.AsyncClient,
        url: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str,
        adapter: str | None,
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        """:meth:`generate`, token by token: a TokenDelta per token as the server sends
        it, then the GenerateResult. Closing the generator closes the HTTP stream (the
        server aborts the request); the base also calls :meth:`abort`."""
        return self._stream(client, url, ServerCall(prompt_ids, params, request_id, adapter))

    @abstractmethod
    async def _generate(
        self, client: httpx.AsyncClient, url: str, call: ServerCall
    ) -> GenerateResult: ...

    @abstractmethod
    def _stream(
        self, client: httpx.AsyncClient, url: str, call: ServerCall
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]: ...

    @abstractmethod
    async def abort(self, client: httpx.AsyncClient, url: str, request_id: str) -> None:
        """Abort one request (best effort; an unknown id is no error)."""
        ...

    @abstractmethod
    async def pause(self, client: httpx.AsyncClient, url: str, mode: PauseMode) -> None:
        """Stop the server starting new generations; returns when ``mode`` is honoured
        (``wait``: nothing in flight)."""
        ...

    @abstractmethod
    async def resume(self, client: httpx.AsyncClient, url: str) -> None: ...

    @abstractmethod
    async def flush_cache(self, client: httpx.AsyncClient, url: str) -> None:
        """Drop the prefix cache (its KV came from the old weights)."""
        ...

    @abstractmethod
    async def weight_version(self, client: httpx.AsyncClient, url: str) -> int:
        """The weight version the replica reports now."""
        ...

    @abstractmethod
    async def load_lora(
        self, client: httpx.AsyncClient, url: str, name: str, path: str, version: int
    ) -> None:
        """Load the peft adapter folder ``path`` (readable by the server) as ``name``;
        afterwards calls naming ``name`` use it and the server reports ``version``."""
        ...

    @abstractmethod
    async def update_from_disk(
        self, client: httpx.AsyncClient, url: str, path: str, version: int
    ) -> None:
        """Load full weights from the folder ``path`` (safetensors, the model's own names
        and config); afterwards the server reports ``version``."""
        ...

    @abstractmethod
    async def init_nccl(self, client: httpx.AsyncClient, url: str, join: GroupJoin) -> None:
        """Have the replica join the weight-broadcast group (the trainer is rank 0; this
        replica's ranks start at ``join.rank_offset``). Returns once the server has started
        joining; the trainer joins concurrently."""
        ...

    @abstractmethod
    def group_prefix(self, group_name: str) -> str | None:
        """The store prefix the server's side of the broadcast group builds on (SGLang:
        ``"{group_name}/"``; vLLM's group has no name: None), which the trainer's side
        must use too."""
        ...

    @abstractmethod
    async def update_from_nccl(
        self,
        client: httpx.AsyncClient,
        url: str,
        tensors: Sequence[TensorMeta],
        *,
        group_name: str,
        version: int,
    ) -> None:
        """Receive ``tensors`` (broadcast from rank 0 in this order, concurrently with
        this call) and load them; afterwards the server reports ``version``."""
        ...
