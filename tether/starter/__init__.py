"""The starter model: a tiny Qwen2 model and tokenizer tether builds itself.

No weights can be downloaded on the project's machines, so tether builds a
model it owns: a byte-level BPE tokenizer with a ChatML chat template and
tool-call tokens, a ~2M-parameter Qwen2 model, and (``warm=True``) a short
supervised warm-up on synthetic calculator-agent transcripts. The folders
are ordinary Hugging Face folders, cached by recipe hash::

    from tether.models import load_model, load_tokenizer
    from tether.starter import build_starter

    path = build_starter(warm=True)        # ~/.cache/tether/starter/warm-<hash>
    tokenizer = load_tokenizer(path)       # use this, not AutoTokenizer
    model = load_model(path)

The calc task (prompt, tool, tasks, grader) is :mod:`tether.starter.calc`. To warm the
starter up on another agent's runs (``examples/search/warmup.py`` does), render them
with :func:`encode_transcript` and train with :func:`train_on_transcripts`. Loading
any model folder, this one too, is :mod:`tether.models`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (`tether.starter.calc`, used by agents, graders and an MCP server, must not pull in
#: torch and transformers).
if TYPE_CHECKING:
    from ._build import Recipe as Recipe
    from ._build import build_starter as build_starter
    from ._build import is_starter as is_starter
    from ._build import read_info as read_info
    from ._build import starter_path as starter_path
    from ._errors import CalcError as CalcError
    from ._errors import StarterError as StarterError
    from ._model import ModelRecipe as ModelRecipe
    from ._tokenizer import TokenizerRecipe as TokenizerRecipe
    from ._warmup import WarmupRecipe as WarmupRecipe
    from ._warmup import encode_transcript as encode_transcript
    from ._warmup import train_on_transcripts as train_on_transcripts

__getattr__, __dir__, __all__ = lazy_face(__name__)
