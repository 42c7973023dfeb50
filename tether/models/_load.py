"""Load any model folder or hub id and its tokenizer, through ``from_pretrained``.

Both go through :func:`~tether.models.model_source` first, so a misspelled or
unreachable model is one line. A folder whose tokenizer is a plain
``tokenizer.json`` (the starter's, or the starter's saved beside another model)
loads as exactly that tokenizer: ``AutoTokenizer`` would build the class of the
model's ``model_type`` instead (``Qwen2Tokenizer`` for a qwen2 config), with
another pre-tokenizer, and tokenize differently.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tether.models._source import model_source

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["load_model", "load_tokenizer"]


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of a local folder or hub id (use this, not ``AutoTokenizer``)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    source = model_source(str(path), "tokenizer")
    if _generic_tokenizer(source):
        return PreTrainedTokenizerFast.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source)


def _generic_tokenizer(folder: str) -> bool:
    """Whether a local folder's tokenizer config names the generic class (its
    ``tokenizer.json`` is the whole tokenizer)."""
    try:
        config = json.loads((Path(folder) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    generic = config.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast")
    return generic and (Path(folder) / "tokenizer.json").is_file()


def load_model(
    path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """A causal LM from a local folder or hub id, on ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_source(str(path)), dtype=dtype)
    return model.to(device).eval()
