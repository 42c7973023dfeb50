"""The starter model: a ~2M-parameter Qwen2 with tied embeddings, random init."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from tether.engine import end_of_turn_ids

__all__ = ["ModelRecipe", "build_model", "generation_config", "stop_token_ids"]


@dataclass(frozen=True)
class ModelRecipe:
    """The architecture and init seed (part of the cache key)."""

    hidden_size: int = 192
    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    rope_theta: float = 10_000.0
    initializer_range: float = 0.02
    seed: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids that end an assistant turn (:func:`tether.engine.end_of_turn_ids`):
    for the starter, ``<|im_end|>`` then ``<|endoftext|>``."""
    return list(end_of_turn_ids(tokenizer))


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    pad: Any = tokenizer.pad_token_id  # the starter tokenizer always has one
    return int(pad)


def model_config(recipe: ModelRecipe, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    stops = stop_token_ids(tokenizer)
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": recipe.rope_theta},
        initializer_range=recipe.initializer_range,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=stops,
        pad_token_id=_pad_id(tokenizer),
        architectures=["Qwen2ForCausalLM"],
    )


def generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Defaults for ``model.generate``: stop at ``<|im_end|>`` / ``<|endoftext|>``."""
    return GenerationConfig(
        eos_token_id=stop_token_ids(tokenizer),
        pad_token_id=_pad_id(tokenizer),
        do_sample=False,
        max_new_tokens=128,
    )


def build_model(recipe: ModelRecipe, tokenizer: PreTrainedTokenizerBase) -> Qwen2ForCausalLM:
    """A freshly initialised model; the same weights for the same recipe and tokenizer."""
    config = model_config(recipe, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = generation_config(tokenizer)
    return model.float().eval()


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
