"""Inference engines: token ids in, token ids and logprobs out.

- :class:`Engine`, :class:`SamplingParams`, :class:`Completion`,
  :class:`GenerateResult` and the errors — the contract (``_protocol``);
  :class:`Outage` what ``Engine.outage`` says when no call can be served (a server
  gone, the worker thread dead), :class:`EngineLost` once that is for good
- :class:`TransformersEngine` — embedded, continuous batching, prefix
  caching, CPU or CUDA; :class:`EngineStats` its counters (both imported
  lazily, so importing :mod:`tether.engine` does not import torch)
- :class:`RemoteEngine` — vLLM or SGLang servers (token ids in and out, several replicas,
  weights pushed by LoRA adapter, safetensors on disk or a broadcast);
  :class:`EngineConfig` (the run config's ``engine:``) and :func:`connect_engine` build it,
  :func:`server_api` is the adapter of one kind of server (docs/engines.md)
- :class:`TokenDelta` — what ``Engine.generate_stream`` yields per sampled token
  (then the :class:`GenerateResult`); :func:`stream_via_generate` streams through
  ``generate`` (the protocol's default ``generate_stream``)
- :func:`rollout_copy` — the engine's own int8 (torchao weight-only) or bf16 copy
  of a model (``rollout_dtype``), :func:`weight_bytes` its size (lazy: torch)
- :class:`AdmissionGate` — pause, drain and resume generations (``Engine.gate``,
  which the gateway admits through too); :class:`AdmissionTimeout` when a held call
  waits too long
- :class:`Constraint` — a grammar on generation (structured outputs, forced tool
  calls; xgrammar structural tags); :func:`json_schema_format` builds its JSON part;
  :class:`ConstraintError`, :class:`MissingStructuredExtra`, :class:`UnsupportedConstraint`
- :class:`WeightPush` — how a run pushes the trainer's weights to an engine
  (``Engine.weight_push``): the full weights, :class:`AdapterPush` the LoRA adapter's,
  :class:`RoleAdaptersPush` every role adapter's by name
- :func:`end_of_turn_ids` — the ids that end a generated turn (one rule for
  the gateway's stop ids, the engines' defaults and the starter's eos)
- :mod:`tether.engine.testing` — fake engines for tests
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (importing tether.engine does not import torch).
if TYPE_CHECKING:
    from ._config import EngineConfig as EngineConfig
    from ._connect import connect_engine as connect_engine
    from ._connect import server_api as server_api
    from ._constraint import Constraint as Constraint
    from ._constraint import ConstraintError as ConstraintError
    from ._constraint import MissingStructuredExtra as MissingStructuredExtra
    from ._constraint import UnsupportedConstraint as UnsupportedConstraint
    from ._constraint import json_schema_format as json_schema_format
    from ._gate import AdmissionGate as AdmissionGate
    from ._gate import AdmissionTimeout as AdmissionTimeout
    from ._protocol import BASE_ADAPTER as BASE_ADAPTER
    from ._protocol import Completion as Completion
    from ._protocol import Engine as Engine
    from ._protocol import EngineError as EngineError
    from ._protocol import EngineFailed as EngineFailed
    from ._protocol import EngineLost as EngineLost
    from ._protocol import EngineTimeout as EngineTimeout
    from ._protocol import EngineUnreachable as EngineUnreachable
    from ._protocol import GenerateResult as GenerateResult
    from ._protocol import Outage as Outage
    from ._protocol import SamplingParams as SamplingParams
    from ._protocol import UnsupportedParams as UnsupportedParams
    from ._remote import RemoteEngine as RemoteEngine
    from ._rollout_copy import rollout_copy as rollout_copy
    from ._rollout_copy import weight_bytes as weight_bytes
    from ._scheduler import EngineStats as EngineStats
    from ._stream import TokenDelta as TokenDelta
    from ._stream import stream_via_generate as stream_via_generate
    from ._transformers import TransformersEngine as TransformersEngine
    from ._turns import end_of_turn_ids as end_of_turn_ids
    from ._weight_push import AdapterPush as AdapterPush
    from ._weight_push import RoleAdaptersPush as RoleAdaptersPush
    from ._weight_push import WeightPush as WeightPush

__getattr__, __dir__, __all__ = lazy_face(__name__)
