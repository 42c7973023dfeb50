"""Inference engines: token ids in, token ids and logprobs out.

- :class:`Engine`, :class:`SamplingParams`, :class:`Completion`,
  :class:`GenerateResult` and the errors — the contract (``_protocol``)
- :class:`TransformersEngine` — embedded, continuous batching, prefix
  caching, CPU or CUDA; :class:`EngineStats` its counters (both imported
  lazily, so importing :mod:`tether.engine` does not import torch)
- :class:`TokenDelta` — what ``Engine.generate_stream`` yields per sampled token
  (then the :class:`GenerateResult`); :func:`engine_stream` streams any engine
  (one without ``generate_stream`` through ``generate``)
- :func:`rollout_copy` — the engine's own int8 (torchao weight-only) or bf16 copy
  of a model (``rollout_dtype``), :func:`weight_bytes` its size (lazy: torch)
- :class:`AdmissionGate` — pause, drain and resume generations (the engines'
  and the gateway's gate); :class:`AdmissionTimeout` when a held call waits too long
- :class:`Constraint` — a grammar on generation (structured outputs, forced tool
  calls; xgrammar structural tags); :func:`json_schema_format` builds its JSON part;
  :class:`ConstraintError`, :class:`MissingStructuredExtra`, :class:`UnsupportedConstraint`
- :func:`end_of_turn_ids` — the ids that end a generated turn (one rule for
  the gateway's stop ids, the engines' defaults and the starter's eos)
- :mod:`tether.engine.testing` — fake engines for tests
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports
from tether.engine._constraint import (
    Constraint,
    ConstraintError,
    MissingStructuredExtra,
    UnsupportedConstraint,
    json_schema_format,
)
from tether.engine._gate import AdmissionGate, AdmissionTimeout
from tether.engine._protocol import (
    Completion,
    Engine,
    EngineError,
    EngineFailed,
    EngineTimeout,
    GenerateResult,
    SamplingParams,
)
from tether.engine._stream import TokenDelta, engine_stream
from tether.engine._turns import end_of_turn_ids

if TYPE_CHECKING:
    from tether.engine._rollout_copy import rollout_copy, weight_bytes
    from tether.engine._transformers import TransformersEngine
    from tether.engine._worker import EngineStats

__all__ = [
    "AdmissionGate",
    "AdmissionTimeout",
    "Completion",
    "Constraint",
    "ConstraintError",
    "Engine",
    "EngineError",
    "EngineFailed",
    "EngineStats",
    "EngineTimeout",
    "GenerateResult",
    "MissingStructuredExtra",
    "SamplingParams",
    "TokenDelta",
    "TransformersEngine",
    "UnsupportedConstraint",
    "end_of_turn_ids",
    "engine_stream",
    "json_schema_format",
    "rollout_copy",
    "weight_bytes",
]


_LAZY = {
    "TransformersEngine": "tether.engine._transformers",
    "EngineStats": "tether.engine._worker",
    "rollout_copy": "tether.engine._rollout_copy",
    "weight_bytes": "tether.engine._rollout_copy",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
