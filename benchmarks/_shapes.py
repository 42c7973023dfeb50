"""Randomly initialised Qwen2 models of named shapes, for benchmarks that need a real
model's size without downloading one (speed and memory do not depend on the weights)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SHAPES", "random_model", "random_samples"]

#: Qwen2Config fields per shape; "qwen2.5-0.5b" is Qwen/Qwen2.5-0.5B's real config.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=1664,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
    ),
}


def random_model(shape: str, device: str, dtype: torch.dtype = torch.float32, **fields: Any) -> Any:
    """A ``Qwen2ForCausalLM`` of ``shape`` (tied embeddings, SDPA attention), seeded,
    built directly on ``device`` in ``dtype``, in eval mode; ``fields`` override the
    shape's Qwen2Config fields (e.g. ``num_hidden_layers``)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        **{**SHAPES[shape], **fields},
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def random_samples(seqs: int, tokens: int, vocab: int) -> list[Any]:
    """``seqs`` training samples of ``tokens`` random ids each: a prompt of min(128,
    tokens / 2) ids without loss, then the completion; advantages ±1 (every sample trains),
    old logprobs −1, seeded."""
    from tether.trainer import Sample

    g = torch.Generator().manual_seed(0)
    prompt = min(128, tokens // 2)
    out = []
    for k in range(seqs):
        ids = torch.randint(10, vocab, (tokens,), generator=g).tolist()
        mask = [0] * prompt + [1] * (tokens - prompt)
        old = [0.0] * prompt + [-1.0] * (tokens - prompt)
        out.append(Sample(ids, mask, old, 1.0 if k % 2 else -1.0, k, 1.0))
    return out


def quiet_torchao() -> None:
    """transformers imports torchao (when installed) to build any model; on a CPU-only
    torch it logs that its CUDA fp8 kernels did not load (unused here), and torch logs
    pytree deprecation notices: silenced, as ``tether.cli`` does."""
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
