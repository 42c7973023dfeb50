"""The engine's own copy of the policy in a rollout dtype: ``bfloat16`` or ``int8``.

With ``rollout_dtype`` ``float32`` (the default) the embedded engine decodes with
the trainer's weights themselves (see ``TransformersEngine.weights_lock``). With
``int8`` it decodes with a weight-only quantized copy (int8 weights, one scale per
output channel, activations in the model's float dtype) made by torchao's
``quantize_(model, Int8WeightOnlyConfig())``; with ``bfloat16`` with a cast copy.
The copy is rebuilt from the full-precision weights after every weight sync, so
the trainer keeps full precision and the engine's logprobs carry the rounding
(what ``logprob_gap`` shows and ``trainer.tis_cap`` corrects).

Why torchao: it is PyTorch's own quantization library, maintained, and its
int8 weight-only tensor runs on CPU and CUDA with no build step. Importing it
on a CPU-only torch logs "Failed to load …_C_cutlass_90a / _C_mxfp8.so": those
are CUDA kernels for other dtypes (fp8/mxfp8 on Hopper), unused by int8
weight-only; :func:`import_torchao` silences those lines and torch's pytree
deprecation notices that torchao's import triggers.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from tether.errors import UserError

__all__ = ["ROLLOUT_DTYPES", "import_torchao", "rollout_copy", "weight_bytes"]

#: Values of ``model.rollout_dtype``; float32 shares the trainer's weights.
ROLLOUT_DTYPES = ("float32", "bfloat16", "int8")

_NOISY = ("torchao", "torch.utils._pytree")
MISSING = "model.rollout_dtype int8 needs torchao: pip install 'tether[int8]'"


def import_torchao() -> tuple[Any, Any]:
    """``(quantize_, Int8WeightOnlyConfig)``; a one-line UserError naming the fix when
    torchao is not installed. The CUDA-extension load failures it logs on a CPU-only
    torch are silenced (see the module docstring)."""
    loggers = [logging.getLogger(n) for n in _NOISY]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as e:
        raise UserError(MISSING) from e
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
    return quantize_, Int8WeightOnlyConfig


def rollout_copy(model: torch.nn.Module, rollout_dtype: str) -> torch.nn.Module:
    """A new module in eval mode: ``model``'s weights cast (``bfloat16``) or int8
    weight-only quantized (``int8``: every ``nn.Linear``, the LM head included; the
    embedding stays in ``model``'s dtype). ``model`` itself is not changed."""
    if rollout_dtype not in ROLLOUT_DTYPES[1:]:
        raise UserError(f"rollout_dtype ({rollout_dtype!r}) must be one of {ROLLOUT_DTYPES[1:]}")
    quantize = import_torchao() if rollout_dtype == "int8" else None
    with torch.no_grad():
        out = copy.deepcopy(model).eval()
        for p in out.parameters():
            p.requires_grad_(False)
        if quantize is None:
            return out.to(torch.bfloat16)
        quantize_, config = quantize
        quantize_(out, config())
    return out


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers as stored (an int8 tensor subclass
    counts its int8 data and scales; a tied weight once)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += _nbytes(t)
    return total


def _nbytes(t: torch.Tensor) -> int:
    inner = getattr(t, "__tensor_flatten__", None)
    if inner is not None and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = inner()
        return sum(_nbytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()
