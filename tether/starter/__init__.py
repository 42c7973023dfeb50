"""The starter model: a tiny Qwen2 model and tokenizer tether builds itself.

No weights can be downloaded on the project's machines, so tether builds a
model it owns: a byte-level BPE tokenizer with a ChatML chat template and
tool-call tokens, a ~2M-parameter Qwen2 model, and (``warm=True``) a short
supervised warm-up on synthetic calculator-agent transcripts. The folders
are ordinary Hugging Face folders, cached by recipe hash::

    from tether.starter import build_starter, load_model, load_tokenizer

    path = build_starter(warm=True)        # ~/.cache/tether/starter/warm-<hash>
    tokenizer = load_tokenizer(path)       # use this, not AutoTokenizer (see load_tokenizer)
    model = load_model(path)

The calc task (prompt, tool, tasks, grader) is :mod:`tether.starter.calc`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports

# Exports load lazily: `tether.starter.calc` (used by agents, graders and an MCP
# server) must not pull in torch and transformers.
_EXPORTS = {
    "CHAT_TEMPLATE": "tether.starter._template",
    "MARKER_FILE": "tether.starter._build",
    "CalcError": "tether.starter._errors",
    "ModelNotFound": "tether.starter._errors",
    "ModelRecipe": "tether.starter._model",
    "Recipe": "tether.starter._build",
    "StarterError": "tether.starter._errors",
    "TokenizerRecipe": "tether.starter._tokenizer",
    "WarmupRecipe": "tether.starter._warmup",
    "build_starter": "tether.starter._build",
    "cache_root": "tether.starter._build",
    "cached_snapshot": "tether.starter._source",
    "is_starter": "tether.starter._build",
    "load_model": "tether.starter._build",
    "load_tokenizer": "tether.starter._build",
    "model_source": "tether.starter._source",
    "read_info": "tether.starter._build",
    "starter_path": "tether.starter._build",
    "stop_token_ids": "tether.starter._model",
}

__all__ = [
    "CHAT_TEMPLATE",
    "MARKER_FILE",
    "CalcError",
    "ModelNotFound",
    "ModelRecipe",
    "Recipe",
    "StarterError",
    "TokenizerRecipe",
    "WarmupRecipe",
    "build_starter",
    "cache_root",
    "cached_snapshot",
    "is_starter",
    "load_model",
    "load_tokenizer",
    "model_source",
    "read_info",
    "starter_path",
    "stop_token_ids",
]

if TYPE_CHECKING:
    from tether.starter._build import (
        MARKER_FILE,
        Recipe,
        build_starter,
        cache_root,
        is_starter,
        load_model,
        load_tokenizer,
        read_info,
        starter_path,
    )
    from tether.starter._errors import CalcError, ModelNotFound, StarterError
    from tether.starter._model import ModelRecipe, stop_token_ids
    from tether.starter._source import cached_snapshot, model_source
    from tether.starter._template import CHAT_TEMPLATE
    from tether.starter._tokenizer import TokenizerRecipe
    from tether.starter._warmup import WarmupRecipe


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
