"""Where a model comes from: a local folder, the Hugging Face cache, or the Hub.

:func:`model_source` runs before any ``from_pretrained``: a local folder is
checked first (a checkpoint or run folder stands for the model folder in it,
``_folders.py``; a folder without weights is one line); a name that is not one is asked of the Hub once, with the
Hub's own client (short timeout, no retries), so a misspelled, private or
offline model is one line within seconds instead of a minute of retries and
a traceback. With ``HF_HUB_OFFLINE=1`` no request is made at all: a hub id
must be in the local cache. When the Hub cannot be reached, a cached copy is
used. A hub id the Hub knows is returned unchanged, for the ordinary
``from_pretrained`` path.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from tether.models._errors import ModelNotFound
from tether.models._folders import check_weights, model_folder

__all__ = ["cached_snapshot", "model_source"]

log = logging.getLogger(__name__)


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def cached_snapshot(repo_id: str) -> str | None:
    """The cached snapshot folder of hub id ``repo_id`` (with a config.json), or None;
    never a download."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return folder if (Path(folder) / "config.json").is_file() else None


MARKERS = {
    "model": ("config.json",),
    "tokenizer": ("tokenizer_config.json", "tokenizer.json", "config.json"),
}


@functools.lru_cache(maxsize=16)
def model_source(name: str, kind: str = "model") -> str:
    """The folder or hub id to pass to ``from_pretrained`` for ``name`` (a ``kind``
    "model" or "tokenizer" folder); raises :class:`ModelNotFound` (one line that
    names the fix) when there is none."""
    path = Path(name).expanduser()
    if path.is_dir():
        path = model_folder(path)  # a checkpoint or run folder: the model folder in it
        if not any((path / f).is_file() for f in MARKERS[kind]):
            raise ModelNotFound(
                f"model folder {path} has no {MARKERS[kind][0]}: pass a Hugging Face model "
                "folder, a checkpoint folder (runs/NAME/checkpoints/step-N) or a run folder"
            )
        if kind == "model":
            check_weights(path)
        return str(path)
    if path.exists():
        raise ModelNotFound(
            f"model {name} is a file: pass its folder (with config.json) or a hub id"
        )
    if _looks_like_path(name):
        where = "" if path.is_absolute() else f" (that is {path.resolve()})"
        raise ModelNotFound(
            f"no model folder at {name}{where}: check the path, or pass a hub id such as "
            "Qwen/Qwen2.5-0.5B-Instruct"
        )
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(name)
    except HFValidationError:
        raise ModelNotFound(
            f"model {name!r} is neither a local folder nor a valid hub id (owner/name)"
        ) from None
    if constants.is_offline_mode():
        cached = cached_snapshot(name)
        if cached is None:
            raise ModelNotFound(
                f"model {name!r} is neither a local folder nor in the Hugging Face cache "
                "(HF_HUB_OFFLINE is set): download it once online, or pass a folder"
            )
        return cached
    try:
        HfApi().model_info(name, timeout=min(constants.HF_HUB_ETAG_TIMEOUT, 10))
    except GatedRepoError:
        raise ModelNotFound(
            f"model {name!r} is gated on the Hugging Face Hub: accept its terms on its page, "
            "then log in (hf auth login) or set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"model {name!r} is neither a local folder nor a model on the Hugging Face Hub "
            "(misspelled? a private model needs hf auth login or HF_TOKEN)"
        ) from None
    except Exception as exc:  # the network or the Hub itself: use a cached copy if there is one
        cached = cached_snapshot(name)
        if cached is None:
            raise ModelNotFound(
                f"model {name!r} is neither a local folder nor reachable on the Hugging Face Hub "
                "(offline? set HF_HUB_OFFLINE=1 to skip the Hub, or pass a folder)"
            ) from exc
        log.warning(
            "the Hugging Face Hub is unreachable (%s); using the cached %s",
            type(exc).__name__,
            cached,
        )
        return cached
    return name
