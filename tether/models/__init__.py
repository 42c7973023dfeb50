"""Finding and loading a model: any local folder or Hugging Face hub id, offline-aware.

::

    from tether.models import load_model, load_tokenizer

    tokenizer = load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")  # use this, not AutoTokenizer
    model = load_model(path, dtype=torch.float32, device="cuda")

- :func:`model_source` (``_source.py``): the folder or hub id to pass to
  ``from_pretrained``, checked first, so a misspelled, private or offline model is one
  line within seconds; :func:`cached_snapshot` a hub id's cached folder, never a download;
- :func:`model_folder` (``_folders.py``): the model folder a local path names — itself,
  a checkpoint folder's ``model/``, or a run folder's newest checkpoint's ``model/``;
  :func:`model_source` goes through it, so every caller accepts all three;
- :func:`load_model`, :func:`load_tokenizer` (``_load.py``): ``from_pretrained`` through it.

Every model tether serves or trains (the starter too: :mod:`tether.starter` builds
its folder) loads here. It imports transformers and nothing of tether but the errors,
so the engine, the starter and the run use it without knowing each other.

Errors (``_errors.py``)::

    TetherError
    └── ModelError
        └── ModelNotFound    (also a UserError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (importing the package loads neither torch nor transformers).
if TYPE_CHECKING:
    from ._errors import ModelError as ModelError
    from ._errors import ModelNotFound as ModelNotFound
    from ._folders import model_folder as model_folder
    from ._load import load_model as load_model
    from ._load import load_tokenizer as load_tokenizer
    from ._source import cached_snapshot as cached_snapshot
    from ._source import model_source as model_source

__getattr__, __dir__, __all__ = lazy_face(__name__)
